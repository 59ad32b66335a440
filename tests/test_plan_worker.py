"""The warm-up's plan made beside the engine: fillers go on until it lands, and nothing runs twice or is lost."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import blendserve.scheduling.plan_worker as plan_worker
import blendserve.scheduling.warmup as warmup
from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.planner.prefix_tree import build_prefix_tree
from blendserve.sampling import select_samples
from blendserve.scheduling.admission import EngineState, StaticOrder
from blendserve.scheduling.plan_worker import InlinePlan, SimulatedPlan, ThreadPlan
from blendserve.scheduling.warmup import WarmupController, warmup_controller
from blendserve.sim import SimConfig, simulate
from conftest import record_admissions
from synthetic import synthetic_batch

COST = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
STATE = EngineState(running=0, waiting=0, kv_used_tokens=0, kv_total_tokens=450_000)


def _simulated_run(worker, kv: int = 200_000, quick: bool = True):  # type: ignore[no-untyped-def]
    """A blendserve warm-up run in the simulator (``quick``: with its quick plan, else fillers while the plan
    is made); the admissions in order, each checked against remaining()."""
    batch = synthetic_batch(1500, family_size=100, memory_heavy_fraction=0.2, seed=4)
    tree = build_prefix_tree(batch, COST)
    sampled = select_samples(batch, tree, rate=0.02, min_subtree=50, seed=0)
    controller = warmup_controller(batch, tree, sampled, COST, kv_capacity_tokens=kv, worker=worker)
    if not quick:
        controller.quick = None

    def exact(admitted: list[int]) -> None:  # or an engine would wait for requests that never come (vLLM raises)
        assert controller.remaining() == len(batch) - len(admitted)

    admitted = record_admissions(controller, exact)
    result = simulate(batch, batch.sim_output_tokens, COST, controller, SimConfig(kv_capacity_tokens=kv))
    return batch, controller, admitted, result


@pytest.mark.parametrize("quick", [True, False])
def test_the_run_goes_on_while_the_simulated_plan_is_made_and_nothing_runs_twice(quick, monkeypatch) -> None:
    monkeypatch.setattr(warmup, "REPLAN_AT", ())  # one plan: what ran while it was made is what is left to see
    _, inline, _, _ = _simulated_run(InlinePlan())
    monkeypatch.setattr(plan_worker, "PLAN_S_PER_SIM_STEP", 2e-4)  # a slow host: the plan takes a while
    batch, controller, admitted, _ = _simulated_run(SimulatedPlan(), quick=quick)
    assert sorted(admitted) == list(range(len(batch)))  # every request once: none twice, none lost
    assert inline.admitted_while_planning == 0 and inline._quick_list == "none"  # inline, the engine waited
    assert controller.worker.latency_s > 1 and controller.admitted_while_planning > 0
    assert controller._making is None and not controller._taken  # the plan landed and skipped all it had to
    assert controller._quick_list == ("landed" if quick else "none")
    if quick:  # the quick list took over at once: hardly a filler
        assert controller.unplanned <= inline.unplanned + 8
    else:  # the fillers went on
        assert controller.unplanned > inline.unplanned


def test_a_plan_slower_than_the_job_leaves_the_rest_to_its_quick_list_or_the_fillers(monkeypatch) -> None:
    monkeypatch.setattr(plan_worker, "PLAN_S_PER_SIM_STEP", 10.0)
    batch, controller, admitted, _ = _simulated_run(SimulatedPlan())
    assert sorted(admitted) == list(range(len(batch)))
    assert controller._quick_list == "landed" and controller._making is not None and controller.plan_seconds == 0
    batch, controller, admitted, _ = _simulated_run(SimulatedPlan(), quick=False)
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


class _Booking(StaticOrder):
    """A list that records what it hears finished, as a controller that books KV would free it."""

    def __init__(self, order) -> None:  # type: ignore[no-untyped-def]
        super().__init__(order)
        self.finished: list[int] = []

    def on_finish(self, index: int, output_tokens: int) -> None:
        self.finished.append(index)


class _SlowPlanner:
    """A ``RestPlanner`` whose plan waits for ``release`` (or fails with ``error``): the rest in index order."""

    def __init__(self, error: Exception | None = None) -> None:
        self.release = threading.Event()
        self.error = error
        self.lists_only: list[bool] = []

    def estimate(self, observed, running):  # type: ignore[no-untyped-def]
        return None

    def plan(self, rest, estimates, lists_only, policy=None, keep=None):  # type: ignore[no-untyped-def]
        if policy == "quick":  # at once, the rest from its last request back
            return StaticOrder(np.arange(len(rest))[::-1])
        self.release.wait(timeout=30)
        self.lists_only.append(lists_only)
        if self.error is not None:
            raise self.error
        return _Booking(np.arange(len(rest)))


def _threaded(planner: _SlowPlanner, quick: str | None = None) -> WarmupController:
    """Samples 0..2 (all finished), fillers 3..39 in reverse order, a thread making the plan."""
    controller = WarmupController(np.array([0, 1, 2]), np.arange(39, 2, -1), planner, np.full(40, 1000),
                                  worker=ThreadPlan(), quick=quick)
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
    controller.worker.join(timeout=30)
    rest = [controller.next_request(STATE) for _ in range(controller.remaining())]
    # the plan (index order over 3..39) past the five that ran while it was made
    assert rest == list(range(3, 35)) and controller.next_request(STATE) is None and controller.remaining() == 0
    assert planner.lists_only == [True]  # requests run while it is made: a list, never a booking controller
    # the five that ran meanwhile are finished as far as the plan goes (a controller that books KV frees them)
    assert controller.inner.finished == [39 - 3 - k for k in range(5)][::-1]
    assert controller.admitted_while_planning == 5 and controller.plan_seconds > 0


def test_the_quick_plan_runs_while_the_plan_is_made_and_the_plan_takes_over_past_it() -> None:
    planner = _SlowPlanner()
    controller = _threaded(planner, quick="quick")
    first = controller.next_request(STATE)  # the plan starts; the quick one is not back yet, or just back
    controller._quick_worker.join(timeout=30)
    meanwhile = [controller.next_request(STATE) for _ in range(4)]
    assert meanwhile == [39, 38, 37, 36] or first == 39  # the quick list: 3..39 from the back
    assert controller._quick_list == "landed" and controller._making is not None
    planner.release.set()
    controller.worker.join(timeout=30)
    rest = [controller.next_request(STATE) for _ in range(controller.remaining())]
    ran = [first, *meanwhile]
    assert rest == [i for i in range(3, 40) if i not in ran] and controller.next_request(STATE) is None
    assert sorted(ran + rest) == list(range(3, 40))  # every request once


def test_a_failed_plan_fails_the_run_where_the_engine_asks() -> None:
    planner = _SlowPlanner(error=ValueError("the cost model is broken"))
    controller = _threaded(planner)
    controller.next_request(STATE)
    planner.release.set()
    controller.worker.join(timeout=30)
    with pytest.raises(ValueError, match="cost model is broken"):
        controller.next_request(STATE)


def test_a_shard_plans_on_a_thread_beside_a_real_engine_and_on_the_clock_in_the_simulator() -> None:
    from blendserve.config import RunConfig
    from blendserve.pipeline.shard import plan_worker as shard_worker

    def config(engine: str) -> RunConfig:
        return RunConfig(run_id="r", input="in.jsonl", db="out.duckdb", engine=engine)

    assert isinstance(shard_worker(config("simulator")), SimulatedPlan)
    assert isinstance(shard_worker(config("vllm")), ThreadPlan)
