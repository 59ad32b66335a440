"""The orders blendserve is measured against: the file as given, random, depth-first, density-sorted.

``fcfs`` is what running vLLM on the file does; ``balance`` blends every kind of
request but loses prefix sharing; ``dfs`` keeps the most sharing (SGLang's
dfs-weight); ``density`` blends nothing and shares only by luck.
"""

from __future__ import annotations

import numpy as np

from blendserve.planner.items import requests_along
from blendserve.planner.prefix_tree import PrefixTree, build_prefix_tree
from blendserve.planner.sort_split import dfs_order
from blendserve.scheduling.admission import AdmissionController, StaticOrder
from blendserve.scheduling.registry import PolicyContext


def prefix_tree(context: PolicyContext) -> PrefixTree:
    """The batch's prefix tree on the context's estimates (every tree-based policy starts here)."""
    return build_prefix_tree(context.batch, context.cost_model, context.output_estimates)


def fcfs(context: PolicyContext) -> AdmissionController:
    """Input order: what running vLLM on the file as it is does."""
    return StaticOrder(np.arange(len(context.batch)))


def balance(context: PolicyContext) -> AdmissionController:
    """Random order: blends compute- and memory-heavy work but loses prefix sharing."""
    rng = np.random.default_rng(context.seed)
    return StaticOrder(rng.permutation(len(context.batch)))


def dfs(context: PolicyContext) -> AdmissionController:
    """Depth-first prefix-tree order, heaviest subtree (most requests) first, like SGLang's dfs-weight."""
    tree = prefix_tree(context)
    order, _ = dfs_order(tree, tree.stats.n_requests.astype(np.float64))
    return StaticOrder(requests_along(tree, order, with_duplicates=True))


def density(context: PolicyContext) -> AdmissionController:
    """Every request sorted by its own density, compute-heavy first: blends nothing, shares by luck."""
    cm = context.cost_model
    p = context.batch.prompt_lens
    d = np.asarray(context.output_estimates, dtype=np.int64)
    rho = cm.density(cm.comp(p, d), cm.mem_time(p, d))
    return StaticOrder(np.argsort(-rho, kind="stable"))
