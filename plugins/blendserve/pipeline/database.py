"""DuckDB: the one place results land. One writer at a time.

Shards never write here; they write Parquet part files and the load step
inserts them. Every insert is keyed on (run_id, request_id) and skips rows
already there, so re-running a step never duplicates. The Parquet files may be
in object storage; the DuckDB file is always local (one writer, file locks).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from blendserve import files
from blendserve.files import PathLike
from blendserve.model_prep import REPO_ROOT

SQL_DIR = REPO_ROOT / "sql"
log = logging.getLogger(__name__)


LOCK_WAIT_ENV = "BLENDSERVE_DB_LOCK_WAIT_S"  # seconds to wait for another process's lock on the DuckDB file
DEFAULT_LOCK_WAIT_S = 60.0
_LOCK_HOLDER = re.compile(r"Conflicting lock is held in (?P<exe>.*) \(PID (?P<pid>\d+)\)")


class DatabaseLocked(RuntimeError):
    """Another process held the DuckDB file for longer than we wait."""


def connect(db: str | Path, read_only: bool = False, wait_s: float | None = None) -> duckdb.DuckDBPyConnection:
    """A connection to ``db``. DuckDB takes one writing process per file: while another process holds it,
    wait (``wait_s``, default ``BLENDSERVE_DB_LOCK_WAIT_S`` or 60 s, polling with backoff), then fail
    with DatabaseLocked naming the holder's PID and command line."""
    wait_s = float(os.environ.get(LOCK_WAIT_ENV, DEFAULT_LOCK_WAIT_S)) if wait_s is None else wait_s
    started, pause, holder = time.monotonic(), 0.05, None
    while True:
        try:
            return _open(db, read_only)
        except duckdb.IOException as err:
            match = _LOCK_HOLDER.search(str(err))
            if match is None:
                raise
        if holder is None:
            holder = _describe_holder(match)
            log.warning("%s is locked by %s; waiting up to %.0f s", db, holder, wait_s)
        left = wait_s - (time.monotonic() - started)
        if left <= 0:
            raise DatabaseLocked(f"{db} is locked by {_describe_holder(match)}; gave up after {wait_s:.0f} s "
                                 f"(one process writes a DuckDB file at a time; {LOCK_WAIT_ENV} sets the wait)")
        time.sleep(min(pause, left))
        pause = min(pause * 2, 2.0)


def _open(db: str | Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    if read_only:
        return duckdb.connect(str(db), read_only=True)
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(db))
    con.execute((SQL_DIR / "schema.sql").read_text())
    return con


def _describe_holder(match: re.Match) -> str:
    """'PID n (its command line)', from DuckDB's lock error and /proc where there is one."""
    pid = int(match["pid"])
    if pid == os.getpid():
        return f"PID {pid} (this process: another connection is still open)"
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        command = ""
    return f"PID {pid} ({(command or match['exe'])[:300]})"


@contextmanager
def _parquet(con: duckdb.DuckDBPyConnection, paths: Sequence[PathLike]) -> Iterator[str]:
    """What to select FROM for these Parquet files. DuckDB reads local files itself; object
    storage comes through Arrow with the run's own credentials (DuckDB's httpfs would need its own)."""
    if not any(files.is_remote(p) for p in paths):
        yield "read_parquet([" + ", ".join(_sql_file_name(p) for p in paths) + "])"
        return
    name = f"parquet_{uuid.uuid4().hex}"
    con.register(name, files.parquet_dataset(paths))  # scanned in batches, never whole in memory
    try:
        yield name
    finally:
        con.unregister(name)


def _sql_file_name(path: PathLike) -> str:
    """A SQL string naming exactly this file: read_parquet expands * ? [ even in a list of names, so a
    folder such as ``out/[x]`` would match other files; each becomes a one-character class."""
    return "'" + re.sub(r"([*?\[])", r"[\1]", str(path)).replace("'", "''") + "'"


def start_run(con: duckdb.DuckDBPyConnection, run_id: str, config_json: str) -> None:
    config = json.loads(config_json)
    con.execute(
        """INSERT INTO runs (run_id, config_json, input, engine, policy, started_at, status, airflow_run_id)
           VALUES (?, ?, ?, ?, ?, ?, 'running', ?)
           ON CONFLICT (run_id) DO UPDATE SET status = 'running', config_json = excluded.config_json""",
        [run_id, config_json, config["input"], config["engine"], config["policy"], datetime.now(timezone.utc),
         config.get("airflow_run_id") or None],
    )


