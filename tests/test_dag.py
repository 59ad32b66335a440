"""The Airflow DAG: parses fast without heavy imports, and runs end to end with dag.test()."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import duckdb
import numpy as np
import pytest

from conftest import FIXTURES, REPO

DAG_FILES = sorted((REPO / "dags").glob("*.py"))


def test_dagbag_has_no_import_errors():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    assert "blendserve_batch" in bag.dags


@pytest.mark.parametrize("path", DAG_FILES, ids=[p.name for p in DAG_FILES])
def test_dag_file_parses_fast_without_heavy_imports(path):
    code = (
        "import sys, time, runpy; import airflow.sdk\n"
        # CPU seconds, not wall: a machine busy with other jobs must not fail a parse that does little work
        "t = time.process_time(); runpy.run_path(sys.argv[1]); dt = time.process_time() - t\n"
        "heavy = [m for m in ('vllm', 'torch', 'great_expectations', 'transformers', 'duckdb', 'pyarrow')\n"
        "         if m in sys.modules]\n"
        "print(dt, ','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    seconds, *rest = out.stdout.strip().splitlines()[-1].split(" ")
    heavy = rest[0] if rest else ""
    assert float(seconds) < 1.0
    assert heavy == "", f"{path.name} imports {heavy} at parse time"


def batch_dag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags")).dags["blendserve_batch"]


@pytest.fixture
def roots(tmp_path, monkeypatch):
    monkeypatch.setenv("BLENDSERVE_DATA_ROOTS", f"{FIXTURES}{os.pathsep}{tmp_path}")


@pytest.mark.engine
def test_dag_runs_end_to_end_and_failed_shards_resume_on_retry(airflow_db, roots, tmp_path):
    db = tmp_path / "dag.duckdb"
    # each shard's first try dies after 5 results (4 committed in one part): the retry must resume
    conf = {"input": str(FIXTURES / "dag50.jsonl"), "db": str(db), "shards": 2, "kv_cache_gb": 0.5,
            "fail_after_rows": 5}
    run = batch_dag().test(run_conf=conf)
    assert run.state == "success"
    tries = {(ti.task_id, ti.map_index): ti.try_number for ti in run.get_task_instances()}
    assert tries[("infer", 0)] == tries[("infer", 1)] == 2
    report = next(ti for ti in run.get_task_instances() if ti.task_id == "report")
    assert report.state == "success"
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT request_id, shard FROM outputs").fetchall()
        status = con.execute("SELECT status FROM runs").fetchall()
        checks = con.execute("SELECT stage, bool_and(success), count(*) FROM validation_results GROUP BY stage").fetchall()
    assert len(rows) == len({r[0] for r in rows}) == 50
    assert {r[1] for r in rows} == {0, 1}  # every answer, the warm-up samples' too, comes from a shard
    assert status == [("finished",)]
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT policy FROM runs").fetchall() == [("blendserve",)]  # the default
    assert {stage: ok for stage, ok, _ in checks} == {"input": True, "input_counts": True, "outputs": True}

    from blendserve.export import export_openai

    run_id = con_run_id(db)
    report = export_openai(db, run_id, tmp_path / "exports")
    lines = [json.loads(line) for line in open(report.output_path)]
    assert report.outputs == len(lines) == 50 and report.errors == 0
    chat = next(line for line in lines if line["custom_id"].startswith("video"))
    body = chat["response"]["body"]
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]


def con_run_id(db) -> str:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT run_id FROM runs").fetchone()[0]


@pytest.mark.parametrize("field,value", [("input", "../../etc/passwd"), ("db", "/etc/blendserve.duckdb")])
def test_paths_outside_the_data_roots_fail_the_first_task(airflow_db, roots, tmp_path, field, value):
    conf = {"input": str(FIXTURES / "mini.jsonl"), "db": str(tmp_path / "x.duckdb"), field: value}
    run = batch_dag().test(run_conf=conf)
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == "failed"
    assert states["ingest"] == "failed" and states["plan"] == "upstream_failed"
    assert not (tmp_path / "x.duckdb").exists()


def write_token_requests(path, n: int, seed: int = 0) -> None:
    """``n`` token-id requests in prefix families, half short answers and half long, with true lengths."""
    from synthetic import synthetic_batch

    batch = synthetic_batch(n, mean_prompt=60, family_size=100, seed=seed)
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(n):
            long = batch.expected_output_tokens[i] >= 0
            record = {"custom_id": f"r{i}", "prompt_token_ids": (batch.prompt(i) % 49_000).tolist(),
                      "max_tokens": 512, "sim_output_tokens": int(rng.integers(200, 512) if long else rng.integers(1, 8))}
            f.write(json.dumps(record) + "\n")


def test_dag_with_the_simulator_engine_runs_ten_thousand_requests_on_four_shards(airflow_db, roots, tmp_path):
    write_token_requests(tmp_path / "big.jsonl", 10_000)
    db = tmp_path / "sim.duckdb"
    started = time.monotonic()
    run = batch_dag().test(run_conf={"input": str(tmp_path / "big.jsonl"), "db": str(db), "engine": "simulator",
                                     "shards": 4})
    print(f"dag.test with the simulator: 10,000 requests, 4 shards, {time.monotonic() - started:.1f} s")
    assert run.state == "success"
    with duckdb.connect(str(db), read_only=True) as con:
        per_shard = dict(con.execute("SELECT shard, count(*) FROM outputs GROUP BY shard").fetchall())
        unique = con.execute("SELECT count(DISTINCT request_id) FROM outputs").fetchone()[0]
    assert unique == sum(per_shard.values()) == 10_000
    assert set(per_shard) - {-1} == {0, 1, 2, 3}
    assert max(per_shard[s] for s in range(4)) < 2 * min(per_shard[s] for s in range(4))  # balanced by time, roughly by count


def test_dag_keeps_run_folders_in_object_storage(airflow_db, tmp_path, bucket, monkeypatch):
    from fsspec.implementations.memory import MemoryFileSystem

    from blendserve import files

    monkeypatch.setenv("BLENDSERVE_DATA_ROOTS", f"{tmp_path}{os.pathsep}{bucket}")
    files.atomic_write_bytes((FIXTURES / "mini.jsonl").read_bytes(), f"{bucket}/in/mini.jsonl")
    db = tmp_path / "shared.duckdb"
    run = batch_dag().test(run_conf={"input": f"{bucket}/in/*.jsonl", "db": str(db), "engine": "simulator",
                                     "shards": 2, "runs_dir": f"{bucket}/runs/"})
    assert run.state == "success"
    with duckdb.connect(str(db), read_only=True) as con:
        ids = [r[0] for r in con.execute("SELECT request_id FROM outputs").fetchall()]
    assert len(ids) == len(set(ids)) == 28
    objects = MemoryFileSystem().find(bucket.removeprefix("memory://"))
    assert {o.rsplit("/parts/", 1)[1].split("/")[0] for o in objects if "/parts/" in o} >= {"shard-00000", "shard-00001"}
    assert not (tmp_path / "runs").exists()
