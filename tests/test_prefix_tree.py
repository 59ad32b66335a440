"""The LCP-built prefix tree against a brute-force trie, and dedupe."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.pipeline.plan import build_plan, read_plan, write_plan
from blendserve.planner.lcp import RangeMin, sort_prompts
from blendserve.planner.prefix_tree import build_prefix_tree
from synthetic import batch_from_prompts

COST = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
prompts_strategy = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=40)


def _trie_size(prompts: list[list[int]]) -> int:
    return len({tuple(p[:k]) for p in prompts for k in range(1, len(p) + 1)})


def _lcp(a: list[int], b: list[int]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


@settings(max_examples=60, deadline=None)
@given(prompts_strategy, st.sampled_from([2, 4, 16]))
def test_sort_groups_shared_prefixes_and_lcp_is_exact(prompts: list[list[int]], chunk: int) -> None:
    batch = batch_from_prompts(prompts)
    order, lcp = sort_prompts(batch.tokens, batch.token_offsets, chunk=chunk)
    assert sorted(order.tolist()) == list(range(len(prompts)))
    for i in range(1, len(order)):
        assert lcp[i] == _lcp(prompts[order[i - 1]], prompts[order[i]])
    # Grouped: prompts sharing a prefix of length k form one contiguous run, for every k.
    for k in range(1, 13):
        keys = [tuple(prompts[j][:k]) for j in order if len(prompts[j]) >= k]
        runs = [key for i, key in enumerate(keys) if i == 0 or keys[i - 1] != key]
        assert len(runs) == len(set(runs))


@settings(max_examples=60, deadline=None)
@given(prompts_strategy)
def test_tree_nodes_and_stats_match_a_brute_force_trie(prompts: list[list[int]]) -> None:
    tree = build_prefix_tree(batch_from_prompts(prompts), COST, chunk=2)
    assert tree.stats.unique_prompt_tokens[0] == _trie_size(prompts)
    assert tree.stats.n_requests[0] == len(prompts)
    leaf_prompts = [prompts[r] for r in tree.leaf_request]
    for node in range(tree.n_nodes):
        members = leaf_prompts[tree.lo[node] : tree.hi[node]]
        if node != 0:
            # A node's depth is the longest prefix all its leaves share; its parent is strictly shallower.
            assert tree.depth[node] == min(len(p) for p in members) if len(members) == 1 else True
            assert tree.depth[node] <= min(_lcp(members[0], p) for p in members)
            assert tree.depth[tree.parent[node]] <= tree.depth[node]
            assert tree.lo[tree.parent[node]] <= tree.lo[node] and tree.hi[node] <= tree.hi[tree.parent[node]]
        assert tree.stats.unique_prompt_tokens[node] == _trie_size(members)
        assert np.isclose(tree.stats.sum_prompt[node], sum(len(p) for p in members))


def test_range_min_matches_numpy() -> None:
    rng = np.random.default_rng(3)
    values = rng.integers(0, 50, size=300)
    table = RangeMin(values)
    lo = rng.integers(0, 299, size=500)
    hi = lo + 1 + rng.integers(0, 300 - lo - 1 + 1)
    hi = np.minimum(hi, 300)
    assert all(table.query(lo, hi)[i] == values[lo[i] : hi[i]].min() for i in range(500))


def test_identical_requests_share_one_leaf_unless_sampling_differs() -> None:
    prompts = [[1, 2, 3], [1, 2, 3], [1, 2, 4], [1, 2, 3], [9]]
    batch = batch_from_prompts(prompts)
    tree = build_prefix_tree(batch, COST)
    assert tree.n_leaves == 3
    assert tree.request_leaf[0] == tree.request_leaf[1] == tree.request_leaf[3]
    assert tree.leaf_weight.sum() == 5
    keyed = build_prefix_tree(batch, COST, sampling_keys=np.array([7, 8, 7, 7, 7]))
    assert keyed.n_leaves == 4
    assert keyed.request_leaf[0] == keyed.request_leaf[3] != keyed.request_leaf[1]


def test_dedupe_points_every_duplicate_at_one_inference(tmp_path) -> None:  # type: ignore[no-untyped-def]
    prompts = [[1, 2, 3], [5, 6], [1, 2, 3], [1, 2, 3], [5, 6, 7]]
    batch = batch_from_prompts(prompts)
    plan = build_plan(batch, COST)
    rows = read_plan(write_plan(plan, batch, COST, tmp_path))
    answered = dict(zip(rows.column("request_id").to_pylist(), rows.column("answered_by").to_pylist()))
    assert len(set(answered.values())) == 3 and answered["r0"] == answered["r2"] == answered["r3"]
    assert answered["r0"] in ("r0", "r2", "r3") and answered["r1"] == "r1" and answered["r4"] == "r4"