def record_hardware(con: duckdb.DuckDBPyConnection, run_id: str, hardware: str) -> None:
    """Put the hardware the plan resolved (``auto`` -> a calibrated profile's name, or the fallback GPU)
    in the run's config, so the report and later steps cost on the same profile and say which."""
    row = con.execute("SELECT config_json FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None:  # planned without an ingest step (a test, a library caller): no run row to annotate
        return
    config = json.loads(row[0])
    config["hardware"] = hardware
    con.execute("UPDATE runs SET config_json = ? WHERE run_id = ?", [json.dumps(config, sort_keys=True), run_id])


def finish_run(con: duckdb.DuckDBPyConnection, run_id: str, status: str = "finished") -> None:
    con.execute("UPDATE runs SET status = ?, finished_at = ? WHERE run_id = ?", [status, datetime.now(timezone.utc), run_id])


def load_requests(con: duckdb.DuckDBPyConnection, run_id: str, requests_path: PathLike,
                  rejects_path: PathLike) -> None:
    with _parquet(con, [requests_path]) as source:
        con.execute(
            f"""INSERT OR IGNORE INTO requests
                SELECT ?, request_id, endpoint, num_prompt_tokens, max_tokens, temperature, top_p, seed,
                       expected_output_tokens, metadata_json, source_file, source_row
                FROM {source}""",
            [run_id],
        )
    with _parquet(con, [rejects_path]) as source:
        con.execute(f"INSERT OR IGNORE INTO rejects SELECT ?, source_file, source_row, raw, reason FROM {source}",
                    [run_id])


def load_outputs(con: duckdb.DuckDBPyConnection, run_id: str, part_files: Sequence[PathLike]) -> int:
    """Insert shard part files; rows already loaded are skipped. Returns rows inserted."""
    if not part_files:
        return 0
    before = count_outputs(con, run_id)
    with _parquet(con, part_files) as source:
        con.execute(
            f"""INSERT OR IGNORE INTO outputs
                SELECT run_id, request_id, shard, status, text, output_token_ids, finish_reason,
                       num_prompt_tokens, num_output_tokens, num_cached_tokens, error, engine,
                       started_at, finished_at
                FROM {source} WHERE run_id = ?
                -- a request is in one part file unless a crash re-ran it; keep its first result
                QUALIFY row_number() OVER (PARTITION BY request_id ORDER BY finished_at) = 1""",
            [run_id],
        )
    return count_outputs(con, run_id) - before


def count_outputs(con: duckdb.DuckDBPyConnection, run_id: str) -> int:
    # fetchall, not fetchone: an unfinished result would stop _parquet from registering an Arrow source
    return con.execute("SELECT count(*) FROM outputs WHERE run_id = ?", [run_id]).fetchall()[0][0]


def put_metrics(con: duckdb.DuckDBPyConnection, run_id: str, metrics: dict[str, float]) -> None:
    con.executemany(
        "INSERT OR REPLACE INTO metrics VALUES (?, ?, ?)",
        [[run_id, name, float(value)] for name, value in metrics.items()],
    )


def put_validation(con: duckdb.DuckDBPyConnection, run_id: str, results: list) -> None:
    """Store great-expectations results (``validation.CheckResult``); a re-check replaces the old row."""
    now = datetime.now(timezone.utc)
    con.executemany(
        "INSERT OR REPLACE INTO validation_results VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [[run_id, r.stage, r.expectation, r.column, r.success, r.observed, r.unexpected, now] for r in results],
    )


def put_plan(con: duckdb.DuckDBPyConnection, run_id: str, plan_path: PathLike) -> None:
    """The plan as a table (re-planning a run replaces it)."""
    con.execute("DELETE FROM plan WHERE run_id = ?", [run_id])
    with _parquet(con, [plan_path]) as source:
        con.execute(f"""INSERT INTO plan SELECT ?, request_id, shard, position, est_output_tokens, answered_by
                        FROM {source}""", [run_id])


def put_positions(con: duckdb.DuckDBPyConnection, run_id: str, admitted: Sequence[PathLike]) -> None:
    """``plan.position`` becomes the order each shard admitted its requests in (a duplicate takes its twin's)."""
    if not admitted:
        return
    with _parquet(con, admitted) as source:
        con.execute(f"""UPDATE plan SET position = a.position FROM {source} a
                        WHERE plan.run_id = ? AND a.request_id = plan.answered_by""", [run_id])


def put_samples(con: duckdb.DuckDBPyConnection, run_id: str, estimates) -> None:
    """Per inference output-length estimates from the shards' warm-up samples (``sampling.estimate_table``).

    The plan's ``est_output_tokens`` become these (a duplicate takes its
    twin's): the plan task only knew ``max_tokens``, the shards re-planned on these.
    """
    con.execute("DELETE FROM samples WHERE run_id = ?", [run_id])
    con.register("estimates_arrow", estimates)
    columns = ", ".join(estimates.column_names)
    con.execute(f"INSERT INTO samples (run_id, {columns}) SELECT ?, {columns} FROM estimates_arrow", [run_id])
    con.unregister("estimates_arrow")
    con.execute("""UPDATE plan SET est_output_tokens = s.est_output_tokens FROM samples s
                   WHERE plan.run_id = ? AND s.run_id = plan.run_id AND s.request_id = plan.answered_by""", [run_id])


def fan_out_duplicates(con: duckdb.DuckDBPyConnection, run_id: str) -> int:
    """Identical requests ran once: give every duplicate a copy of its twin's output row."""
    before = count_outputs(con, run_id)
    con.execute(
        """INSERT OR IGNORE INTO outputs
           SELECT o.run_id, p.request_id, o.shard, o.status, o.text, o.output_token_ids, o.finish_reason,
                  o.num_prompt_tokens, o.num_output_tokens, o.num_cached_tokens, o.error, o.engine,
                  o.started_at, o.finished_at
           FROM plan p JOIN outputs o ON o.run_id = p.run_id AND o.request_id = p.answered_by
           WHERE p.run_id = ? AND p.request_id <> p.answered_by""",
        [run_id],
    )
    return count_outputs(con, run_id) - before


def put_timeline(con: duckdb.DuckDBPyConnection, run_id: str, timelines: Sequence[PathLike]) -> None:
    """Engine statistics per interval and shard (re-loading a run replaces them)."""
    con.execute("DELETE FROM engine_timeline WHERE run_id = ?", [run_id])
    if timelines:
        with _parquet(con, timelines) as source:
            con.execute(f"INSERT INTO engine_timeline SELECT ?, * FROM {source}", [run_id])
