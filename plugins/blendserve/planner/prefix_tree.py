"""BlendServe's resource-aware prefix tree: a compressed radix tree over token ids.

Built from the LCP-sorted prompts (``lcp.sort_prompts``), the way a suffix
tree follows from a suffix array: an internal node is a maximal run of
neighbours whose LCP is at least its depth, so every node covers a
contiguous range of leaves and every subtree statistic is a difference of
prefix sums. Nodes ``0 .. n_internal - 1`` are internal (0 is the root, depth
0); nodes ``n_internal + i`` are the leaves, one per distinct inference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel
from blendserve.planner.estimates import checked_estimates
from blendserve.planner.lcp import RangeMin, sort_prompts


@dataclass
class NodeStats:
    n_requests: np.ndarray  # (N,) requests answered in the subtree, duplicates included
    n_inferences: np.ndarray  # (N,) distinct inferences (leaves) in the subtree
    sum_prompt: np.ndarray  # (N,) sum of p over the subtree's inferences
    sum_output: np.ndarray  # (N,) sum of estimated d over the subtree's inferences
    unique_prompt_tokens: np.ndarray  # (N,) distinct prompt tokens: shared prefixes counted once
    comp: np.ndarray  # (N,) Comp_eff seconds: 2 P (unique prompt + sum d) / F
    mem: np.ndarray  # (N,) sum of Mem seconds (decode KV reads)
    density: np.ndarray  # (N,) rho = comp / mem
    kv_tokens: np.ndarray  # (N,) KV footprint if the subtree ran at once: unique prompt + sum d

    @property
    def time(self) -> np.ndarray:
        """Estimated seconds of the subtree with compute and memory overlapped: max(Comp_eff, Mem)."""
        return np.maximum(self.comp, self.mem)


@dataclass
class PrefixTree:
    leaf_request: np.ndarray  # (m,) representative request index of each leaf, leaves in LCP order
    request_leaf: np.ndarray  # (n,) leaf answering each request: duplicates share one (fan-out map)
    leaf_weight: np.ndarray  # (m,) requests answered by each leaf (1 + duplicates)
    leaf_lcp: np.ndarray  # (m,) LCP of each leaf's prompt with the previous leaf's (0 for the first)
    prompt_len: np.ndarray  # (m,) p of each leaf
    output_est: np.ndarray  # (m,) estimated d of each leaf
    parent: np.ndarray  # (N,) parent node, -1 for the root
    depth: np.ndarray  # (N,) prompt tokens on the path from the root to the node's end
    lo: np.ndarray  # (N,) first leaf of the node's subtree
    hi: np.ndarray  # (N,) one past the last leaf of the node's subtree
    n_internal: int  # internal nodes come first; leaf i is node n_internal + i
    lcp_min: RangeMin  # over leaf_lcp: LCP(leaf i, leaf j) = min(leaf_lcp[i + 1 : j + 1])
    stats: NodeStats  # statistics of every node over all leaves

    @property
    def n_leaves(self) -> int:
        return len(self.leaf_request)

    @property
    def n_nodes(self) -> int:
        return len(self.parent)

    def leaf_nodes(self) -> np.ndarray:
        return np.arange(self.n_internal, self.n_nodes, dtype=np.int64)

    def leaf_pair_lcp(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """LCP of the prompts of leaves a and b (any order), vectorized."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        out = self.prompt_len[lo].copy()
        diff = lo != hi
        if diff.any():
            out[diff] = self.lcp_min.query(lo[diff] + 1, hi[diff] + 1)
        return out


def build_prefix_tree(
    batch: RequestBatch,
    cost_model: CostModel,
    output_estimates: np.ndarray | None = None,
    sampling_keys: np.ndarray | None = None,
    chunk: int = 16,
) -> PrefixTree:
    """The prefix tree of ``batch``; requests with equal tokens and equal sampling key share one leaf."""
    estimates = checked_estimates(batch, output_estimates)
    keys = np.zeros(len(batch), dtype=np.int64) if sampling_keys is None else np.asarray(sampling_keys)
    order, lcp = sort_prompts(batch.tokens, batch.token_offsets, tiebreak=keys, chunk=chunk,
                              starts=batch.token_starts)
    lens = batch.prompt_lens
    first, request_leaf = _dedupe(order, lcp, lens, keys)
    leaf_request = order[first]
    parent, depth, lo, hi, n_internal = _radix_nodes(lcp[first], lens[leaf_request])
    tree = PrefixTree(
        leaf_request=leaf_request,
        request_leaf=request_leaf,
        leaf_weight=np.bincount(request_leaf, minlength=len(first)).astype(np.int64),
        leaf_lcp=lcp[first],
        prompt_len=lens[leaf_request],
        output_est=estimates[leaf_request],
        parent=parent,
        depth=depth,
        lo=lo,
        hi=hi,
        n_internal=n_internal,
        lcp_min=RangeMin(lcp[first]),
        stats=None,  # type: ignore[arg-type]  # filled just below: stats need the tree
    )
    tree.stats = node_stats(tree, cost_model)
    return tree


