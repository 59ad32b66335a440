"""Everything a run report shows, read from DuckDB alone (so a report rebuilds from the file)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pandas as pd

from blendserve.pipeline import database


@dataclass
class RunData:
    run_id: str  # the run the report is about
    db: Path  # the DuckDB file it was read from
    run: dict  # the runs row (engine, policy, status, started_at, finished_at, input)
    config: dict  # the RunConfig the run started with (runs.config_json)
    metrics: dict[str, float]  # metrics table: wall_seconds, tokens_per_second, prefix_hit_rate, predicted_*, ...
    totals: dict  # outputs: requests, errors, prompt, cached and output tokens
    shards: pd.DataFrame  # per shard (-1 = the warm-up task of runs before 2026-11-29): requests, tokens, cached tokens, seconds
    # answered requests per (estimate the plan used, actual, estimate source, subtree): DuckDB aggregates, so a
    # million requests come back as the few thousand distinct rows a figure and a table need
    lengths: pd.DataFrame
    timeline: pd.DataFrame  # engine_timeline rows of the run (None values stay NaN)
    reasons: pd.DataFrame  # rejects and engine errors: stage, reason, requests
    validation: pd.DataFrame  # validation_results rows
    has_samples: bool  # the warm-up sample gave estimates (samples table not empty)


def load_run(db: str | Path, run_id: str) -> RunData:
    with database.connect(db, read_only=True) as con:  # waits while a writer holds the file
        # timestamps as text: fetching TIMESTAMPTZ into Python needs pytz, which the stack does not ship
        cursor = con.execute("""SELECT config_json, input, engine, policy, status, started_at::VARCHAR AS started_at,
                                       finished_at::VARCHAR AS finished_at FROM runs WHERE run_id = ?""", [run_id])
        row = cursor.fetchone()
        if row is None:
            raise KeyError(f"run {run_id!r} is not in {db}")
        run = dict(zip([d[0] for d in cursor.description], row))
        metrics = dict(con.execute("SELECT name, value FROM metrics WHERE run_id = ?", [run_id]).fetchall())
        has_samples = con.execute("SELECT count(*) FROM samples WHERE run_id = ?", [run_id]).fetchone()[0] > 0
        return RunData(
            run_id=run_id, db=Path(db), run=run, config=json.loads(run.pop("config_json")), metrics=metrics,
            totals=_totals(con, run_id), shards=_shards(con, run_id), lengths=_lengths(con, run_id),
            timeline=con.execute("SELECT * EXCLUDE (run_id) FROM engine_timeline WHERE run_id = ? ORDER BY shard, t",
                                 [run_id]).df(),
            reasons=_reasons(con, run_id),
            validation=con.execute(
                """SELECT stage, expectation, column_name, success, observed, unexpected FROM validation_results
                   WHERE run_id = ? ORDER BY stage, expectation, column_name""", [run_id]).df(),
            has_samples=has_samples,
        )


def _totals(con: duckdb.DuckDBPyConnection, run_id: str) -> dict:
    cursor = con.execute(
        """SELECT count(*) AS requests, count(*) FILTER (status = 'error') AS errors,
                  coalesce(sum(num_prompt_tokens), 0) AS prompt_tokens,
                  sum(num_cached_tokens) AS cached_tokens,  -- NULL when no engine row reported cache hits
                  coalesce(sum(num_output_tokens), 0) AS output_tokens,
                  (SELECT count(*) FROM rejects WHERE run_id = $1) AS rejected
           FROM outputs WHERE run_id = $1""", [run_id])
    return dict(zip([d[0] for d in cursor.description], cursor.fetchone()))


def _shards(con: duckdb.DuckDBPyConnection, run_id: str) -> pd.DataFrame:
    """Per shard: counts from outputs, seconds from the engine timeline (last interval's end).

    Duplicates fanned out at load carry their twin's shard, so only requests the
    shard ran itself (answered_by = request_id) are counted.
    """
    return con.execute(
        """WITH ran AS (
               SELECT o.* FROM outputs o LEFT JOIN plan p USING (run_id, request_id)
               WHERE o.run_id = $1 AND coalesce(p.answered_by, o.request_id) = o.request_id),
           t AS (SELECT shard, max(t) AS seconds, sum(prefix_queries) AS prefix_queries,
                        sum(prefix_hits) AS prefix_hits
                 FROM engine_timeline WHERE run_id = $1 GROUP BY shard)
           SELECT shard, count(*) AS requests, sum(num_prompt_tokens) AS prompt_tokens,
                  sum(num_output_tokens) AS output_tokens, sum(num_cached_tokens) AS cached_tokens,
                  any_value(t.seconds) AS seconds, any_value(t.prefix_queries) AS prefix_queries,
                  any_value(t.prefix_hits) AS prefix_hits
           FROM ran LEFT JOIN t USING (shard) GROUP BY shard ORDER BY shard""", [run_id]).df()


def _lengths(con: duckdb.DuckDBPyConnection, run_id: str) -> pd.DataFrame:
    """Estimate against actual for requests the plan estimated and the engine answered (ok), counted."""
    return con.execute(
        # each shard samples its own prefix tree, so a node number names a subtree within its shard
        """SELECT p.est_output_tokens AS estimate, o.num_output_tokens AS actual,
                  coalesce(s.kind, 'default') AS kind,
                  CASE WHEN s.source_node >= 0 THEN format('shard {} node {}', p.shard, s.source_node) END AS subtree,
                  count(*) AS requests
           FROM plan p JOIN outputs o USING (run_id, request_id)
           LEFT JOIN samples s ON s.run_id = p.run_id AND s.request_id = p.answered_by
           WHERE p.run_id = ? AND o.status = 'ok'
           GROUP BY ALL ORDER BY ALL""", [run_id]).df()


def _reasons(con: duckdb.DuckDBPyConnection, run_id: str) -> pd.DataFrame:
    return con.execute(
        """SELECT 'rejected at ingest' AS stage, reason, count(*) AS requests FROM rejects WHERE run_id = $1 GROUP BY ALL
           UNION ALL
           SELECT 'failed in the engine', coalesce(error, '(no message)'), count(*) FROM outputs
           WHERE run_id = $1 AND status = 'error' GROUP BY ALL
           ORDER BY requests DESC, reason""", [run_id]).df()
