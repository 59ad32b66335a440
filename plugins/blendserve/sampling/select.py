"""Which requests the warm-up phase runs: a seeded, subtree-covering sample of the prefix tree.

Sampling works on leaves (distinct inferences), not requests: duplicates are
answered by one inference, so sampling two of them would learn nothing new.
Requests whose output length is known in advance are never sampled; there is
nothing to learn from them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blendserve.batch import UNKNOWN, RequestBatch
from blendserve.planner.prefix_tree import PrefixTree
from blendserve.sampling.strata import GROUP_SHARE, PER_STRATUM, covered_strata, potential_shares, strata

DEFAULT_RATE = 0.01  # the paper's 1%: it reports this works as well as 100%
DEFAULT_MIN_SUBTREE = 100  # a subtree this large (in eligible inferences) always gets a sample
# A request capped at this many output tokens is not sampled: it ends before its first progress report
# (at 16 tokens) could tell anything, its estimate is clipped to the cap anyway, and its output can move its
# cost by at most that many decode steps. A sample of it would only run out of the plan's order: a job of
# one-token answers under many few-shot prefixes lost 10 points of prefix hits to its warm-up that way.
SHORT_CAP = 16
DEFAULT_CAP = 5_000  # upper bound on sampled inferences, so a huge job's warm-up stays short


def eligible_leaves(batch: RequestBatch, tree: PrefixTree) -> np.ndarray:
    """(m,) bool: leaves worth sampling: their representative's output length is not known, and its cap
    leaves room for it to matter (``SHORT_CAP``)."""
    request = tree.leaf_request
    return (batch.expected_output_tokens[request] == UNKNOWN) & (batch.max_tokens[request] > SHORT_CAP)


def select_samples(
    batch: RequestBatch,
    tree: PrefixTree,
    rate: float = DEFAULT_RATE,
    min_subtree: int = DEFAULT_MIN_SUBTREE,
    cap: int = DEFAULT_CAP,
    seed: int = 0,
) -> np.ndarray:
    """Batch indices (sorted) of the requests to run first.

    ``rate`` of the eligible inferences are drawn uniformly at random, plus
    one from every internal subtree with at least ``min_subtree`` eligible
    inferences, plus ``PER_STRATUM`` from every prompt-side stratum that could
    hold a material share of the job's work (``strata.covered_strata``,
    the user's groups among their features), plus ``PER_STRATUM`` from
    every group that could hold ``GROUP_SHARE`` (``_group_picks``: a
    family spread thin over prompt lengths, read as a group by the
    estimator too); ``cap`` bounds the
    total, keeping the coverage picks of the largest subtrees first, then the
    strata's and the groups', because an unsampled large subtree or family is
    where an estimate goes most wrong.
    """
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be within [0, 1], got {rate}")
    eligible = eligible_leaves(batch, tree)
    n_eligible = int(eligible.sum())
    if n_eligible == 0 or cap <= 0:
        return np.zeros(0, dtype=np.int64)
    priority = np.random.default_rng(seed).random(tree.n_leaves)
    priority[~eligible] = np.inf  # never picked
    coverage, coverage_size = _coverage_picks(tree, eligible, priority, min_subtree)
    fine = strata(batch)
    by_stratum = _stratum_picks(fine[tree.leaf_request], covered_strata(batch, fine), priority)
    uniform = np.argsort(priority, kind="stable")[: int(np.ceil(rate * n_eligible))]
    by_group = _group_picks(batch, tree, priority, budget=len(uniform))
    # Coverage picks first (largest subtree first), then the strata's and groups', then the uniform draw.
    ranked = np.concatenate([coverage[np.argsort(-coverage_size, kind="stable")], by_stratum, by_group, uniform])
    _, first = np.unique(ranked, return_index=True)
    leaves = ranked[np.sort(first)][:cap]
    return np.sort(tree.leaf_request[leaves]).astype(np.int64)


def shard_sample(batch: RequestBatch, tree: PrefixTree, rate: float = DEFAULT_RATE, seed: int = 0) -> np.ndarray:
    """The sample a pipeline shard draws: ``select_samples`` where every subtree holding 1/16 of the shard
    (up to ``DEFAULT_MIN_SUBTREE``) gets a sample: in a small job a ``rate`` draw alone can miss a whole kind
    of request and leave it with another kind's lengths."""
    min_subtree = max(2, min(DEFAULT_MIN_SUBTREE, len(batch) // 16))
    return select_samples(batch, tree, rate=rate, min_subtree=min_subtree, seed=seed)


def _coverage_picks(
    tree: PrefixTree, eligible: np.ndarray, priority: np.ndarray, min_subtree: int
) -> tuple[np.ndarray, np.ndarray]:
    """The lowest-priority eligible leaf of every internal node with >= min_subtree eligible leaves, and that size.

    Every node covers the contiguous leaf range [lo, hi), so both the eligible
    count and the lowest priority in it come from whole-array scans.
    """
    internal = np.arange(tree.n_internal)
    csum = np.concatenate([[0], np.cumsum(eligible)])
    size = csum[tree.hi[internal]] - csum[tree.lo[internal]]
    big = internal[size >= max(min_subtree, 1)]
    if not len(big):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    picks = np.array([tree.lo[v] + int(np.argmin(priority[tree.lo[v] : tree.hi[v]])) for v in big], dtype=np.int64)
    return picks, size[size >= max(min_subtree, 1)]


def _group_picks(batch: RequestBatch, tree: PrefixTree, priority: np.ndarray, budget: int) -> np.ndarray:
    """``_stratum_picks`` of the groups (all prompt lengths, one cap bucket) that could hold ``GROUP_SHARE`` of
    the job's work, the largest potential first, at most ``budget`` of them: a job that tags every few rows
    apart would otherwise be sampled whole."""
    level = strata(batch, prompt_buckets=False)
    leaf_group = level[tree.leaf_request]
    picks = _stratum_picks(leaf_group, covered_strata(batch, level, GROUP_SHARE), priority)
    share = potential_shares(batch, level)[leaf_group[picks]]
    return picks[np.argsort(-share, kind="stable")][:budget]


def _stratum_picks(leaf_stratum: np.ndarray, covered: np.ndarray, priority: np.ndarray) -> np.ndarray:
    """The ``PER_STRATUM`` lowest-priority eligible leaves of every covered stratum."""
    candidates = np.flatnonzero(np.isfinite(priority) & covered[leaf_stratum])
    candidates = candidates[np.lexsort((priority[candidates], leaf_stratum[candidates]))]
    group = leaf_stratum[candidates]
    start = np.searchsorted(group, group, side="left")
    return candidates[np.arange(len(candidates)) - start < PER_STRATUM]


@dataclass
class WarmupSplit:
    run: np.ndarray  # batch indices the warm-up phase runs (the sampled inferences)
    fanned: np.ndarray  # duplicates of sampled inferences: answered by the warm-up result, never run
    rest: np.ndarray  # everything else: planned and run after the warm-up


def split_warmup(tree: PrefixTree, sampled_idx: np.ndarray) -> WarmupSplit:
    """Each request lands in exactly one of the three parts, so none is ever run twice."""
    sampled_idx = np.unique(np.asarray(sampled_idx, dtype=np.int64))
    leaf_sampled = np.zeros(tree.n_leaves, dtype=bool)
    leaf_sampled[tree.request_leaf[sampled_idx]] = True
    covered = leaf_sampled[tree.request_leaf]
    is_run = np.zeros(len(covered), dtype=bool)
    is_run[sampled_idx] = True
    return WarmupSplit(run=sampled_idx, fanned=np.flatnonzero(covered & ~is_run), rest=np.flatnonzero(~covered))
