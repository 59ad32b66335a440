"""The plan end to end: every request once, the Parquet file, the policies in the simulator."""

from __future__ import annotations

import numpy as np

from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.pipeline.plan import build_plan, read_plan, write_plan
from blendserve.planner.estimates import default_output_estimates
from synthetic import synthetic_batch
from blendserve.scheduling.registry import POLICIES, PolicyContext, make_controller

COST = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))


def test_plan_file_has_every_request_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    batch = synthetic_batch(3000, mean_prompt=100, duplicate_fraction=0.05, seed=4)
    plan = build_plan(batch, COST, shards=3)
    rows = read_plan(write_plan(plan, batch, COST, tmp_path))
    ids = rows.column("request_id").to_pylist()
    assert sorted(ids) == sorted(batch.request_ids.tolist())
    answered = np.array(rows.column("answered_by").to_pylist())
    ran = rows.filter(np.array(ids) == answered)
    # Inferences that run: one position per (shard, position), positions 0..len-1 in each shard.
    for shard in range(3):
        positions = np.sort(ran.filter(np.asarray(ran.column("shard")) == shard).column("position").to_numpy())
        assert np.array_equal(positions, np.arange(len(positions)))
    assert len(ran) == plan.tree.n_leaves < len(batch)


def test_planner_never_reads_true_lengths() -> None:
    batch = synthetic_batch(800, mean_prompt=80, seed=5)
    first = build_plan(batch, COST)
    batch.sim_output_tokens[:] = np.random.default_rng(0).integers(1, 5000, size=len(batch))
    second = build_plan(batch, COST)
    assert np.array_equal(first.stream, second.stream) and np.array_equal(first.leaf_order, second.leaf_order)


def test_every_policy_admits_every_request_once() -> None:
    from blendserve.scheduling.admission import EngineState

    batch = synthetic_batch(600, mean_prompt=60, duplicate_fraction=0.05, seed=6)
    context = PolicyContext(batch, default_output_estimates(batch), COST, 20_000, seed=0)
    assert {"fcfs", "balance", "dfs", "density", "blendserve-nosplit", "blendserve"} <= set(POLICIES)
    state = EngineState(0, 0, 0, 20_000)
    for name in POLICIES:
        controller = make_controller(name, context)
        seen: list[int] = []
        running: list[int] = []
        while controller.remaining():
            index = controller.next_request(state)
            if index is None:
                assert running, name
                controller.on_finish(running.pop(0), 1)  # free room the way an engine would
                continue
            seen.append(index)
            running.append(index)
        assert sorted(seen) == list(range(len(batch))), name


def test_blendserve_beats_dfs_and_fcfs_in_the_simulator() -> None:
    from blendserve.sim import SimConfig, kv_capacity_tokens, simulate

    batch = synthetic_batch(3000, mean_prompt=300, memory_heavy_fraction=0.3, seed=8)
    estimates = default_output_estimates(batch)
    capacity = kv_capacity_tokens(COST, SimConfig())
    context = PolicyContext(batch, estimates, COST, capacity)
    times = {
        name: simulate(batch, batch.sim_output_tokens, COST, make_controller(name, context)).total_time
        for name in ("fcfs", "dfs", "blendserve")
    }
    assert times["blendserve"] < times["dfs"] and times["blendserve"] < times["fcfs"]
