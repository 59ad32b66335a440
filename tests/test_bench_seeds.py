"""bench_seeds: blendserve and its baselines as shards over several seeds, and the spread of its speed-ups."""

from __future__ import annotations

from pathlib import Path

import pytest

from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.sim.simulator import SimConfig

BENCH = Path(__file__).resolve().parent.parent / "bench"
COST = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))


def test_each_seed_is_a_shard_of_its_own_and_fcfs_has_no_seed(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_seeds
    import tables
    from as_shard import planned, shard_warmup, simulate_as_shard
    from blendserve.sim.compare import true_outputs
    from common import hide_lengths
    from synthetic import synthetic_batch

    batch = synthetic_batch(900, mean_prompt=120, family_size=40, memory_heavy_fraction=0.3, seed=5)
    seeds = {str(s): bench_seeds.run_seed(batch, COST, SimConfig(), s) for s in (0, 1)}
    assert seeds["0"]["fcfs"]["time_s"] == seeds["1"]["fcfs"]["time_s"]  # the file's order, whatever the seed
    assert seeds["0"]["balance"]["time_s"] != seeds["1"]["balance"]["time_s"]  # another permutation

    # seed 1's blendserve is the shard a pipeline with seed 1 runs: its warm-up sample, its pick.
    hidden, _ = hide_lengths(batch)
    result, controller = simulate_as_shard(hidden, true_outputs(hidden), COST, SimConfig(), "blendserve",
                                           shard_warmup(hidden, COST, 1), 1)
    assert seeds["1"]["blendserve"] == {"time_s": result.total_time, "chosen": " → ".join(controller.choices)}
    assert controller.choices[-1] == planned(controller).choice.name  # the pick shows every plan's choice, last last
    assert len(controller.choices) == 1 + controller.replans
    assert seeds["1"]["fcfs"]["chosen"] is None

    ratios = {s: run["balance"]["time_s"] / run["blendserve"]["time_s"] for s, run in seeds.items()}
    summary = tables.seed_speedups(seeds)
    assert summary["balance"]["worst"] == pytest.approx(min(ratios.values()))
    assert summary["balance"]["median"] == pytest.approx(sum(ratios.values()) / 2)  # two seeds: their mean


def test_the_seeds_table_shows_every_seed_and_each_mixs_median_and_worst(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import tables
    from blendserve.scheduling import HIDDEN_LENGTHS_REVISION, PLANNER_REVISION

    prov = {"cpu": "c", "cores": 2, "python": "3", "numpy": "2", "commit": "abc", "uncommitted": [],
            "planner": PLANNER_REVISION, "date": "2026-12-04 04:00 UTC", "command": "bench_seeds.py"}

    def run(blend: float) -> dict:
        return {"fcfs": {"time_s": 100.0, "chosen": None}, "balance": {"time_s": 98.0, "chosen": None},
                "blendserve": {"time_s": blend, "chosen": "deadline-1"}, "provenance": prov}

    data = {"setup": "8B", "requests": 20_000, "lengths": "hidden",
            "mixes": {"rare-1": {"0": run(100.0), "1": run(90.0), "2": run(95.0)}}}
    text = tables.seeds_section(data)
    assert "| rare-1 | 0 | 100.0 | 98.0 | 100.0 | deadline-1 | 1.000x | 0.980x |" in text
    # over balance: 0.980, 1.089 and 1.032 -> median 1.032, worst 0.980; over fcfs: 1.000, 1.111, 1.053
    assert "| **rare-1** | median / worst |  |  |  |  | 1.053x / 1.000x | 1.032x / 0.980x |" in text
    assert "earlier planner revision" not in text
    data["mixes"]["rare-1"]["1"]["provenance"] = {**prov, "planner": HIDDEN_LENGTHS_REVISION - 1}
    assert "earlier planner revision than this checkout's" in tables.seeds_section(data)


def test_a_filler_trial_takes_the_stored_baselines_of_its_seed_and_says_when_one_is_missing(monkeypatch,
                                                                                              tmp_path) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import json

    import bench_seeds

    path = tmp_path / "seeds-8b.json"
    path.write_text(json.dumps({"mixes": {"rare-1": {
        "0": {"fcfs": {"time_s": 10.0}, "balance": {"time_s": 9.0}, "blendserve": {"time_s": 8.0}},
        "1": {"fcfs": {"time_s": 10.0}}}}}))
    assert bench_seeds.stored_baselines(path, "rare-1", 0) == {"fcfs": {"time_s": 10.0}, "balance": {"time_s": 9.0}}
    with pytest.raises(SystemExit, match="no balance run of rare-1 at seed 1"):
        bench_seeds.stored_baselines(path, "rare-1", 1)
    with pytest.raises(SystemExit, match="no fcfs, balance run of d0.9-s5 at seed 0"):
        bench_seeds.stored_baselines(path, "d0.9-s5", 0)
    with pytest.raises(SystemExit, match="no fcfs, balance run"):
        bench_seeds.stored_baselines(tmp_path / "missing.json", "rare-1", 0)


def test_a_replan_trial_sets_the_warmups_knobs_and_a_bare_run_leaves_them(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_seeds
    from blendserve.scheduling import warmup

    for name in ("FILLER_PIECE", "REPLAN_AT"):
        monkeypatch.setattr(warmup, name, getattr(warmup, name))  # restored after the test
    before = (warmup.FILLER_PIECE, warmup.REPLAN_AT)
    assert bench_seeds.start_trial() is False
    assert (warmup.FILLER_PIECE, warmup.REPLAN_AT) == before
    with pytest.raises(SystemExit, match="between 0 and 1"):
        bench_seeds.start_trial(replan_at=[1.5])
    assert bench_seeds.start_trial(replan_at=[0.6, 0.3]) is True
    assert (warmup.REPLAN_AT, warmup.FILLER_PIECE) == ((0.3, 0.6), before[0])
    assert bench_seeds.start_trial(replan_at=[]) is True and warmup.REPLAN_AT == ()  # planned once


def test_a_world_shuffles_only_the_long_answers_lengths_among_the_long_requests(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import numpy as np

    import bench_seeds

    outputs = np.array([5, 9000, 30, 12000, 7, 20000, 4096, 15000], dtype=np.int64)
    assert bench_seeds.shuffled_long(outputs, 0) is outputs  # the real world
    worlds = [bench_seeds.shuffled_long(outputs, w) for w in (1, 2, 3)]
    long = outputs > 4096
    for world in worlds:
        assert np.array_equal(world[~long], outputs[~long])  # short answers (4,096 is not long) stay
        assert sorted(world[long]) == sorted(outputs[long])  # the long lengths, shuffled among the long requests
    assert any(not np.array_equal(world, outputs) for world in worlds)
    assert np.array_equal(bench_seeds.shuffled_long(outputs, 2), worlds[1])  # a world is its seed's


def test_the_worlds_summary_is_each_policys_mean_and_the_worlds_blendserve_leads_in(monkeypatch, capsys) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_seeds

    def run(fcfs: float, balance: float, blend: float) -> dict:
        return {"fcfs": {"time_s": fcfs}, "balance": {"time_s": balance}, "blendserve": {"time_s": blend}}

    bench_seeds.print_worlds("rare-1", 0, {0: run(100.0, 98.0, 99.0), 1: run(100.0, 100.0, 94.0),
                                           2: run(103.0, 99.0, 96.0)})
    out = capsys.readouterr().out
    assert "the real world (0) and 2 with the long answers' lengths shuffled" in out
    assert "0.990" in out.splitlines()[3]  # world 0: balance 98 / blendserve 99
    # means 101.0, 99.0, 96.333: over fcfs 1.048, over balance 1.028; ahead of both in worlds 1 and 2
    assert out.rstrip().endswith("101.0        99.0        96.3     1.048     1.028   blendserve at or ahead of "
                                 "both in 2 of 3 worlds")


def test_the_real_world_is_the_seeds_own_run(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_seeds
    from synthetic import synthetic_batch

    batch = synthetic_batch(600, mean_prompt=120, family_size=40, memory_heavy_fraction=0.3, seed=3)
    assert bench_seeds.run_worlds(batch, COST, 1, 0) == {0: bench_seeds.run_seed(batch, COST, SimConfig(), 1)}


def test_the_orders_are_the_seeds_run_and_balance_at_further_seeds(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_seeds
    from as_shard import simulate_as_shard
    from blendserve.sim.compare import true_outputs
    from common import hide_lengths
    from synthetic import synthetic_batch

    batch = synthetic_batch(600, mean_prompt=120, family_size=40, memory_heavy_fraction=0.3, seed=3)
    runs, orders = bench_seeds.run_orders(batch, COST, 1, 3)
    assert runs == bench_seeds.run_seed(batch, COST, SimConfig(), 1)
    hidden, _ = hide_lengths(batch)
    third = simulate_as_shard(hidden, true_outputs(hidden), COST, SimConfig(), "balance", None,
                              bench_seeds.ORDER_SEEDS + 2)[0].total_time
    assert len(orders) == 3 and orders[2] == third
    assert len(set(orders)) == 3  # three permutations, three runs


def test_each_policy_is_placed_among_the_random_orders(monkeypatch, capsys) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_seeds

    runs = {"fcfs": {"time_s": 95.0}, "balance": {"time_s": 101.0}, "blendserve": {"time_s": 99.0}}
    bench_seeds.print_orders("d0.9-s5", 0, runs, [100.0, 98.0, 102.0, 97.0])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == ("d0.9-s5, seed 0: 4 more random orders (balance at seeds 1000-1003): median 99.0 s, "
                        "fastest 97.0, slowest 102.0 (5.2% apart)")
    assert lines[2].split() == ["fcfs", "95.0", "1.042", "4", "of", "4"]
    assert lines[3].split() == ["balance", "101.0", "0.980", "1", "of", "4"]
    assert lines[4].split() == ["blendserve", "99.0", "1.000", "2", "of", "4"]  # a tie is not faster
