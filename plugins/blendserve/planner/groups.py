"""Leaf groups: runs of the ordered leaves that share a parent, the units the dual scan steps through."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blendserve.costmodel import CostModel
from blendserve.planner.prefix_tree import PrefixTree


@dataclass
class LeafGroups:
    of_position: np.ndarray  # (m,) group of each position of the leaf order; non-decreasing
    starts: np.ndarray  # (G + 1,) first position of each group, then m
    comp: np.ndarray  # (G,) Comp_eff seconds of the group (its shared prefix counted once)
    mem: np.ndarray  # (G,) Mem seconds of the group
    density: np.ndarray  # (G,) rho = comp / mem
    kv_tokens: np.ndarray  # (G,) KV footprint in tokens: distinct prompt tokens + estimated outputs

    def __len__(self) -> int:
        return len(self.density)


def leaf_groups(tree: PrefixTree, leaf_order: np.ndarray, cost_model: CostModel, max_group: int = 256) -> LeafGroups:
    """Cut the ordered leaves where the parent changes, and every ``max_group`` leaves inside a run.

    Siblings share their parent's prefix and were sorted together, so a run
    is prefix-local and of one kind; capping its length keeps the dual
    scan's view of density current inside huge flat runs (a trace with no
    shared prefix hangs a whole dataset under the root).
    """
    m = len(leaf_order)
    parents = tree.parent[tree.n_internal + leaf_order]
    new_run = np.ones(m, dtype=bool)
    new_run[1:] = parents[1:] != parents[:-1]
    run_start = np.maximum.accumulate(np.where(new_run, np.arange(m), 0))
    cut = ((np.arange(m) - run_start) % max(max_group, 1)) == 0
    starts = np.concatenate([np.flatnonzero(cut), [m]]).astype(np.int64)
    of_position = np.cumsum(cut) - 1
    p = tree.prompt_len[leaf_order].astype(np.float64)
    d = tree.output_est[leaf_order].astype(np.float64)
    shared = np.zeros(m, dtype=np.float64)
    if m > 1:
        shared[1:] = tree.leaf_pair_lcp(leaf_order[:-1], leaf_order[1:])
    shared[cut] = 0.0  # the first leaf of a group computes its whole prompt
    unique = _group_sum(p - shared, starts)
    comp = cost_model.comp_time(unique + _group_sum(d, starts))
    mem = _group_sum(cost_model.mem_time(p, d), starts)
    return LeafGroups(
        of_position=of_position,
        starts=starts,
        comp=comp,
        mem=mem,
        density=cost_model.density(comp, mem),
        kv_tokens=unique + _group_sum(d, starts),
    )


def _group_sum(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    if len(starts) <= 1:
        return np.zeros(0, dtype=np.float64)
    return np.add.reduceat(values, starts[:-1])
