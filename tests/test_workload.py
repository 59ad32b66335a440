"""Workload builder and the simulate/workload commands, on the real data in ../shared/data."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from blendserve.batch import UNKNOWN, RequestBatch
from blendserve.cli import main
from blendserve.costmodel import CostModel, get_hardware, get_model, unique_prompt_tokens
from blendserve.model_prep import REPO_ROOT
from blendserve.workload import WORKLOAD_SCHEMA, WorkloadSpec, build_workload

DATA = REPO_ROOT.parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} (the shared data sets) is absent")
COST = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))


@pytest.fixture(scope="module")
def mix(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("wl") / "mix.parquet"
    report = build_workload(WorkloadSpec(4000, density=1.4, sharing=0.35, seed=7, name="t"), path, COST, DATA)
    return path, report


def test_mix_meets_targets_and_the_report_matches_the_file(mix) -> None:
    path, report = mix
    assert report.density == pytest.approx(1.4, rel=0.15)
    assert report.sharing == pytest.approx(0.35, abs=0.03)
    assert all(report.counts[s] > 0 for s in ("api", "mmlu", "video"))
    batch = RequestBatch.from_parquet(path)
    assert len(batch) == 4000 and int(batch.prompt_lens.sum()) == report.input_tokens
    exact_unique = unique_prompt_tokens(batch)
    assert exact_unique == pytest.approx(report.unique_prompt_tokens, rel=0.01)
    assert "SmolLM2" in report.tokenizer


def test_file_has_the_request_schema_and_sources(mix) -> None:
    path, _ = mix
    table = pq.read_table(path)
    assert table.schema.equals(WORKLOAD_SCHEMA)
    rows = table.to_pylist()
    sources = {json.loads(r["metadata_json"])["source"] for r in rows}
    assert sources == {"api", "mmlu", "video"}
    for r in rows[:500]:
        source = json.loads(r["metadata_json"])["source"]
        assert r["custom_id"] == r["request_id"] and r["endpoint"] == "tokens" and r["prompt"] is None
        assert (r["expected_output_tokens"] is not None) == (source == "video")  # only video lengths are known
        assert r["sim_output_tokens"] >= 1 and r["num_prompt_tokens"] == len(r["prompt_token_ids"])
        assert (DATA / r["source_file"]).exists() and r["source_row"] >= 1


def test_builds_are_seeded_and_reproducible(tmp_path) -> None:
    spec = WorkloadSpec(500, only="api", seed=3)
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    build_workload(spec, a, COST, DATA)
    build_workload(spec, b, COST, DATA)
    assert pq.read_table(a).equals(pq.read_table(b))
    other = tmp_path / "c.parquet"
    build_workload(WorkloadSpec(500, only="api", seed=4), other, COST, DATA)
    assert not pq.read_table(a).equals(pq.read_table(other))


def test_video_lengths_average_about_16k(tmp_path) -> None:
    path = tmp_path / "v.parquet"
    build_workload(WorkloadSpec(3000, only="video"), path, COST, DATA)
    batch = RequestBatch.from_parquet(path)
    assert batch.sim_output_tokens.mean() == pytest.approx(16_000, rel=0.05)
    assert (batch.expected_output_tokens == batch.sim_output_tokens).all() and (batch.expected_output_tokens != UNKNOWN).all()


def test_simulate_command_prints_every_policy(mix, capsys) -> None:
    path, _ = mix
    assert main(["simulate", "--input", str(path), "--policy", "fcfs,balance", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["policy"]: r for r in report["policies"]}
    assert set(rows) == {"fcfs", "balance"}
    for row in rows.values():
        assert 0 < row["fraction_of_optimum"] <= 1 and row["throughput"] > 0
    assert rows["fcfs"]["prefix_hit_ratio"] > 0.1  # the mix shares 35% of its prompt tokens
