"""Stratified blend: every density stratum of the leaf list spread evenly over the run, prefixes kept together.

The dual scan blends two groups at a time (one under each cursor), so the
work in flight changes kind as the cursors move: long decodes beside
prefill-heavy prompts early, shorter ones later. A random order (fcfs on a
shuffled file) blends every kind at once, keeps the engine's KV fuller under
blind admission, and beats the dual scan where sharing is small, but loses a
third of the sharing. This list keeps both: the leaf order is cut into
*units* that never split a prefix worth keeping, units are binned by density
(strata ``width`` decades wide), and each stratum's units are spaced evenly
over the run by their share of the stratum's work. Locally the stream then
has the job's composition, as a random order has, while every unit stays
contiguous, as in the leaf order.

A cut between two neighbours loses the prefix they share, except the part
held by a *hot* prefix (one that ``hot_fraction`` of the leaves share, say a
chat template), which the prefix cache keeps under a spread order because
it is reused every few requests. A hot prefix that is not *always hot* (a
few-shot prefix on 1-20% of the leaves) is reused only every 5-100
requests, and while long decodes fill the KV the cache evicts it between
two uses; so its cuts are free only every ``HOT_PIECE`` requests, and it is
computed at most once a piece. Cuts are made cheapest first while the
prefix tokens they lose stay within ``1 - keep_sharing`` of the leaf order's
sharing (the split's budget rule).
"""

from __future__ import annotations

import numpy as np

from blendserve.planner.items import ScanItems, item_work
from blendserve.planner.prefix_tree import PrefixTree


def hot_depth(tree: PrefixTree, hot_fraction: float) -> np.ndarray:
    """(m,) per leaf: depth of its deepest ancestor shared by at least ``hot_fraction`` of the leaves (0 if none)."""
    internal = np.arange(tree.n_internal)
    leaves = tree.hi[internal] - tree.lo[internal]
    hot = internal[leaves >= hot_fraction * tree.n_leaves]
    hot = hot[np.argsort(tree.depth[hot], kind="stable")]  # shallow first: a deeper hot node overwrites
    depth = np.zeros(tree.n_leaves, dtype=np.int64)
    for node in hot.tolist():  # few nodes: at most 1 / hot_fraction per depth level
        depth[tree.lo[node] : tree.hi[node]] = tree.depth[node]
    return depth


HOT_FRACTION = 0.01  # a prefix this share of the leaves hold is reused every 100 requests: cached while the KV has room
# A prefix this share of the leaves hold (reused every 5 requests) stays cached while long decodes fill the KV;
# a few-shot prefix on 5% of rare-1's leaves was evicted between two of its questions 71 times in 1,072
# (docs/PLANNER_NOTES.md, "hot prefixes in pieces").
ALWAYS_HOT_FRACTION = 0.2
HOT_PIECE = 32  # requests under a hot (not always hot) prefix kept together: computed at most once a piece


def cold_shared(shared: np.ndarray, hot: np.ndarray) -> np.ndarray:
    """Per neighbour pair (i - 1, i): the prefix tokens they share beyond the hot prefix both hold, which a cut
    between them loses (0 for the first)."""
    cost = np.maximum(np.asarray(shared, dtype=np.float64) - np.minimum(hot, np.roll(hot, 1)), 0.0)
    cost[:1] = 0.0
    return cost


def prefix_units(tree: PrefixTree, hot_fraction: float = HOT_FRACTION) -> np.ndarray:
    """(m,) per leaf: its prefix unit, a run of neighbouring leaves (LCP order) that share more than a hot prefix.

    A hot prefix (a chat template, a few-shot prefix that ``hot_fraction`` of the leaves share) stays cached
    while the KV has room; a cold one (a caption that four labelling questions share) only while its requests
    run close together. Each unit is under ``hot_fraction`` of the leaves. The warm-up's fillers
    (``filler_order``) keep every hot cut free; the plan's ``unit_cuts`` cuts a prefix that is not always
    hot in pieces.
    """
    starts = cold_shared(tree.leaf_lcp, hot_depth(tree, hot_fraction)) == 0.0
    return np.cumsum(starts) - 1


def unit_cuts(tree: PrefixTree, items: ScanItems, keep_sharing: float = 0.995, hot_fraction: float = HOT_FRACTION,
              max_unit_kv: float | None = None) -> np.ndarray:
    """(k,) True where a new unit starts: cuts that lose the fewest prefix tokens, within the sharing budget.

    A cut before item i loses the prefix it shares with item i - 1 beyond the
    hot prefix both hold (beyond the always-hot one, except every ``HOT_PIECE``
    requests: ``piece_cost``); zero-cost cuts are always made. ``max_unit_kv``
    (tokens) caps the memory-heavy units whatever the cuts cost (``cap_units``).
    """
    if items.shared_prompt is None or len(items.requests) == 0:
        return np.ones(len(items.requests), dtype=bool)
    leaf = tree.request_leaf[items.requests]
    shared = items.shared_prompt.astype(np.float64)
    cost = piece_cost(cold_shared(shared, hot_depth(tree, hot_fraction)[leaf]),
                      cold_shared(shared, hot_depth(tree, max(hot_fraction, ALWAYS_HOT_FRACTION))[leaf]))
    by_cost = np.argsort(cost, kind="stable")
    within = np.cumsum(cost[by_cost]) <= (1.0 - keep_sharing) * float(shared.sum())
    cuts = np.zeros(len(cost), dtype=bool)
    cuts[by_cost[within]] = True
    cuts[0] = True
    return cuts if max_unit_kv is None else cap_units(items, cuts, max_unit_kv)


