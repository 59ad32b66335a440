"""Layer-wise sort of the prefix tree by density, and conditional node splitting.

Sorting only reorders siblings, so every subtree stays contiguous and prefix
sharing is untouched. ``split`` then detaches outlier subtrees (a
memory-heavy subtree under a compute-heavy parent, say) and re-inserts each
as a block where its density belongs in the order, paying for it with the
prefix it no longer shares, within a budget of recomputed tokens.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from blendserve.costmodel import CostModel
from blendserve.planner.prefix_tree import NodeStats, PrefixTree, node_stats


def dfs_order(tree: PrefixTree, key: np.ndarray, leaf_mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Leaves in depth-first order with every node's children sorted by ``key``, largest first.

    Each node's start is its parent's start plus the sizes of the siblings
    sorted before it; the sum along each root path is taken by pointer
    jumping, so a million leaves cost O(n log height) numpy work, no loop
    per node. Returns the leaf order (leaves in ``leaf_mask`` only) and
    every node's start position in it.
    """
    mask = np.ones(tree.n_leaves, dtype=bool) if leaf_mask is None else leaf_mask
    csum = np.concatenate([[0], np.cumsum(mask)])
    size = csum[tree.hi] - csum[tree.lo]
    nodes = np.flatnonzero((tree.parent >= 0) & (size > 0))
    by_parent = nodes[np.lexsort((-key[nodes], tree.parent[nodes]))]
    sizes = size[by_parent]
    running = np.cumsum(sizes) - sizes
    parents = tree.parent[by_parent]
    first_of_parent = np.ones(len(by_parent), dtype=bool)
    first_of_parent[1:] = parents[1:] != parents[:-1]
    group_base = np.maximum.accumulate(np.where(first_of_parent, np.arange(len(by_parent)), 0))
    start = np.zeros(tree.n_nodes, dtype=np.int64)
    start[by_parent] = running - running[group_base]
    start = _sum_to_root(start, tree.parent)
    leaves = np.flatnonzero(mask)
    order = np.empty(len(leaves), dtype=np.int64)
    order[start[tree.n_internal + leaves]] = leaves
    return order, start


