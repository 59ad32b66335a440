"""Every shipped query in sql/queries/ runs on a real run's DuckDB, and its totals match the tables."""

from __future__ import annotations

import json

import duckdb
import pytest

from conftest import FIXTURES, REPO

QUERIES = sorted((REPO / "sql" / "queries").glob("*.sql"))
RUNS = ("sql-a", "sql-b")  # two runs in one file: a query that mixes runs or rows inflates its totals


@pytest.fixture(scope="module")
def db(tmp_path_factory, model_dir):
    """Two simulator runs of the mini fixture plus two bad rows, on two shards, in one DuckDB file."""
    from blendserve.config import RunConfig
    from blendserve.pipeline.steps import run_pipeline

    folder = tmp_path_factory.mktemp("sql")
    data = folder / "in.jsonl"
    bad = [json.dumps({"custom_id": "no-prompt"}), "{not json"]
    data.write_text((FIXTURES / "mini.jsonl").read_text() + "\n".join(bad) + "\n")
    path = folder / "runs.duckdb"
    for run_id in RUNS:
        run_pipeline(RunConfig(run_id=run_id, input=str(data), db=str(path), engine="simulator", shards=2,
                               max_model_len=2048, part_rows=4))
    return path


def run_query(db, name: str) -> list[dict]:
    with duckdb.connect(str(db), read_only=True) as con:
        cursor = con.execute((REPO / "sql" / "queries" / name).read_text())
        columns = [d[0] for d in cursor.description]
        return [dict(zip(columns, row)) for row in cursor.fetchall()]


def table_value(db, sql: str, *args):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, list(args)).fetchone()[0]


@pytest.mark.parametrize("path", QUERIES, ids=[p.name for p in QUERIES])
def test_every_shipped_query_runs_and_returns_rows(db, path):
    assert run_query(db, path.name)


def test_the_runs_have_one_output_per_accepted_request(db):
    for run_id in RUNS:
        requests = table_value(db, "SELECT count(*) FROM requests WHERE run_id = ?", run_id)
        outputs = table_value(db, "SELECT count(DISTINCT request_id) FROM outputs WHERE run_id = ?", run_id)
        assert requests == outputs == 28


def test_throughput_per_run_counts_each_output_once(db):
    rows = {r["run_id"]: r for r in run_query(db, "throughput_per_run.sql")}
    assert set(rows) == set(RUNS)
    for run_id, row in rows.items():
        assert row["outputs"] == table_value(db, "SELECT count(*) FROM requests WHERE run_id = ?", run_id)
        assert row["input_tokens"] == table_value(db, "SELECT sum(num_prompt_tokens) FROM outputs WHERE run_id = ?", run_id)
        assert row["output_tokens"] == table_value(db, "SELECT sum(num_output_tokens) FROM outputs WHERE run_id = ?", run_id)
        assert row["wall_seconds"] == table_value(
            db, "SELECT value FROM metrics WHERE run_id = ? AND name = 'wall_seconds'", run_id)
        assert row["tokens_per_second"] == pytest.approx((row["input_tokens"] + row["output_tokens"]) / row["wall_seconds"])


def test_error_reasons_count_every_reject_and_engine_error_once(db):
    rows = run_query(db, "error_reasons.sql")
    for run_id in RUNS:
        rejected = sum(r["requests"] for r in rows if r["run_id"] == run_id and r["stage"] == "rejected at ingest")
        failed = sum(r["requests"] for r in rows if r["run_id"] == run_id and r["stage"] == "failed in the engine")
        assert rejected == table_value(db, "SELECT count(*) FROM rejects WHERE run_id = ?", run_id) == 2
        assert failed == table_value(db, "SELECT count(*) FROM outputs WHERE run_id = ? AND status = 'error'", run_id)


def test_output_length_by_task_covers_every_output_once(db):
    rows = run_query(db, "output_length_by_task.sql")
    for run_id in RUNS:
        mine = [r for r in rows if r["run_id"] == run_id]
        assert sum(r["requests"] for r in mine) == 28
        total = sum(r["mean_output_tokens"] * r["requests"] for r in mine)
        assert total == pytest.approx(table_value(db, "SELECT sum(num_output_tokens) FROM outputs WHERE run_id = ?", run_id))


def test_prefix_sharing_sums_to_the_outputs_tokens(db):
    rows = run_query(db, "prefix_sharing.sql")
    for run_id in RUNS:
        mine = [r for r in rows if r["run_id"] == run_id]
        assert {r["shard"] for r in mine} == {0, 1}
        assert sum(r["prompt_tokens"] for r in mine) == table_value(
            db, "SELECT sum(num_prompt_tokens) FROM outputs WHERE run_id = ? AND status = 'ok'", run_id)
        assert sum(r["cached_tokens"] or 0 for r in mine) == table_value(  # NULL: an engine that does not report it
            db, "SELECT coalesce(sum(num_cached_tokens), 0) FROM outputs WHERE run_id = ? AND status = 'ok'", run_id)


def test_estimate_error_has_one_pair_per_answered_request(db):
    rows = run_query(db, "estimate_error.sql")
    for run_id in RUNS:
        overall = [r for r in rows if r["run_id"] == run_id and r["kind"] is None]
        per_kind = [r for r in rows if r["run_id"] == run_id and r["kind"] is not None]
        expected = table_value(db, """SELECT count(*) FROM plan p JOIN outputs o USING (run_id, request_id)
                                      WHERE p.run_id = ? AND o.status = 'ok' AND p.shard >= 0""", run_id)
        assert len(overall) == 1 and overall[0]["requests"] == sum(r["requests"] for r in per_kind) == expected
