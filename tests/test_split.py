"""Layer-wise sort keeps subtrees whole; split stays within its budget and moves each leaf once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.planner.prefix_tree import PrefixTree, build_prefix_tree
from blendserve.planner.sort_split import dfs_order, order_sharing, split
from synthetic import batch_from_prompts, synthetic_batch

COST = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))


def _contiguous(tree: PrefixTree, order: np.ndarray, node: int, skip: np.ndarray | None = None) -> bool:
    position = np.empty(tree.n_leaves, dtype=np.int64)
    position[order] = np.arange(len(order))
    leaves = np.arange(tree.lo[node], tree.hi[node])
    if skip is not None:
        leaves = leaves[~skip[leaves]]
    where = np.sort(position[leaves])
    return len(where) == 0 or where[-1] - where[0] == len(where) - 1


def _mixed_tree(seed: int, n: int = 1500) -> PrefixTree:
    batch = synthetic_batch(n, mean_prompt=120, family_size=60, memory_heavy_fraction=0.4, seed=seed)
    # Mix kinds inside families, so sorted subtrees hold outliers worth moving.
    rng = np.random.default_rng(seed)
    flip = rng.random(n) < 0.15
    estimates = np.where(flip, 1500, np.where(batch.expected_output_tokens > 0, batch.expected_output_tokens, 8))
    batch.max_tokens[:] = 2048
    return build_prefix_tree(batch, COST, estimates)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=30), st.integers(0, 99))
def test_layerwise_sort_keeps_every_subtree_contiguous(prompts: list[list[int]], seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch = batch_from_prompts(prompts, max_tokens=4096)
    tree = build_prefix_tree(batch, COST, rng.integers(1, 4096, size=len(prompts)))
    order, _ = dfs_order(tree, tree.stats.density)
    assert sorted(order.tolist()) == list(range(tree.n_leaves))
    assert all(_contiguous(tree, order, node) for node in range(tree.n_nodes))
    for node in range(tree.n_internal):
        children = np.flatnonzero(tree.parent == node)
        starts = np.array([np.flatnonzero(np.isin(order, np.arange(tree.lo[c], tree.hi[c])))[0] for c in children])
        rho = tree.stats.density[children[np.argsort(starts)]]
        assert np.all(np.diff(rho) <= 1e-12 * np.abs(rho[:-1]))  # denser siblings first
    assert order_sharing(tree, order) == tree.prompt_len.sum() - tree.stats.unique_prompt_tokens[0]


@pytest.mark.parametrize("keep", [0.999, 0.99, 0.95])
def test_split_never_spends_more_than_its_budget(keep: float) -> None:
    tree = _mixed_tree(seed=1)
    result = split(tree, COST, keep_sharing=keep)
    best = int(tree.prompt_len.sum() - tree.stats.unique_prompt_tokens[0])
    assert result.budget_tokens == int(np.floor((1 - keep) * best))
    assert len(result.moved) > 0, "this workload has outliers worth moving"
    assert result.spent_tokens <= result.budget_tokens
    assert order_sharing(tree, result.leaf_order) >= keep * best
    assert sorted(result.leaf_order.tolist()) == list(range(tree.n_leaves))


def test_split_moves_each_leaf_once_and_keeps_other_subtrees_whole() -> None:
    tree = _mixed_tree(seed=2)
    result = split(tree, COST, keep_sharing=0.97)
    moved_leaves = np.zeros(tree.n_leaves, dtype=np.int64)
    for node in result.moved:
        moved_leaves[tree.lo[node] : tree.hi[node]] += 1
        assert _contiguous(tree, result.leaf_order, int(node)), "a moved subtree travels as one block"
    assert moved_leaves.max() == 1
    skip = moved_leaves.astype(bool)
    # Every subtree is contiguous once its split-off parts are set aside.
    assert all(_contiguous(tree, result.leaf_order, node, skip) for node in range(tree.n_nodes))


def test_zero_budget_loses_no_sharing() -> None:
    tree = _mixed_tree(seed=3)
    result = split(tree, COST, keep_sharing=1.0)
    best = int(tree.prompt_len.sum() - tree.stats.unique_prompt_tokens[0])
    assert result.budget_tokens == 0 and result.spent_tokens == 0
    assert order_sharing(tree, result.leaf_order) == best  # only free moves (no shared prefix) were made