def _sum_to_root(values: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """For every node, the sum of ``values`` over it and all its ancestors (pointer jumping)."""
    acc = values.copy()
    anc = parent.copy()
    live = np.flatnonzero(anc >= 0)
    while len(live):
        up = anc[live]
        acc[live] = acc[live] + acc[up]
        anc[live] = anc[up]
        live = live[anc[live] >= 0]
    return acc


def order_sharing(tree: PrefixTree, leaf_order: np.ndarray) -> int:
    """Prompt tokens each leaf shares with the one run just before it, summed.

    Any order that keeps subtrees contiguous (DFS, the layer-wise sort)
    reaches the maximum, total prompt minus distinct prompt tokens; every
    token below that is recomputed.
    """
    if len(leaf_order) < 2:
        return 0
    return int(tree.leaf_pair_lcp(leaf_order[:-1], leaf_order[1:]).sum())


def leaf_time(tree: PrefixTree) -> np.ndarray:
    """Estimated seconds of each leaf alone: max(Comp, Mem)."""
    return tree.stats.time[tree.n_internal :]


def disorder(tree: PrefixTree, leaf_order: np.ndarray) -> float:
    """How far the order is from sorted by density: work-weighted mean distance to its sorted place, in [0, 1)."""
    w = leaf_time(tree)[leaf_order]
    total = w.sum()
    if total <= 0:
        return 0.0
    here = np.cumsum(w) - w
    rho = tree.stats.density[tree.n_internal + leaf_order]
    by_rho = np.argsort(-rho, kind="stable")
    ideal = np.empty_like(here)
    ideal[by_rho] = np.cumsum(w[by_rho]) - w[by_rho]
    return float((w * np.abs(here - ideal)).sum() / total**2)


@dataclass
class SplitResult:
    leaf_order: np.ndarray  # (m,) leaves in the final order: sorted tree with detached blocks re-inserted
    moved: np.ndarray  # detached nodes (disjoint subtrees; each leaf moves at most once)
    budget_tokens: int  # prompt tokens the split may recompute
    spent_tokens: int  # prompt tokens it does recompute: sharing of the sorted order minus the final one
    rounds: int  # sort-and-split rounds run
    disorder_before: float  # disorder() of the layer-wise sorted order
    disorder_after: float  # disorder() of the final order
    history: list[int] = field(default_factory=list)  # subtrees detached in each round


def split(
    tree: PrefixTree,
    cost_model: CostModel,
    keep_sharing: float = 0.99,
    max_rounds: int = 4,
    min_shift: float = 0.02,
    window: int = 32,
) -> SplitResult:
    """Layer-wise sort, then detach outlier subtrees while recomputation stays within the budget.

    ``keep_sharing``: fraction of the depth-first order's prefix sharing to
    keep (1.0 disables splitting). A subtree is an outlier when its sorted
    place (by density, in units of work) is more than ``min_shift`` of the
    job away from where the sort put it. Rounds repeat (re-sorting the rest,
    whose densities changed) until nothing is misplaced or nothing more is
    affordable.
    """
    sorted_order = dfs_order(tree, tree.stats.density)[0]
    best = order_sharing(tree, sorted_order)
    budget = int(np.floor((1.0 - keep_sharing) * best))
    moved: list[int] = []
    final, history = sorted_order, []
    for _ in range(max_rounds):
        chosen = _choose_moves(tree, cost_model, moved, best - order_sharing(tree, final), budget, min_shift, window)
        if not chosen:
            break
        chosen, final = _affordable_prefix(tree, cost_model, moved, chosen, best - budget, window, final)
        if not chosen:
            break
        moved += chosen
        history.append(len(chosen))
    return SplitResult(
        leaf_order=final,
        moved=np.asarray(moved, dtype=np.int64),
        budget_tokens=budget,
        spent_tokens=best - order_sharing(tree, final),
        rounds=len(history),
        disorder_before=disorder(tree, sorted_order),
        disorder_after=disorder(tree, final),
        history=history,
    )


def _affordable_prefix(
    tree: PrefixTree,
    cost_model: CostModel,
    moved: list[int],
    chosen: list[int],
    floor: int,
    window: int,
    current: np.ndarray,
) -> tuple[list[int], np.ndarray]:
    """The longest prefix of ``chosen`` (in greedy order) whose assembled order keeps sharing >= floor.

    Charges are estimated per move; moves interact (two blocks at one slot),
    so the real order decides: all of them usually fit, else binary search.
    """
    order = assemble(tree, cost_model, moved + chosen, window)
    if order_sharing(tree, order) >= floor:
        return chosen, order
    lo, hi, best_order = 0, len(chosen) - 1, current
    while lo < hi:
        mid = (lo + hi + 1) // 2
        order = assemble(tree, cost_model, moved + chosen[:mid], window)
        if order_sharing(tree, order) >= floor:
            lo, best_order = mid, order
        else:
            hi = mid - 1
    return chosen[:lo], best_order


def _base(tree: PrefixTree, cost_model: CostModel, moved: list[int]) -> tuple[np.ndarray, np.ndarray, NodeStats, np.ndarray]:
    """Mask of leaves still in the tree, their sorted order, node starts and stats without the moved ones."""
    mask = np.ones(tree.n_leaves, dtype=bool)
    for node in moved:
        mask[tree.lo[node] : tree.hi[node]] = False
    stats = node_stats(tree, cost_model, mask) if moved else tree.stats
    order, start = dfs_order(tree, stats.density, mask)
    return mask, order, stats, start


def assemble(tree: PrefixTree, cost_model: CostModel, moved: list[int], window: int = 32) -> np.ndarray:
    """The final leaf order: the rest of the tree sorted, each moved subtree as one block at its slot."""
    mask, base, _, _ = _base(tree, cost_model, moved)
    if not moved:
        return base
    nodes = np.asarray(moved, dtype=np.int64)
    slots = choose_slots(tree, base, nodes, window)
    inner, _ = dfs_order(tree, tree.stats.density, ~mask)  # blocks are whole subtrees: contiguous in here
    block_of_leaf = np.full(tree.n_leaves, -1, dtype=np.int64)
    for b, node in enumerate(nodes):
        block_of_leaf[tree.lo[node] : tree.hi[node]] = b
    # Base leaf i sorts at 2 i + 1; a block inserted before base leaf s at 2 s, denser blocks first.
    major = np.empty(tree.n_leaves, dtype=np.int64)
    minor = np.zeros(tree.n_leaves, dtype=np.float64)
    major[base] = 2 * np.arange(len(base)) + 1
    blocks = block_of_leaf[inner]
    major[inner] = 2 * slots[blocks]
    minor[inner] = -tree.stats.density[nodes[blocks]]
    within = np.zeros(tree.n_leaves, dtype=np.int64)
    within[inner] = np.arange(len(inner))
    return np.lexsort((within, minor, major))


def _ideal_starts(tree: PrefixTree, base: np.ndarray, density: np.ndarray) -> np.ndarray:
    """Base-order index where a block of the given density belongs: the work denser than it comes first."""
    w = leaf_time(tree)[base]
    rho = tree.stats.density[tree.n_internal + base]
    by_rho = np.argsort(-rho, kind="stable")
    denser_work = np.concatenate([[0.0], np.cumsum(w[by_rho])])
    work_before = np.searchsorted(-rho[by_rho], -density, side="left")
    target = denser_work[work_before]
    return np.searchsorted(np.cumsum(w) - w, target, side="left")


def choose_slots(tree: PrefixTree, base: np.ndarray, nodes: np.ndarray, window: int) -> np.ndarray:
    """Insertion slot (before base[s]; len(base) = at the end) of each block: near its density's place,
    at the neighbour pair where inserting it breaks the least shared prefix."""
    centre = _ideal_starts(tree, base, tree.stats.density[nodes])
    offsets = np.arange(-window, window + 1)
    slots = np.clip(centre[:, None] + offsets[None, :], 0, len(base))
    return slots[np.arange(len(nodes)), np.argmin(_insertion_cost(tree, base, nodes, slots), axis=1)]


def _insertion_cost(tree: PrefixTree, base: np.ndarray, nodes: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Shared prefix lost by putting each block between base[s - 1] and base[s]."""
    n = len(base)
    inside = np.broadcast_to(tree.lo[nodes][:, None], slots.shape).ravel()
    s = slots.ravel()
    x = base[np.clip(s - 1, 0, max(n - 1, 0))] if n else s
    y = base[np.clip(s, 0, max(n - 1, 0))] if n else s
    has_x, has_y = s > 0, s < n
    broken = np.where(has_x & has_y, tree.leaf_pair_lcp(x, y), 0)
    gained = np.where(has_x, tree.leaf_pair_lcp(x, inside), 0) + np.where(has_y, tree.leaf_pair_lcp(inside, y), 0)
    return (broken - gained).reshape(slots.shape)


def _choose_moves(
    tree: PrefixTree,
    cost_model: CostModel,
    moved: list[int],
    spent: int,
    budget: int,
    min_shift: float,
    window: int,
    max_candidates: int = 2048,
) -> list[int]:
    """Greedy pick of outlier subtrees by misplaced work per recomputed token, disjoint, within the budget."""
    mask, base, stats, start = _base(tree, cost_model, moved)
    candidates, shift = _outliers(tree, base, stats, start, mask, min_shift)
    if not len(candidates):
        return []
    charge = _removal_cost(tree, base, start, candidates, stats)
    benefit = stats.time[candidates] * shift
    # Slots are the expensive part: only the most promising candidates get one.
    keep = np.argsort(-(benefit / (charge + 1.0)), kind="stable")[:max_candidates]
    candidates, charge, benefit = candidates[keep], charge[keep], benefit[keep]
    slots = choose_slots(tree, base, candidates, window)
    charge += np.maximum(_insertion_cost(tree, base, candidates, slots[:, None])[:, 0], 0)
    rank = np.argsort(-(benefit / (charge + 1.0)), kind="stable")
    chosen: list[int] = []
    taken_lo: list[int] = []  # sorted starts of chosen subtrees, to reject nested picks
    taken_hi: dict[int, int] = {}
    for i in rank:
        node = int(candidates[i])
        if spent + charge[i] > budget:
            continue
        if _overlaps(taken_lo, taken_hi, int(tree.lo[node]), int(tree.hi[node])):
            continue
        bisect.insort(taken_lo, int(tree.lo[node]))
        taken_hi[int(tree.lo[node])] = int(tree.hi[node])
        chosen.append(node)
        spent += int(charge[i])
    return chosen


def _overlaps(taken_lo: list[int], taken_hi: dict[int, int], lo: int, hi: int) -> bool:
    """Whether [lo, hi) meets a chosen range; chosen ranges are disjoint subtrees, sorted by start."""
    k = bisect.bisect_right(taken_lo, hi - 1)
    return k > 0 and taken_hi[taken_lo[k - 1]] > lo


def _outliers(
    tree: PrefixTree, base: np.ndarray, stats: NodeStats, start: np.ndarray, mask: np.ndarray, min_shift: float
) -> tuple[np.ndarray, np.ndarray]:
    """Subtrees still whole in the tree whose sorted place is more than min_shift of the work away."""
    csum = np.concatenate([[0], np.cumsum(~mask)])
    untouched = (csum[tree.hi] - csum[tree.lo]) == 0
    nodes = np.flatnonzero(untouched & (tree.parent >= 0) & (stats.n_inferences > 0))
    w = leaf_time(tree)[base]
    total = w.sum()
    if total <= 0 or not len(nodes):
        return nodes[:0], np.zeros(0)
    work_before = np.concatenate([[0.0], np.cumsum(w)])
    here = work_before[start[nodes]]
    there = work_before[np.minimum(_ideal_starts(tree, base, stats.density[nodes]), len(base))]
    shift = np.abs(there - here) / total
    # A subtree that does not move past its own width is not misplaced, just wide.
    keep = (shift > min_shift) & (shift * total > stats.time[nodes])
    return nodes[keep], shift[keep]


def _removal_cost(tree: PrefixTree, base: np.ndarray, start: np.ndarray, nodes: np.ndarray, stats: NodeStats) -> np.ndarray:
    """Shared prefix lost where each subtree leaves: LCP with both neighbours minus theirs with each other."""
    n = len(base)
    first = start[nodes]
    last = first + stats.n_inferences[nodes] - 1
    has_a, has_b = first > 0, last < n - 1
    a = base[np.maximum(first - 1, 0)]
    b = base[np.minimum(last + 1, n - 1)]
    inside = tree.lo[nodes]
    lost = np.where(has_a, tree.leaf_pair_lcp(a, inside), 0) + np.where(has_b, tree.leaf_pair_lcp(inside, b), 0)
    return (lost - np.where(has_a & has_b, tree.leaf_pair_lcp(a, b), 0)).astype(np.float64)
