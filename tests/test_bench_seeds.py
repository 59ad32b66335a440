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
    assert seeds["1"]["blendserve"] == {"time_s": result.total_time, "chosen": planned(controller).choice.name}
    assert seeds["1"]["fcfs"]["chosen"] is None

    ratios = {s: run["balance"]["time_s"] / run["blendserve"]["time_s"] for s, run in seeds.items()}
    summary = bench_seeds.speedups(seeds)
    assert summary["balance"]["worst"] == pytest.approx(min(ratios.values()))
    assert summary["balance"]["median"] == pytest.approx(sum(ratios.values()) / 2)  # two seeds: their mean
