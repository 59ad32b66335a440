"""The planner's scheduling policies, registered in ``blendserve.policies`` by name.

``dfs``, ``density``, ``blendserve-nosplit``, ``blendserve`` and
``blendserve-static`` beside the registry's ``fcfs`` and ``balance``; every
one admits every request of the batch once, so they compare like for like in
the simulator and an engine.
"""

from __future__ import annotations

import numpy as np

from blendserve.admission import AdmissionController, StaticOrder
from blendserve.planner.dual_scan import ScanItems, static_dual_scan_order
from blendserve.planner.dual_scan_projected import ProjectedDualScan
from blendserve.planner.groups import leaf_groups
from blendserve.planner.plan import ordered_leaves, requests_along, scan_items
from blendserve.planner.prefix_tree import PrefixTree, build_prefix_tree
from blendserve.planner.sort_split import dfs_order
from blendserve.policies import PolicyContext, register


def _tree(context: PolicyContext) -> PrefixTree:
    return build_prefix_tree(context.batch, context.cost_model, context.output_estimates)


@register("dfs")
def dfs(context: PolicyContext) -> AdmissionController:
    """Depth-first prefix-tree order, heaviest subtree (most requests) first, like SGLang's dfs-weight."""
    tree = _tree(context)
    order, _ = dfs_order(tree, tree.stats.n_requests.astype(np.float64))
    return StaticOrder(requests_along(tree, order, with_duplicates=True))


@register("density")
def density(context: PolicyContext) -> AdmissionController:
    """Every request sorted by its own density, compute-heavy first: blends nothing, shares by luck."""
    cm = context.cost_model
    p = context.batch.prompt_lens
    d = np.asarray(context.output_estimates, dtype=np.int64)
    rho = cm.density(cm.comp(p, d), cm.mem_time(p, d))
    return StaticOrder(np.argsort(-rho, kind="stable"))


def _scan_items(context: PolicyContext, with_split: bool) -> ScanItems:
    tree = _tree(context)
    leaf_order, _ = ordered_leaves(tree, context.cost_model, with_split=with_split)
    groups = leaf_groups(tree, leaf_order, context.cost_model)
    return scan_items(context.batch, tree, leaf_order, groups, with_duplicates=True)


def _blendserve(context: PolicyContext, with_split: bool) -> AdmissionController:
    return ProjectedDualScan(_scan_items(context, with_split), context.kv_capacity_tokens)


@register("blendserve-nosplit")
def blendserve_nosplit(context: PolicyContext) -> AdmissionController:
    """Layer-wise density sort and dual scan, no node splitting."""
    return _blendserve(context, with_split=False)


@register("blendserve")
def blendserve(context: PolicyContext) -> AdmissionController:
    """Layer-wise sort, conditional splitting (99% of DFS sharing kept) and dual scan."""
    return _blendserve(context, with_split=True)


@register("blendserve-static")
def blendserve_static(context: PolicyContext) -> AdmissionController:
    """The dual scan's static list (what the pipeline's shards submit to an engine), admitted in order."""
    items = _scan_items(context, with_split=True)
    stream, _ = static_dual_scan_order(items)
    return StaticOrder(items.requests[stream])
