"""Data-parallel shards: every request in exactly one shard, pieces from both ends, balanced time."""

from __future__ import annotations

import numpy as np
import pytest

from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.pipeline.plan import build_plan
from synthetic import synthetic_batch

COST = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))


@pytest.mark.parametrize("k", [1, 2, 5, 8])
def test_every_item_in_exactly_one_shard_from_both_ends(k: int) -> None:
    batch = synthetic_batch(4000, mean_prompt=150, memory_heavy_fraction=0.4, seed=k)
    plan = build_plan(batch, COST, shards=k)
    shards = plan.shards
    m = len(plan.leaf_order)
    assert shards.of_item.shape == (m,)
    assert set(np.unique(shards.of_item).tolist()) <= set(range(k))
    # Each shard = one left piece and one right piece of the planned order (the last one the middle).
    for j in range(k):
        members = np.flatnonzero(shards.of_item == j)
        left = members[members < shards.left_cuts[j + 1]]
        right = members[members >= shards.left_cuts[j + 1]]
        for piece in (left, right):
            assert len(piece) == 0 or piece[-1] - piece[0] == len(piece) - 1
    assert np.array_equal(shards.time, np.maximum(shards.comp, shards.mem))
    assert shards.imbalance < 1.1 if k > 1 else shards.imbalance == 1.0


def test_shards_are_blended() -> None:
    batch = synthetic_batch(4000, mean_prompt=150, memory_heavy_fraction=0.4, seed=7)
    plan = build_plan(batch, COST, shards=4)
    rho = plan.shards.comp / plan.shards.mem
    whole = plan.target_density
    # Every shard's density stays near the job's, instead of compute-heavy shards then memory-heavy ones.
    assert np.all(rho > whole / 2) and np.all(rho < whole * 2)
