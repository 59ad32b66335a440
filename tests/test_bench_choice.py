"""bench_choice: the choice a shard makes, each candidate's draws beside its time on the true lengths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.scheduling.admission import StaticOrder
from blendserve.sim.compare import true_outputs
from blendserve.sim.simulator import SimConfig, kv_capacity_tokens, simulate

BENCH = Path(__file__).resolve().parent.parent / "bench"
COST = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))


def fcfs_on_truth(batch, outputs: np.ndarray, rest: np.ndarray) -> float:  # type: ignore[no-untyped-def]
    """Seconds of the ``rest`` in its order on its true lengths, from an empty engine."""
    return simulate(batch.take(rest), outputs[rest], COST, StaticOrder(np.arange(len(rest))),
                    SimConfig(kv_capacity_tokens=kv_capacity_tokens(COST, SimConfig()))).total_time


def test_the_pick_and_its_draws_are_the_shards_and_the_truth_is_simulated_on_the_rest(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_choice
    from as_shard import planned, simulate_as_shard
    from common import hide_lengths
    from synthetic import synthetic_batch

    batch, _ = hide_lengths(synthetic_batch(900, mean_prompt=120, family_size=40, memory_heavy_fraction=0.3,
                                            seed=5))
    outputs = true_outputs(batch)
    config = SimConfig()
    point, when = bench_choice.run_to_plan(batch, outputs, COST, config)
    picked, times = bench_choice.candidate_times(point, outputs)

    # What a shard running blendserve chose, on the same warm-up: the same pick, the same draws. bench_choice
    # studies the first plan, so the shard here plans once (no re-plan to replace its choice).
    import blendserve.scheduling.warmup as warmup
    monkeypatch.setattr(warmup, "REPLAN_AT", ())
    _, controller = simulate_as_shard(batch, outputs, COST, config, "blendserve")
    made = planned(controller).choice
    assert picked == made.name
    assert {name: t["draws"] for name, t in times.items()} == {n: list(t) for n, t in made.scenario_s.items()}
    # Every request either started before the plan or is in the rest it planned.
    assert when["started"] + len(point.rest) == len(batch) and when["clock_s"] > 0
    # The truth column: the candidate's list run on the rest's true lengths (fcfs: the rest in its order).
    assert times["fcfs"]["truth"] == pytest.approx(fcfs_on_truth(batch, outputs, point.rest))
    assert any(t["truth"] != t["means"] for t in times.values())

    # choice_rules scores the same rule offline from the stored draws: it names the shard's pick.
    import choice_rules
    assert choice_rules.RULES[choice_rules.MAIN_RULE](times) == picked
    fastest = min(times, key=lambda n: times[n]["truth"])
    assert choice_rules.regret(lambda _: fastest, times) == 1.0
    assert all(choice_rules.regret(rule, times) >= 1.0 for rule in choice_rules.RULES.values())


def test_plans_that_know_more_are_timed_on_the_truth_and_the_truths_plan_picks_its_fastest(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_choice
    import bench_information as info
    from common import hide_lengths
    from synthetic import synthetic_batch

    means, truth = np.array([10, 10, 8_000, 8_000]), np.array([3, 40, 5_000, 20_000])
    assert info.informed(means, truth, "estimates") is means
    assert info.informed(means, truth, "long-level").tolist() == [10, 10, 12_500, 12_500]
    assert info.informed(means, truth, "long").tolist() == [10, 10, 5_000, 20_000]
    assert info.informed(means, truth, "truth").tolist() == truth.tolist()
    with pytest.raises(ValueError, match="unknown knowledge"):
        info.informed(means, truth, "everything")

    batch, _ = hide_lengths(synthetic_batch(900, mean_prompt=120, family_size=40, memory_heavy_fraction=0.3,
                                            seed=5))
    outputs = true_outputs(batch)
    point, _ = bench_choice.run_to_plan(batch, outputs, COST, SimConfig())
    rest_truth = np.maximum(outputs[point.rest], 1)
    picked, on_truth = info.informed_times(point, rest_truth, "truth")
    assert picked == min(on_truth, key=on_truth.get)
    _, on_estimates = info.informed_times(point, rest_truth, "estimates")
    # fcfs is the rest in its order whatever the estimates: the same run on the truth in both columns.
    assert on_estimates["fcfs"] == pytest.approx(on_truth["fcfs"])
    assert on_estimates["fcfs"] == pytest.approx(fcfs_on_truth(batch, outputs, point.rest))