def piece_cost(hot_kept: np.ndarray, always_kept: np.ndarray, piece: int = HOT_PIECE) -> np.ndarray:
    """Per neighbour pair: what a cut loses when only the always-hot prefix survives it (``always_kept``),
    except at every ``piece``-th pair of a run of pairs that share a hot prefix, where the hot prefix
    survives too (``hot_kept``): one load of the prefix a piece."""
    under_hot = always_kept > hot_kept
    index = np.arange(len(under_hot))
    run_start = np.maximum.accumulate(np.where(under_hot, 0, index))
    return np.where(under_hot & ((index - run_start) % piece != 0), always_kept, hot_kept)


def cap_units(items: ScanItems, cuts: np.ndarray, max_unit_kv: float) -> np.ndarray:
    """``cuts`` plus the cuts that keep each memory-heavy unit's estimated peak KV near ``max_unit_kv``.

    A unit is admitted as one burst. Long decodes that share a whole prompt
    (a job that repeats its video prompts) would otherwise stay one unit
    several times the KV, and no spread can blend them (docs/PLANNER_NOTES.md
    has the case). A unit may exceed the cap by its last item only.
    """
    heavy = items.group_density[items.group] < items.target_density
    unit = np.cumsum(cuts) - 1
    charge = np.where(heavy, items.kv_charge, 0.0).astype(np.float64)
    before = np.cumsum(charge) - charge  # KV of the items before i, whole list
    unit_start = np.flatnonzero(cuts)
    in_unit = before - before[unit_start][unit]  # KV of the unit's items before i
    bucket = np.floor(in_unit / max(max_unit_kv, 1.0))
    capped = cuts.copy()
    capped[1:] |= (bucket[1:] != bucket[:-1]) & (unit[1:] == unit[:-1])
    return capped


def spread_keys(items: ScanItems, cuts: np.ndarray, width: float = 0.1, lead: float = 0.05,
                run_steps: float | None = None, deadline: float = 0.8) -> np.ndarray:
    """(k,) sort key of each item: where in the run (0 to 1) its unit's stratum places it.

    A unit's key is the midpoint of its share of its stratum's work (compute
    and KV reads, each as a share of the job's), so every stratum is admitted
    at an even pace. Memory-heavy strata (below the job's density) are
    compressed into the first ``1 - lead`` of the run: a long decode
    admitted last runs alone after everything else. Given ``run_steps`` (the
    engine steps the run is predicted to take), a memory-heavy stratum leads
    by at least ``deadline`` x its longest estimated decode / ``run_steps``,
    so its last decodes end near the run's end whatever the job's size: the
    same 24k-token video is a third of a 40k-request run and 1-4% of a 400k one.
    """
    compute, reads = item_work(items)
    work = compute / max(float(compute.sum()), 1e-12) + reads / max(float(reads.sum()), 1e-12)
    unit = np.cumsum(cuts) - 1
    n_units = int(unit[-1]) + 1 if len(unit) else 0
    unit_work = np.bincount(unit, weights=work, minlength=n_units)
    first = np.flatnonzero(cuts)
    density = items.group_density[items.group[first]]
    longest = _unit_longest(items, first)
    stratum = np.floor(np.log10(np.maximum(density, 1e-12)) / width).astype(np.int64)
    key = np.empty(n_units, dtype=np.float64)
    for s in np.unique(stratum).tolist():
        members = np.flatnonzero(stratum == s)  # in leaf order
        w = unit_work[members]
        place = (np.cumsum(w) - w / 2.0) / max(float(w.sum()), 1e-12)
        if float(np.mean(density[members])) >= items.target_density:
            key[members] = place
            continue
        stratum_lead = lead
        if run_steps:
            stratum_lead = min(max(lead, deadline * float(longest[members].max()) / run_steps), 0.9)
        key[members] = place * (1.0 - stratum_lead)
    return key[unit]


def _unit_longest(items: ScanItems, first: np.ndarray) -> np.ndarray:
    """(units,) longest estimated output of each unit (0 without estimates)."""
    if items.output_est is None or len(first) == 0:
        return np.zeros(len(first))
    return np.maximum.reduceat(items.output_est.astype(np.float64), first)
