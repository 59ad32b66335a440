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
from blendserve.planner.predictive import Candidate, ChosenAdmission, Predictor
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


# Lead of the memory-heavy strata in the fixed-lead stratified blend: best on 6 of the 8 paper mixes at 40k
# requests (docs/PLANNER_NOTES.md). Its simulated steps time the deadline candidates.
SPREAD_LEAD = 0.05
SPREAD = f"spread-{SPREAD_LEAD:g}"  # its candidate's name
# Deadline factors of the deadline candidates (spread_keys: a stratum leads by factor x its longest decode /
# the run's steps); at 40k requests 0.5, 0.8 and 1.0 were each best on one paper mix (8B).
DEADLINES = (0.5, 0.8, 1.0)
# Largest estimated peak KV of a memory-heavy unit of the stratified blend, as a share of the KV capacity:
# about one long video on the paper setups, so repeated long-decode prompts are spread one by one.
UNIT_KV_SHARE = 0.05


def _unit_cuts(context: PolicyContext, tree: PrefixTree, items: ScanItems) -> np.ndarray:
    return unit_cuts(tree, items, max_unit_kv=UNIT_KV_SHARE * context.kv_capacity_tokens)


def _candidates(context: PolicyContext, items: ScanItems, cuts: np.ndarray) -> dict[str, Candidate]:
    """What ``blendserve`` chooses from first: the projected dual scan, its static list, the fixed-lead blend."""
    return {
        "dual-scan": lambda sub, kept: ProjectedDualScan(sub, context.kv_capacity_tokens),
        "static": lambda sub, kept: StaticOrder(sub.requests[static_dual_scan_order(sub)[0]]),
        SPREAD: _spread_candidate(spread_keys(items, cuts, lead=SPREAD_LEAD)),
    }


def _deadline_candidates(items: ScanItems, cuts: np.ndarray, run_steps: float) -> dict[str, Candidate]:
    """Stratified blends whose memory-heavy strata end in time for a run of ``run_steps`` steps (no fixed lead)."""
    return {f"deadline-{factor:g}": _spread_candidate(spread_keys(items, cuts, lead=0.0, run_steps=run_steps,
                                                                 deadline=factor))
            for factor in DEADLINES}


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

    Each candidate is simulated on the estimated lengths
    (``predictive.choose``) in two rounds: ``_candidates``, then the deadline
    blends timed by the fixed-lead blend's simulated steps (scaled to the job
    when a subsample stood for it). The chosen one is built afresh for the job.
    """
    tree = _tree(context)
    items = _scan_items(context, with_split=True, tree=tree)
    cuts = _unit_cuts(context, tree, items)
    candidates = _candidates(context, items, cuts)
    predictor = Predictor(context.batch, items, context.output_estimates, context.cost_model,
                          context.kv_capacity_tokens, seed=context.seed)
    choice = predictor.choose(candidates)
    run_steps = choice.steps[SPREAD] * len(items.requests) / max(choice.sample, 1)
    deadline = _deadline_candidates(items, cuts, run_steps)
    choice = choice.merged(predictor.choose(deadline))
    chosen = {**candidates, **deadline}[choice.name]
    return ChosenAdmission(chosen(items, np.arange(len(items.requests))), items, choice)


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
    return StaticOrder(items.requests[np.argsort(spread_keys(items, _unit_cuts(context, tree, items)), kind="stable")])
