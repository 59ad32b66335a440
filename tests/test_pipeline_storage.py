"""The whole pipeline with its run folder (and inputs) in object storage: fsspec's memory://
store stands in for s3:// or gs://, and the simulator engine for the model. Local paths stay
the default and stay plain files."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from upath import UPath

from blendserve import files
from blendserve.config import RunConfig
from blendserve.pipeline import parts
from blendserve.pipeline.steps import InjectedFault, infer_shard, ingest_step, load_step, plan_step, run_pipeline

from conftest import FIXTURES

MINI_REQUESTS = 28  # accepted requests in tests/fixtures/mini.jsonl


def output_ids(db: str, run_id: str) -> list[str]:
    with duckdb.connect(db, read_only=True) as con:
        return [r[0] for r in con.execute("SELECT request_id FROM outputs WHERE run_id = ?", [run_id]).fetchall()]


def stored(bucket: str) -> list[str]:
    """Every object under the bucket, relative to it."""
    root = bucket.removeprefix("memory://")
    return sorted(p.split(root + "/", 1)[1] for p in MemoryFileSystem().find(root))


def upload_input(bucket: str) -> str:
    files.atomic_write_bytes((FIXTURES / "mini.jsonl").read_bytes(), f"{bucket}/in/mini.jsonl")
    return f"{bucket}/in/*.jsonl"


def test_run_with_url_input_and_work_dir_lands_one_output_per_request(make_config, bucket, tmp_path):
    config = make_config(engine="simulator", input=upload_input(bucket), work_dir=f"{bucket}/runs/r1",
                         shards=2, sample_rate=0.1, run_id="r1")
    assert isinstance(config.run_dir, UPath)
    summary = run_pipeline(config)
    ids = output_ids(config.db, config.run_id)
    assert len(ids) == len(set(ids)) == summary["requests"] == MINI_REQUESTS

    objects = stored(bucket)
    shard_parts = [o for o in objects if o.startswith("runs/r1/parts/shard-")]
    assert {"runs/r1/requests.parquet", "runs/r1/rejects.parquet", "runs/r1/plan.parquet"} <= set(objects)
    assert {o.rsplit("/", 1)[1] for o in shard_parts} >= {"part-00000.parquet", "stats.json", "timeline.parquet"}
    assert {o for o in objects if o.endswith("/estimates.parquet")} == {
        f"runs/r1/parts/shard-{k:05d}/estimates.parquet" for k in (0, 1)}  # each shard's warm-up
    committed = [o for o in objects if o.rsplit("/", 1)[1].startswith("part-")]
    assert files.read_parquet([f"{bucket}/{o}" for o in committed]).num_rows == MINI_REQUESTS
    assert not (tmp_path / "runs").exists()  # nothing of the run folder went to local disk
    with duckdb.connect(config.db, read_only=True) as con:
        source = con.execute("SELECT DISTINCT source_file FROM requests").fetchall()
    assert source == [(f"{bucket}/in/mini.jsonl",)]


def test_retried_shard_with_url_work_dir_resumes_without_duplicates(make_config, bucket):
    config = make_config(engine="simulator", run_id="crash", work_dir=f"{bucket}/runs/crash", shards=2,
                         part_rows=4, fail_after_rows=9, policy="fcfs", sample_rate=0)
    ingest_step(config)
    plan_step(config)
    with pytest.raises(InjectedFault):
        infer_shard(config, 0)
    assert len(parts.committed_lengths(config.shard_dir(0))) == 8  # two whole parts; the rest never committed

    config.fail_after_rows = -1
    assert infer_shard(config, 0)["served"] == MINI_REQUESTS // 2 - 8
    infer_shard(config, 1)
    load_step(config)
    ids = output_ids(config.db, config.run_id)
    assert len(ids) == len(set(ids)) == MINI_REQUESTS
    every_part = files.list_parts(config.parts_dir, f"*/{parts.PART_GLOB}")
    assert files.read_parquet(every_part).num_rows == MINI_REQUESTS  # no result committed twice


def test_work_dir_through_an_airflow_connection(make_config, bucket, airflow_memory_fs):
    from airflow.sdk import ObjectStoragePath

    config = make_config(engine="simulator", work_dir=f"{bucket}/runs/r2", storage_conn_id="my_store",
                         run_id="r2", sample_rate=0, explain=False)
    assert isinstance(config.run_dir, ObjectStoragePath) and config.run_dir.conn_id == "my_store"
    run_pipeline(config)
    assert len(set(output_ids(config.db, config.run_id))) == MINI_REQUESTS
    assert "runs/r2/parts/shard-00000/part-00000.parquet" in stored(bucket)


def test_local_default_stays_plain_files_beside_the_db(make_config, tmp_path):
    config = make_config(engine="simulator", run_id="local", sample_rate=0, explain=False)
    assert type(config.run_dir) is type(Path()) and config.run_dir == tmp_path / "runs" / "local"
    assert type(config.shard_dir(0)) is type(Path())
    run_pipeline(config)
    assert len(set(output_ids(config.db, config.run_id))) == MINI_REQUESTS
    written = sorted(p.relative_to(config.run_dir).as_posix() for p in config.run_dir.rglob("*") if p.is_file())
    assert {"requests.parquet", "rejects.parquet", "plan.parquet", "parts/shard-00000/part-00000.parquet",
            "parts/shard-00000/stats.json", "parts/shard-00000/admitted.parquet"} <= set(written)
    assert not [f for f in written if f.endswith(".tmp")]  # staged files were renamed, none left over
    assert json.loads((config.shard_dir(0) / "stats.json").read_text())["served"] == MINI_REQUESTS


def test_duckdb_file_must_be_local():
    with pytest.raises(ValueError, match="db must be a local file"):
        RunConfig(run_id="r", input="in.jsonl", db="s3://bucket/out.duckdb")
