"""``blendserve calibrate`` and ``--hardware auto``: the fit, the stored profile, its resolution, the replay."""

from __future__ import annotations

import json
import logging

import duckdb
import numpy as np
import pytest

from blendserve.calibrate import DEFAULT_GRID, TEST_GRID, grid_batch
from blendserve.cli import main
from blendserve.config import RunConfig
from blendserve.costmodel import CostModel, get_model
from blendserve.costmodel.fit import Measured, device, fit_hardware, simulated_seconds
from blendserve.costmodel.profiles import profiles_dir
from blendserve.pipeline.plan import cost_model_for
from blendserve.sim import SimConfig

from conftest import FIXTURES

GRID = [cell._replace(n=cell.n or 64) for cell in DEFAULT_GRID]


@pytest.mark.parametrize("overlap", ["max", "sum"])
def test_fit_recovers_the_constants_the_simulator_ran_on(overlap: str) -> None:
    """The simulator as the engine (deterministic): the fit finds the F, B, overhead and f it used."""
    model = get_model("smollm2-135m")
    sim = SimConfig(token_budget=4096, max_running=64, kv_capacity_tokens=40_000, block_size=128,
                    attention_flops=True)  # as calibrate fits vLLM-CPU
    truth = device("truth", model, np.array([4e-5, 0.09, 0.03]), overlap, 0.0, sim)
    runs = [Measured(grid_batch(n, p, d, model.vocab_size, seed, shared), np.full(n, d), 0.0)
            for seed, (n, p, d, shared) in enumerate(GRID)]
    for run, seconds in zip(runs, simulated_seconds(runs, CostModel(model, truth), sim)):
        run.seconds = float(seconds)
    fit = fit_hardware(runs, model, sim, "fitted")
    assert fit.hardware.overlap == overlap
    assert fit.hardware.flops == pytest.approx(truth.flops, rel=0.02)
    assert fit.hardware.bandwidth == pytest.approx(truth.bandwidth, rel=0.02)
    assert fit.hardware.step_overhead == pytest.approx(truth.step_overhead, rel=0.02)
    assert fit.median_error < 1e-3
    assert fit.hardware.block_size == 128 and fit.hardware.attention_flops  # kept for the runs it costs


def test_a_shared_cell_shares_exactly_its_prefix() -> None:
    batch = grid_batch(8, 768, 1, 49152, seed=3, shared=512)
    prompts = np.stack([batch.prompt(i) for i in range(8)])
    assert (prompts[:, :512] == prompts[0, :512]).all()
    assert len(set(prompts[:, 512].tolist())) == 8  # no two prompts go on alike


def test_catalog_gpus_keep_no_overhead_and_max_overlap() -> None:
    from blendserve.costmodel import HARDWARE

    assert all(hw.step_overhead == 0.0 and hw.overlap == "max" for hw in HARDWARE.values())


def test_calibrate_on_vllm_then_auto_costs_runs_and_replays_them(tmp_path, monkeypatch, caplog, model_dir) -> None:
    """Calibrate vLLM-CPU (a test-sized grid), resolve ``auto`` to it, run the CLI, find the replay in the report."""
    monkeypatch.setenv("BLENDSERVE_PROFILES", str(tmp_path / "profiles"))
    caplog.set_level(logging.INFO)
    assert main(["calibrate", "--grid", "test", "--json"]) == 0
    stored = list(profiles_dir().glob("calibrated-vllm-*.json"))
    assert len(stored) == 1
    profile = json.loads(stored[0].read_text())
    assert len(profile["batches"]) == len(TEST_GRID) and profile["hardware"]["step_overhead"] >= 0
    assert profile["key"]["host"] and profile["key"]["model"]["weights"]
    assert profile["hardware"]["block_size"] == 128  # vLLM-CPU's KV block: the replay counts hits in it
    fitted = stored[0].stat().st_mtime_ns
    assert main(["calibrate", "--grid", "test", "--if-missing"]) == 0  # make demo's: once per machine and settings
    assert stored[0].stat().st_mtime_ns == fitted

    settings = dict(input="x", db=str(tmp_path / "x.duckdb"), engine="vllm")  # the CLI's defaults otherwise
    cost = cost_model_for(RunConfig(run_id="auto", **settings))
    assert cost.hardware.name == profile["name"] and cost.hardware.flops > 0
    assert f"costed on calibrated profile {profile['name']}" in caplog.text
    caplog.clear()
    other = cost_model_for(RunConfig(run_id="other", max_num_seqs=7, **settings))  # another key: not calibrated
    assert other.hardware.name == "a100-80g"
    assert "blendserve calibrate --engine vllm" in caplog.text and "WARNING" in caplog.text

    db = tmp_path / "run.duckdb"
    assert main(["run", "--input", str(FIXTURES / "mini.jsonl"), "--engine", "vllm", "--db", str(db),
                 "--run-id", "calib", "--json"]) == 0
    with duckdb.connect(str(db), read_only=True) as con:
        metrics = dict(con.execute("SELECT name, value FROM metrics WHERE run_id = 'calib'").fetchall())
        (config_json,) = con.execute("SELECT config_json FROM runs WHERE run_id = 'calib'").fetchone()
    assert json.loads(config_json)["hardware"] == profile["name"]  # the run records the resolved profile
    assert metrics["replay_seconds"] > 0 and metrics["replay_measured_seconds"] > 0
    text = "\n".join(p.read_text() for p in db.parent.rglob("*.md"))
    assert "Replay on the calibrated profile" in text and profile["name"] in text


@pytest.mark.parametrize("overlap", ["max", "sum"])
def test_t_opt_with_step_overhead_stays_below_every_simulated_batch(overlap: str) -> None:
    from blendserve.costmodel import batch_t_opt
    from blendserve.scheduling.admission import StaticOrder
    from blendserve.sim import simulate

    model = get_model("smollm2-135m")
    cost = CostModel(model, device("cpu", model, np.array([1e-3, 0.1, 0.085]), overlap, 0.0,
                                        SimConfig(token_budget=512)))
    sim = SimConfig(max_running=16, kv_capacity_tokens=20_000)  # the device's own budget and f
    for seed, (n, p, d, shared) in enumerate(GRID):
        batch, outputs = grid_batch(n, p, d, model.vocab_size, seed, shared), np.full(n, d)
        result = simulate(batch, outputs, cost, StaticOrder(np.arange(n)), sim)
        optimum = batch_t_opt(cost, batch, outputs, overlap, sim.kv_capacity_tokens)
        assert result.token_budget == 512 and optimum.time <= result.total_time * (1 + 1e-12)
        assert optimum.time >= optimum.min_steps * 0.085
