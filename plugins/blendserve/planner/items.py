"""What the admission policies walk: the planned leaf order as a list of items, one per request to admit.

The tree side (prefix tree, sort and split, groups) ends here; ``blendserve.scheduling`` starts
from ``ScanItems``. Each item carries what admission needs without the tree: its group's density,
its estimated peak KV and output, and the prompt tokens it shares with the item before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel, kv_tokens_read
from blendserve.planner.groups import LeafGroups
from blendserve.planner.prefix_tree import PrefixTree
from blendserve.planner.sort_split import SplitResult, dfs_order, split


@dataclass
class ScanItems:
    requests: np.ndarray  # (k,) batch index of each item, in the planned left-to-right order
    group: np.ndarray  # (k,) leaf group of each item; non-decreasing
    group_density: np.ndarray  # (G,) density of each group
    kv_charge: np.ndarray  # (k,) estimated peak KV of each item in tokens: p + estimated d
    target_density: float  # rho_t: density of the whole job (the tree's root)
    output_est: np.ndarray | None = None  # (k,) estimated d of each item; enables run-time correction
    shared_prompt: np.ndarray | None = None  # (k,) prompt tokens shared with the previous item (cached once)



def item_work(items: ScanItems) -> tuple[np.ndarray, np.ndarray]:
    """(compute, KV reads) of each item in tokens: its prompt less the prefix shared with the previous item
    plus its estimated output, and the KV its decode reads (``kv_tokens_read``, as ``CostModel.mem_time``).
    """
    d = np.zeros(len(items.requests)) if items.output_est is None else items.output_est.astype(np.float64)
    prompt = np.maximum(items.kv_charge - d, 0.0)
    shared = np.zeros_like(prompt) if items.shared_prompt is None else items.shared_prompt
    return np.maximum(prompt - shared, 0.0) + d, kv_tokens_read(prompt, d)


def ordered_leaves(
    tree: PrefixTree, cost_model: CostModel, keep_sharing: float = 0.99, with_split: bool = True
) -> tuple[np.ndarray, SplitResult | None]:
    """Leaves in BlendServe order: layer-wise sorted by density, then (optionally) split."""
    if not with_split:
        return dfs_order(tree, tree.stats.density)[0], None
    result = split(tree, cost_model, keep_sharing=keep_sharing)
    return result.leaf_order, result


def requests_along(tree: PrefixTree, leaf_order: np.ndarray, with_duplicates: bool) -> np.ndarray:
    """Request indices along ``leaf_order``: each leaf's representative, then (optionally) its duplicates."""
    if not with_duplicates:
        return tree.leaf_request[leaf_order]
    leaf_position = np.empty(tree.n_leaves, dtype=np.int64)
    leaf_position[leaf_order] = np.arange(len(leaf_order))
    n = len(tree.request_leaf)
    is_rep = np.zeros(n, dtype=bool)
    is_rep[tree.leaf_request] = True
    return np.lexsort((np.arange(n), ~is_rep, leaf_position[tree.request_leaf]))


def scan_items(
    batch: RequestBatch, tree: PrefixTree, leaf_order: np.ndarray, groups: LeafGroups, with_duplicates: bool
) -> ScanItems:
    """Dual-scan items along ``leaf_order``: each leaf's representative, then (optionally) its duplicates.

    An engine that fans results out runs only representatives; one that
    takes every request (the policy registry) gets duplicates right after
    their twin, where the prefix cache serves their prompt.
    """
    leaf_position = np.empty(tree.n_leaves, dtype=np.int64)
    leaf_position[leaf_order] = np.arange(len(leaf_order))
    requests = requests_along(tree, leaf_order, with_duplicates)
    leaf = tree.request_leaf[requests]
    charge = (tree.prompt_len[leaf] + tree.output_est[leaf]).astype(np.float64)
    shared = np.zeros(len(leaf), dtype=np.float64)
    if len(leaf) > 1:  # a duplicate shares its twin's whole prompt (same leaf: LCP is the prompt)
        shared[1:] = tree.leaf_pair_lcp(leaf[:-1], leaf[1:])
    return ScanItems(
        requests=requests.astype(np.int64),
        group=groups.of_position[leaf_position[leaf]],
        group_density=groups.density,
        kv_charge=charge,
        target_density=float(tree.stats.density[0]),
        output_est=tree.output_est[leaf].astype(np.float64),
        shared_prompt=shared,
    )