def _dedupe(order: np.ndarray, lcp: np.ndarray, lens: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions (in ``order``) of the first of each run of identical requests, and each request's run."""
    n = len(order)
    duplicate = np.zeros(n, dtype=bool)
    if n > 1:
        a, b = order[:-1], order[1:]
        duplicate[1:] = (lens[a] == lens[b]) & (lcp[1:] == lens[b]) & (keys[a] == keys[b])
    first = np.flatnonzero(~duplicate)
    run_of_position = np.cumsum(~duplicate) - 1
    request_leaf = np.empty(n, dtype=np.int64)
    request_leaf[order] = run_of_position
    return first, request_leaf


def _radix_nodes(leaf_lcp: np.ndarray, prompt_len: np.ndarray) -> tuple[np.ndarray, ...]:
    """parent, depth, lo, hi of internal nodes then leaves, and the internal count."""
    m = len(prompt_len)
    pairs = leaf_lcp[1:]  # pair i joins leaf i and leaf i + 1
    if len(pairs):
        lo_pair, hi_pair = RangeMin(pairs).extent_at_least(np.arange(len(pairs)), pairs)
    else:
        lo_pair = hi_pair = np.zeros(0, dtype=np.int64)
    # A node is identified by (first leaf, depth); the root (0, 0) is always present.
    node_lo = np.concatenate([[0], lo_pair])
    node_depth = np.concatenate([[0], pairs])
    node_hi = np.concatenate([[m], hi_pair + 1])
    key = node_lo * (int(node_depth.max(initial=0)) + 1) + node_depth
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    n_internal = len(first)
    pair_node = inverse[1:]
    internal_parent = _parent_of_ranges(node_lo[first], node_hi[first], node_depth[first], pairs, pair_node)
    leaf_parent = _parent_of_leaves(m, pairs, pair_node)
    parent = np.concatenate([internal_parent, leaf_parent])
    depth = np.concatenate([node_depth[first], prompt_len]).astype(np.int64)
    lo = np.concatenate([node_lo[first], np.arange(m)]).astype(np.int64)
    hi = np.concatenate([node_hi[first], np.arange(1, m + 1)]).astype(np.int64)
    return parent, depth, lo, hi, n_internal


def _parent_of_ranges(
    lo: np.ndarray, hi: np.ndarray, depth: np.ndarray, pairs: np.ndarray, pair_node: np.ndarray
) -> np.ndarray:
    """An internal node's parent is the node of the deeper of its two boundary pairs (root if none)."""
    if not len(pairs):  # at most one leaf: the root is the only internal node
        return np.full(len(lo), -1, dtype=np.int64)
    m = len(pairs) + 1
    left_ok, right_ok = lo > 0, hi < m
    left_val = np.where(left_ok, pairs[np.clip(lo - 1, 0, max(m - 2, 0))] if len(pairs) else 0, -1)
    right_val = np.where(right_ok, pairs[np.clip(hi - 1, 0, max(m - 2, 0))] if len(pairs) else 0, -1)
    use_left = left_val >= right_val
    boundary = np.where(use_left, lo - 1, hi - 1)
    parent = np.zeros(len(lo), dtype=np.int64)
    has = left_ok | right_ok
    parent[has] = pair_node[boundary[has]]
    parent[0] = -1  # node 0 is the root: key (0, 0) sorts first
    return parent


def _parent_of_leaves(m: int, pairs: np.ndarray, pair_node: np.ndarray) -> np.ndarray:
    """A leaf hangs under the node of the deeper of the pairs on its two sides."""
    if m <= 1:  # no leaf, or one under the root
        return np.zeros(m, dtype=np.int64)
    left = np.concatenate([[-1], pairs])  # pair i - 1
    right = np.concatenate([pairs, [-1]])  # pair i
    leaf = np.arange(m)
    boundary = np.where(left >= right, leaf - 1, leaf)
    return pair_node[boundary]


def node_stats(tree: PrefixTree, cost_model: CostModel, leaf_mask: np.ndarray | None = None) -> NodeStats:
    """Statistics of every node over the leaves in ``leaf_mask`` (all leaves when None).

    Distinct prompt tokens of a set of LCP-sorted prompts are their total
    length minus the LCPs of consecutive members, so with the kept leaves
    listed in order every subtree sum is a difference of prefix sums.
    """
    kept = np.arange(tree.n_leaves) if leaf_mask is None else np.flatnonzero(leaf_mask)
    p = tree.prompt_len[kept].astype(np.float64)
    d = tree.output_est[kept].astype(np.float64)
    shared = np.zeros(len(kept), dtype=np.float64)
    if len(kept) > 1:
        shared[1:] = tree.leaf_pair_lcp(kept[:-1], kept[1:])
    a = np.searchsorted(kept, tree.lo)
    b = np.searchsorted(kept, tree.hi)

    def subtree_sum(values: np.ndarray) -> np.ndarray:
        csum = np.concatenate([[0.0], np.cumsum(values)])
        return csum[b] - csum[a]

    shared_csum = np.concatenate([[0.0], np.cumsum(shared)])
    inner_shared = shared_csum[b] - shared_csum[np.minimum(a + 1, b)]  # LCPs between kept members only
    sum_prompt = subtree_sum(p)
    sum_output = subtree_sum(d)
    unique = sum_prompt - inner_shared
    mem = subtree_sum(cost_model.mem_time(p, d))
    comp = cost_model.comp_time(unique + sum_output)
    return NodeStats(
        n_requests=subtree_sum(tree.leaf_weight[kept].astype(np.float64)).astype(np.int64),
        n_inferences=(b - a).astype(np.int64),
        sum_prompt=sum_prompt,
        sum_output=sum_output,
        unique_prompt_tokens=unique,
        comp=comp,
        mem=mem,
        density=cost_model.density(comp, mem),
        kv_tokens=unique + sum_output,
    )
