"""The planner's scheduling policies, registered in ``blendserve.policies`` by name.

``dfs``, ``density``, ``blendserve-nosplit``, ``blendserve``,
``blendserve-static`` and ``blendserve-spread`` beside the registry's
``fcfs`` and ``balance``; every
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
from blendserve.planner.predictive import Candidate, ChosenAdmission, choose
from blendserve.planner.prefix_tree import PrefixTree, build_prefix_tree
from blendserve.planner.sort_split import dfs_order
from blendserve.planner.spread import spread_keys, unit_cuts
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


def _scan_items(context: PolicyContext, with_split: bool, tree: PrefixTree | None = None) -> ScanItems:
    tree = _tree(context) if tree is None else tree
    leaf_order, _ = ordered_leaves(tree, context.cost_model, with_split=with_split)
    groups = leaf_groups(tree, leaf_order, context.cost_model)
    return scan_items(context.batch, tree, leaf_order, groups, with_duplicates=True)


# Leads of the memory-heavy strata the stratified blend is tried with: 0.05 was best on 6 of the 8 paper
# mixes, 0.15 on 8B d1.4-s35 and d0.9-s35 (docs/PLANNER_NOTES.md); the prediction ranks them right on all 8.
SPREAD_LEADS = (0.05, 0.15)


def _candidates(context: PolicyContext, tree: PrefixTree, items: ScanItems) -> dict[str, Candidate]:
    """What ``blendserve`` chooses from: the projected dual scan, its static list, the stratified blends."""
    candidates: dict[str, Candidate] = {
        "dual-scan": lambda sub, kept: ProjectedDualScan(sub, context.kv_capacity_tokens),
        "static": lambda sub, kept: StaticOrder(sub.requests[static_dual_scan_order(sub)[0]]),
    }
    cuts = unit_cuts(tree, items)
    for lead in SPREAD_LEADS:
        keys = spread_keys(items, cuts, lead=lead)  # for the job's items; a subsample takes its own
        candidates[f"spread-{lead:g}"] = _spread_candidate(keys)
    return candidates


def _spread_candidate(keys: np.ndarray) -> Candidate:
    return lambda sub, kept: StaticOrder(sub.requests[np.argsort(keys[kept], kind="stable")])


def _blendserve(context: PolicyContext, with_split: bool) -> AdmissionController:
    return ProjectedDualScan(_scan_items(context, with_split), context.kv_capacity_tokens)


@register("blendserve-nosplit")
def blendserve_nosplit(context: PolicyContext) -> AdmissionController:
    """Layer-wise density sort and dual scan, no node splitting."""
    return _blendserve(context, with_split=False)


@register("blendserve")
def blendserve(context: PolicyContext) -> AdmissionController:
    """Layer-wise sort, conditional splitting (99% of DFS sharing kept), then the admission predicted fastest.

    Each candidate (``_candidates``) is simulated on the estimated lengths
    (``predictive.choose``); the chosen one is built afresh for the job.
    """
    tree = _tree(context)
    items = _scan_items(context, with_split=True, tree=tree)
    candidates = _candidates(context, tree, items)
    choice = choose(context.batch, items, context.output_estimates, context.cost_model,
                    context.kv_capacity_tokens, candidates, seed=context.seed)
    return ChosenAdmission(candidates[choice.name](items, np.arange(len(items.requests))), items, choice)


@register("blendserve-static")
def blendserve_static(context: PolicyContext) -> AdmissionController:
    """The dual scan's static list (what the pipeline's shards submit to an engine), admitted in order."""
    items = _scan_items(context, with_split=True)
    stream, _ = static_dual_scan_order(items)
    return StaticOrder(items.requests[stream])


@register("blendserve-spread")
def blendserve_spread(context: PolicyContext) -> AdmissionController:
    """The stratified blend (``planner.spread``): density strata spread evenly, prefix units kept whole."""
    tree = _tree(context)
    items = _scan_items(context, with_split=True, tree=tree)
    return StaticOrder(items.requests[np.argsort(spread_keys(items, unit_cuts(tree, items)), kind="stable")])
