"""Output-length estimates from the warm-up sample, per prefix subtree, with their spread.

Every unsampled request takes the sampled lengths of the nearest subtree
that holds enough of them: the internal node right above its leaf, else that
node's best-sampled sibling, else the same rule one level up (the parent's
subtree, its siblings, ...), up to the root. Requests with the same prompt
prefix tend to ask for the same kind of answer, so the nearest well-sampled
subtree is the best guess; a sibling shares the parent's prefix too but is
not diluted by the rest of the parent. A prompt-side stratum (``strata``:
prompt length and cap buckets) with enough samples takes over where its
samples vary less, relative to their mean, than the subtree's: a rare family
of long answers hidden under a common prefix is told apart by its prompts.
Where a request's own stratum holds too few samples, its group's (all prompt
lengths of its source file and task tag, same cap bucket) may take over by
the same rule.
The mean feeds the planner's densities; a high quantile of the same samples
is there for KV budgeting. ``draw_outputs`` resamples each request's length
from the samples its estimate came from, so a choice made on estimates can
be tried under what they leave uncertain (a subtree whose samples were
12, 15 and 9,000 tokens is not three requests of 3,000); samples still
running are drawn short in one draw and long in another, all together.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from blendserve.batch import UNKNOWN, RequestBatch
from blendserve.planner.estimates import default_output_estimates
from blendserve.planner.prefix_tree import PrefixTree
from blendserve.sampling.strata import strata

# How each request's estimate was made (Estimates.kind).
SAMPLED, KNOWN, SUBTREE, SIBLING, ANCESTOR, NO_SAMPLE, STRATUM = 0, 1, 2, 3, 4, 5, 6
KIND_NAMES = ("sampled", "known", "subtree", "sibling", "ancestor", "no_sample", "stratum")


@dataclass
class Estimates:
    mean: np.ndarray  # (n,) int64 estimated output tokens: the planner's d (capped by max_tokens)
    high: np.ndarray  # (n,) int64 the ``quantile`` of the same samples, capped: a KV budget that rarely overruns
    std: np.ndarray  # (n,) float64 spread of those samples (0 for sampled and known lengths)
    source_node: np.ndarray  # (n,) int64 tree node whose samples made the estimate, -1 when none did
    kind: np.ndarray  # (n,) int8 SAMPLED, KNOWN, SUBTREE, SIBLING, ANCESTOR or NO_SAMPLE
    quantile: float  # the quantile ``high`` holds
    min_samples: int  # samples a subtree needed to be used
    # The samples behind the estimates, grouped by the subtree or stratum they estimate, each as the lengths
    # it may have: one value when it finished; from its progress to its cap when it still runs.
    pool_from: np.ndarray  # (m,) float64
    pool_to: np.ndarray  # (m,) float64
    pool_lo: np.ndarray  # (n,) int64 start in the pool of the samples behind each estimate
    pool_hi: np.ndarray  # (n,) int64 its end (== pool_lo: nothing to resample, a known length)
    cap: np.ndarray  # (n,) int64 each request's max_tokens: no draw goes past it

    def take(self, rows: np.ndarray) -> Estimates:
        """The estimates of ``rows``, in that order (the pool is shared)."""
        return replace(self, mean=self.mean[rows], high=self.high[rows], std=self.std[rows],
                       source_node=self.source_node[rows], kind=self.kind[rows], pool_lo=self.pool_lo[rows],
                       pool_hi=self.pool_hi[rows], cap=self.cap[rows])


def draw_outputs(estimates: Estimates, draws: int, seed: int = 0) -> list[np.ndarray]:
    """``draws`` (n,) vectors of output lengths, each request's drawn from the samples its estimate came from.

    A sample still running has one unknown length between its progress and
    its cap, and draw ``j`` puts every such length at the same point of that
    range: the ``(j + 1/2) / draws`` quantile of a log-uniform prior
    (``censored_length``'s). Drawn independently, request by request, the
    long answers of a family the warm-up saw only running averaged out to the
    prior's mean in every draw (about 6,700 tokens from 256 of a 32,768 cap,
    where the paper's videos run 16,000), and no draw held them longer.
    Known lengths stay as they are.
    """
    rng = np.random.default_rng(seed)
    span = estimates.pool_hi - estimates.pool_lo
    resampled = np.flatnonzero(span > 0)
    vectors = []
    for j in range(draws):
        pick = estimates.pool_lo[resampled] + np.floor(rng.random(len(resampled)) * span[resampled]).astype(np.int64)
        low = np.log(np.maximum(estimates.pool_from[pick], 1.0))
        high = np.log(np.maximum(estimates.pool_to[pick], 1.0))
        drawn = estimates.mean.astype(np.float64)
        drawn[resampled] = np.exp(low + (j + 0.5) / draws * (high - low))
        vectors.append(np.clip(np.rint(drawn).astype(np.int64), 1, estimates.cap))
    return vectors


def estimates_from(batch: RequestBatch, tree: PrefixTree, observed: dict[int, float],
                   running: dict[int, int] | None = None) -> Estimates:
    """``estimate_outputs`` from observation dicts as controllers keep them: request index -> output tokens
    (expected ones for samples still running), and the tokens so far of those still running."""
    index = np.fromiter(observed, np.int64, len(observed))
    lengths = np.fromiter(observed.values(), np.float64, len(observed))
    progress = np.array([(running or {}).get(int(i), 0) for i in index], dtype=np.float64)
    return estimate_outputs(batch, tree, index, lengths, running=progress)


def estimate_outputs(
    batch: RequestBatch,
    tree: PrefixTree,
    sampled_idx: np.ndarray,
    observed_lengths: np.ndarray,
    min_samples: int = 3,
    quantile: float = 0.9,
    running: np.ndarray | None = None,
) -> Estimates:
    """Estimates for every request of ``batch`` from the observed lengths of ``sampled_idx``.

    A sampled request (and its duplicates, answered by the same inference)
    gets its observed length; a known length in the data wins over
    everything; the rest get their nearest well-sampled subtree's mean, or
    ``max_tokens`` when nothing was sampled at all. ``running`` (aligned with
    ``sampled_idx``, 0 for finished ones) is the progress of samples still
    running, whose observed length is an expected one; it widens their draws.
    """
    sampled_idx = np.asarray(sampled_idx, dtype=np.int64)
    observed = np.asarray(observed_lengths, dtype=np.float64)
    if observed.shape != sampled_idx.shape:
        raise ValueError(f"{len(observed)} observed lengths for {len(sampled_idx)} sampled requests")
    enough = max(min_samples, 1)
    leaf_of_sample = tree.request_leaf[sampled_idx]
    order = np.argsort(leaf_of_sample, kind="stable")
    sample_leaf, sample_len = leaf_of_sample[order], observed[order]
    mean, high, std, kind, source = _subtree_level(batch, tree, sample_leaf, sample_len, enough, quantile)
    mixed = _mixed_sources(tree, sample_leaf, batch.group, sampled_idx[order], source)
    fine = strata(batch)
    grouped = strata(batch, prompt_buckets=False) + int(fine.max(initial=-1)) + 1  # one id space for both levels
    stratum = _overlay_levels(fine, grouped, sampled_idx, observed, enough, quantile,
                              mean, high, std, kind, source, mixed)
    _overlay_observed(tree, sample_leaf, sample_len, mean, high, std, kind, source)
    _overlay_known(batch, mean, high, std, kind, source)
    cap = np.maximum(batch.max_tokens.astype(np.int64), 1)
    low, top = _sample_bounds(observed, running, cap[sampled_idx])
    # A sample stands in both levels: its own stratum's pool and its group's.
    pool_from, pool_to, pool_lo, pool_hi = _draw_ranges(
        tree, sample_leaf, (low[order], top[order]), np.r_[fine[sampled_idx], grouped[sampled_idx]],
        (np.r_[low, low], np.r_[top, top]), stratum, kind, source)
    return Estimates(
        mean=np.clip(np.rint(mean).astype(np.int64), 1, cap),
        high=np.clip(np.ceil(high).astype(np.int64), 1, cap),
        std=std,
        source_node=source,
        kind=kind.astype(np.int8),
        quantile=float(quantile),
        min_samples=int(min_samples),
        pool_from=pool_from,
        pool_to=pool_to,
        pool_lo=pool_lo,
        pool_hi=pool_hi,
        cap=cap,
    )


def _subtree_level(batch: RequestBatch, tree: PrefixTree, sample_leaf: np.ndarray, sample_len: np.ndarray,
                   min_samples: int, quantile: float) -> tuple[np.ndarray, ...]:
    """Mean, quantile, std, kind and source node of every request from its nearest well-sampled subtree (the
    samples sorted by leaf); ``NO_SAMPLE`` and the default estimate where no subtree holds any sample."""
    count = np.searchsorted(sample_leaf, tree.hi) - np.searchsorted(sample_leaf, tree.lo)
    node_source, node_kind = _resolve_sources(tree, count, min_samples)
    request_node = tree.parent[tree.n_internal + tree.request_leaf]  # nearest internal subtree of each request
    source, kind = node_source[request_node], node_kind[request_node]
    mean, high, std = _source_stats(tree, sample_leaf, sample_len, source, quantile)
    fallback = default_output_estimates(batch).astype(np.float64)
    none = source < 0
    mean[none], high[none], std[none], kind[none] = fallback[none], fallback[none], 0.0, NO_SAMPLE
    return mean, high, std, kind, source


def _overlay_known(batch: RequestBatch, mean: np.ndarray, high: np.ndarray, std: np.ndarray, kind: np.ndarray,
                   source: np.ndarray) -> None:
    """A length the data states wins over every estimate."""
    known = batch.expected_output_tokens != UNKNOWN
    mean[known] = high[known] = batch.expected_output_tokens[known]
    std[known], kind[known], source[known] = 0.0, KNOWN, -1


def _sample_bounds(observed: np.ndarray, running: np.ndarray | None,
                   cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's lengths to draw between: its observed one when it finished; from its progress to its cap
    (``cap``, aligned with the samples) while it still runs."""
    progress = np.zeros(len(observed)) if running is None else np.asarray(running, dtype=np.float64)
    low = np.where(progress > 0, progress, observed)
    top = np.where(progress > 0, np.maximum(cap, progress), observed)
    return low, top


def _draw_ranges(tree: PrefixTree, sample_leaf: np.ndarray, by_leaf: tuple[np.ndarray, np.ndarray],
                 sample_stratum: np.ndarray, unsorted: tuple[np.ndarray, np.ndarray], stratum: np.ndarray,
                 kind: np.ndarray, source: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The pool of samples (each as its from and to lengths) and each request's range in it: its own sample,
    its source subtree's samples (contiguous, since they are sorted by leaf), or its stratum's (appended,
    sorted by stratum); empty for known lengths and requests nothing was sampled for."""
    by_stratum = np.argsort(sample_stratum, kind="stable")
    pool_from = np.concatenate([by_leaf[0], unsorted[0][by_stratum]])
    pool_to = np.concatenate([by_leaf[1], unsorted[1][by_stratum]])
    lo, hi = np.zeros(len(kind), dtype=np.int64), np.zeros(len(kind), dtype=np.int64)
    subtree = np.isin(kind, (SUBTREE, SIBLING, ANCESTOR)) & (source >= 0)
    node = source[subtree]
    lo[subtree] = np.searchsorted(sample_leaf, tree.lo[node])
    hi[subtree] = np.searchsorted(sample_leaf, tree.hi[node])
    at = kind == STRATUM
    ordered = sample_stratum[by_stratum]
    lo[at] = len(sample_leaf) + np.searchsorted(ordered, stratum[at], side="left")
    hi[at] = len(sample_leaf) + np.searchsorted(ordered, stratum[at], side="right")
    own = kind == SAMPLED
    lo[own] = np.searchsorted(sample_leaf, tree.request_leaf[own])
    hi[own] = lo[own] + 1
    return pool_from, pool_to, lo, hi


def _resolve_sources(tree: PrefixTree, count: np.ndarray, min_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Per node: the node whose samples estimate it (-1: none anywhere) and how it was found."""
    nodes = np.arange(tree.n_nodes)
    own = count >= min_samples
    sibling = _best_siblings(tree, count, min_samples)
    own_rule = np.where(own, nodes, np.where(sibling >= 0, sibling, -1))
    # Nodes with neither defer to their parent's answer; pointer doubling resolves every chain at once.
    root_ok = count[0] > 0  # the root takes whatever samples exist rather than none
    if own_rule[0] < 0 and root_ok:
        own_rule[0] = 0
    step = np.where(own_rule >= 0, nodes, np.maximum(tree.parent, 0))
    while True:
        nxt = step[step]
        if np.array_equal(nxt, step):
            break
        step = nxt
    source = own_rule[step]
    kind = np.where(own, SUBTREE, np.where(sibling >= 0, SIBLING, ANCESTOR))
    return source, kind


def _best_siblings(tree: PrefixTree, count: np.ndarray, min_samples: int) -> np.ndarray:
    """Per node: its sibling with the most samples among those with enough (-1 if none)."""
    best = np.full(tree.n_nodes, -1, dtype=np.int64)
    kids = np.flatnonzero((tree.parent >= 0) & (count >= min_samples))
    if not len(kids):
        return best
    # Top two candidates per parent: a node's best sibling is the top one unless that is itself.
    kids = kids[np.lexsort((-count[kids], tree.parent[kids]))]
    parents = tree.parent[kids]
    starts = np.flatnonzero(np.concatenate([[True], parents[1:] != parents[:-1]]))
    top1 = np.full(tree.n_nodes, -1, dtype=np.int64)
    top2 = np.full(tree.n_nodes, -1, dtype=np.int64)
    top1[parents[starts]] = kids[starts]
    has_second = np.concatenate([starts[1:], [len(kids)]]) - starts > 1
    top2[parents[starts[has_second]]] = kids[starts[has_second] + 1]
    children = np.flatnonzero(tree.parent >= 0)
    first = top1[tree.parent[children]]
    best[children] = np.where(first == children, top2[tree.parent[children]], first)
    return best


def _source_stats(
    tree: PrefixTree, sample_leaf: np.ndarray, sample_len: np.ndarray, req_source: np.ndarray, quantile: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, quantile and standard deviation of each request's source subtree (NaN where there is none)."""
    used, inverse = np.unique(req_source, return_inverse=True)
    stats = np.full((len(used), 3), np.nan)  # per source node: mean, quantile, std (indexed back per request)
    for j, node in enumerate(used):
        if node < 0:
            continue
        a, b = np.searchsorted(sample_leaf, [tree.lo[node], tree.hi[node]])
        values = sample_len[a:b]
        stats[j] = values.mean(), np.quantile(values, quantile), values.std()
    mean, high, std = (stats[inverse, k].copy() for k in range(3))
    return mean, high, std


def _mixed_sources(tree: PrefixTree, sample_leaf: np.ndarray, group: np.ndarray | None, sample_rows: np.ndarray,
                   req_source: np.ndarray) -> np.ndarray:
    """(n,) bool: the samples of the subtree that estimated a request include some of another group than its
    own (``RequestBatch.group``), so the prefix the two share says less than the group they do not."""
    if group is None or not len(sample_rows):
        return np.zeros(len(req_source), dtype=bool)
    sample_group = group[sample_rows]  # sorted by leaf, like sample_leaf
    used, inverse = np.unique(req_source, return_inverse=True)
    single = np.full(len(used), -1, dtype=np.int64)  # per source node: its samples' one group (-1: several)
    for j, node in enumerate(used):
        if node < 0:
            continue
        a, b = np.searchsorted(sample_leaf, [tree.lo[node], tree.hi[node]])
        values = np.unique(sample_group[a:b])
        single[j] = values[0] if len(values) == 1 else -1
    return (req_source >= 0) & (group != single[inverse])


def _overlay_levels(fine: np.ndarray, grouped: np.ndarray, sampled_idx: np.ndarray, observed: np.ndarray,
                    min_samples: int, quantile: float, mean: np.ndarray, high: np.ndarray, std: np.ndarray,
                    kind: np.ndarray, source: np.ndarray, mixed: np.ndarray) -> np.ndarray:
    """``_overlay_strata`` on the ``fine`` strata, then on the group-and-cap ones (``grouped``, numbered after the
    fine ones) for the requests the first left to their subtree; returns (n,) the stratum each request's
    estimate came from (either level's id).

    A family of long answers spreads over several prompt-length buckets. On the 40k d1.4-s35 mix (8B,
    lengths hidden) its 155 videos sat in 14 fine strata of 1-14 requests in three groups; the warm-up drew
    13 of them, every one long, but most fine strata held fewer than three, and 40 of the 134 long answers
    left to plan took a 2-token estimate from multiple-choice questions under the same system prompt.
    """
    _overlay_strata(fine, sampled_idx, observed, min_samples, quantile, mean, high, std, kind, source, mixed)
    by_tree = kind != STRATUM
    _overlay_strata(grouped, sampled_idx, observed, min_samples, quantile, mean, high, std, kind, source,
                    mixed, among=by_tree)
    return np.where(by_tree & (kind == STRATUM), grouped, fine)


def _overlay_strata(stratum: np.ndarray, sampled_idx: np.ndarray, observed: np.ndarray, min_samples: int,
                    quantile: float, mean: np.ndarray, high: np.ndarray, std: np.ndarray, kind: np.ndarray,
                    source: np.ndarray, mixed: np.ndarray, among: np.ndarray | None = None) -> None:
    """A request (of ``among``, default all) takes its stratum's samples where the stratum has ``min_samples``
    and they vary less (standard deviation over mean) than those of the subtree that estimated it, or no
    subtree did, or that subtree's samples came from other groups too (``mixed``)."""
    if not len(sampled_idx):
        return
    of_sample = stratum[sampled_idx]
    count = np.bincount(of_sample, minlength=int(stratum.max()) + 1)
    total = np.bincount(of_sample, weights=observed, minlength=len(count))
    squares = np.bincount(of_sample, weights=observed**2, minlength=len(count))
    with np.errstate(divide="ignore", invalid="ignore"):
        s_mean = total / count
        s_std = np.sqrt(np.maximum(squares / count - s_mean**2, 0.0))
        better = (count[stratum] >= min_samples) & (
            (kind == NO_SAMPLE) | mixed | (s_std[stratum] / s_mean[stratum] < std / np.maximum(mean, 1e-9)))
    if among is not None:
        better &= among
    for s in np.unique(stratum[better]).tolist():
        at = better & (stratum == s)
        values = observed[of_sample == s]
        mean[at], high[at], std[at] = s_mean[s], np.quantile(values, quantile), s_std[s]
    kind[better], source[better] = STRATUM, -1


def _overlay_observed(
    tree: PrefixTree,
    sample_leaf: np.ndarray,
    sample_len: np.ndarray,
    mean: np.ndarray,
    high: np.ndarray,
    std: np.ndarray,
    kind: np.ndarray,
    source: np.ndarray,
) -> None:
    """Sampled inferences (and their duplicates) take their observed length: it is the answer, not a guess."""
    per_leaf = np.full(tree.n_leaves, np.nan)
    per_leaf[sample_leaf] = sample_len
    got = per_leaf[tree.request_leaf]
    seen = ~np.isnan(got)
    mean[seen] = high[seen] = got[seen]
    std[seen], kind[seen], source[seen] = 0.0, SAMPLED, tree.n_internal + tree.request_leaf[seen]
