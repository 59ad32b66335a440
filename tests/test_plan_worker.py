"""The warm-up's plan made beside the engine: fillers go on until it lands, and nothing runs twice or is lost."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import blendserve.scheduling.plan_worker as plan_worker
from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.planner.prefix_tree import build_prefix_tree
from blendserve.sampling import select_samples
from blendserve.scheduling.admission import EngineState, StaticOrder
from blendserve.scheduling.plan_worker import InlinePlan, SimulatedPlan, ThreadPlan
from blendserve.scheduling.warmup import WarmupController, warmup_controller
from blendserve.sim import SimConfig, simulate
from synthetic import synthetic_batch

COST = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
STATE = EngineState(running=0, waiting=0, kv_used_tokens=0, kv_total_tokens=450_000)


def _simulated_run(worker, kv: int = 200_000):  # type: ignore[no-untyped-def]
    """A blendserve warm-up run in the simulator; the admissions in order, each checked against remaining()."""
    batch = synthetic_batch(1500, family_size=100, memory_heavy_fraction=0.2, seed=4)
    tree = build_prefix_tree(batch, COST)
    sampled = select_samples(batch, tree, rate=0.02, min_subtree=50, seed=0)
    controller = warmup_controller(batch, tree, sampled, COST, kv_capacity_tokens=kv, worker=worker)
    admitted: list[int] = []
    ask = controller.next_request

    def record(state: EngineState) -> int | None:
        picked = ask(state)
        if picked is not None:
            admitted.append(picked)
        # exact, or an engine would wait for requests that never come (vLLM raises on it)
        assert controller.remaining() == len(batch) - len(admitted)
        return picked

    controller.next_request = record  # type: ignore[method-assign]
    result = simulate(batch, batch.sim_output_tokens, COST, controller, SimConfig(kv_capacity_tokens=kv))
    return batch, controller, admitted, result


def test_fillers_run_while_the_simulated_plan_is_made_and_nothing_runs_twice(monkeypatch) -> None:
    _, inline, _, waited = _simulated_run(InlinePlan())
    monkeypatch.setattr(plan_worker, "PLAN_S_PER_SIM_STEP", 2e-4)  # a slow host: the plan takes a while
    batch, controller, admitted, result = _simulated_run(SimulatedPlan())
    assert sorted(admitted) == list(range(len(batch)))  # every request once: none twice, none lost
    assert inline.admitted_while_planning == 0  # inline, the engine waited
    assert controller.worker.latency_s > 1 and controller.admitted_while_planning > 0
    assert controller.unplanned > inline.unplanned  # the fillers went on
    # the plan's list is served past what ran meanwhile: the plan admitted the rest and only the rest
    planned = [i for i in admitted[len(controller.sampled) + controller.unplanned:]]
    assert set(planned) == set(controller._rest.tolist()) - set(admitted[:len(admitted) - len(planned)])
    assert result.total_time > 0 and waited.total_time > 0


def test_a_plan_slower_than_the_job_leaves_it_to_the_fillers(monkeypatch) -> None:
    monkeypatch.setattr(plan_worker, "PLAN_S_PER_SIM_STEP", 10.0)
    batch, controller, admitted, _ = _simulated_run(SimulatedPlan())
    assert sorted(admitted) == list(range(len(batch)))
    assert controller.inner is None and controller.unplanned == len(controller.fillers)


def test_the_simulated_latency_is_per_request_and_per_simulated_step() -> None:
    _, controller, _, _ = _simulated_run(SimulatedPlan())
    choice = controller.inner.choice
    assert choice.simulated_steps >= sum(choice.steps.values())  # every candidate, every draw
    assert choice.simulated_requests == choice.sample * len(choice.scenario_s) * choice.scenarios
    expected = (plan_worker.PLAN_S_PER_REQUEST * len(controller._rest)
                + plan_worker.PLAN_S_PER_SIM_REQUEST * choice.simulated_requests
                + plan_worker.PLAN_S_PER_SIM_STEP * choice.simulated_steps)
    assert controller.worker.latency_s == pytest.approx(expected)


class _SlowPlanner:
    """A ``RestPlanner`` whose plan waits for ``release`` (or fails with ``error``): the rest in index order."""

    def __init__(self, error: Exception | None = None) -> None:
        self.release = threading.Event()
        self.error = error
        self.lists_only: list[bool] = []

    def estimate(self, observed, running):  # type: ignore[no-untyped-def]
        return None

    def plan(self, rest, estimates, lists_only):  # type: ignore[no-untyped-def]
        self.release.wait(timeout=30)
        self.lists_only.append(lists_only)
        if self.error is not None:
            raise self.error
        return StaticOrder(np.arange(len(rest)))


def _threaded(planner: _SlowPlanner) -> WarmupController:
    """Samples 0..2 (all finished), fillers 3..39 in reverse order, a thread making the plan."""
    controller = WarmupController(np.array([0, 1, 2]), np.arange(39, 2, -1), planner, np.full(40, 1000),
                                  worker=ThreadPlan())
    assert [controller.next_request(STATE) for _ in range(3)] == [0, 1, 2]
    for i in range(3):
        controller.on_finish(i, 10)
    return controller


def test_the_engine_goes_on_while_a_thread_makes_the_plan() -> None:
    planner = _SlowPlanner()
    controller = _threaded(planner)
    meanwhile = [controller.next_request(STATE) for _ in range(5)]  # the plan starts on the first call
    assert meanwhile == [39, 38, 37, 36, 35] and controller.inner is None
    planner.release.set()
    controller.worker._thread.join(timeout=30)
    rest = [controller.next_request(STATE) for _ in range(controller.remaining())]
    # the plan (index order over 3..39) past the five that ran while it was made
    assert rest == list(range(3, 35)) and controller.next_request(STATE) is None and controller.remaining() == 0
    assert planner.lists_only == [True]  # requests run while it is made: a list, never a booking controller
    assert controller.admitted_while_planning == 5 and controller.plan_seconds > 0


def test_a_failed_plan_fails_the_run_where_the_engine_asks() -> None:
    planner = _SlowPlanner(error=ValueError("the cost model is broken"))
    controller = _threaded(planner)
    controller.next_request(STATE)
    planner.release.set()
    controller.worker._thread.join(timeout=30)
    with pytest.raises(ValueError, match="cost model is broken"):
        controller.next_request(STATE)


def test_a_shard_plans_on_a_thread_beside_a_real_engine_and_on_the_clock_in_the_simulator() -> None:
    from blendserve.config import RunConfig
    from blendserve.pipeline.shard import plan_worker as shard_worker

    def config(engine: str) -> RunConfig:
        return RunConfig(run_id="r", input="in.jsonl", db="out.duckdb", engine=engine)

    assert isinstance(shard_worker(config("simulator")), SimulatedPlan)
    assert isinstance(shard_worker(config("vllm")), ThreadPlan)
