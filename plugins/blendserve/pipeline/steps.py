"""The pipeline's steps as plain functions: the CLI runs them in a row, the DAG
runs each as a task. Each step reads what the previous one wrote under the run
folder, so any step can be re-run alone.

ingest -> validate_input -> plan -> infer_shard (x shards; each runs its warm-up sample first)
-> load -> explain -> validate_outputs -> report -> summary
"""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict

import pyarrow as pa
import pyarrow.compute as pc

from blendserve import files
from blendserve.config import RunConfig
from blendserve.engines import START_TIMES, close_all, engine_key, engine_session, join_closing, keep_engines, prestart
from blendserve.engines.common import TIMELINE_KEYS
from blendserve.files import StoragePath
from blendserve.ingest import ingest
from blendserve.ingest.normalize import Limits
from blendserve.ingest.readers import expand_inputs
from blendserve.ingest.tokenize import PromptTokenizer
from blendserve.logs import configure_logging
from blendserve.pipeline import database, parts
from blendserve.pipeline.plan import load_inputs, plan_rows
from blendserve.pipeline.shard import ShardWork, plan_shard
from blendserve.progress import Progress, Stages, phase
from blendserve.report.build import build_report
from blendserve.report.explain import explain_plan
from blendserve.report.replay import replay_metrics
from blendserve.scheduling.admission import Delegating, EngineState
from blendserve.validation import check_outputs, check_requests, raise_on_failure

log = logging.getLogger(__name__)
CHILD_NICENESS = 10  # of the process that runs ingest, validation and the plan beside the engine's start
# Exits of the children that ran the steps beside the engine's start, joined at the run's end (``_join_children``)
_CHILD_EXITS: list[threading.Thread] = []
ADMITTED_FILE = "admitted.parquet"  # per shard: the order its requests were admitted in (the order that ran)


class InjectedFault(RuntimeError):
    """Raised by the fault-injection setting, to prove that retries resume."""


def ingest_step(config: RunConfig) -> dict:
    tokenizer = PromptTokenizer(config.model_path())
    limits = Limits(config.default_max_tokens, config.max_model_len, tokenizer.vocab_size)
    report = ingest(config.input, config.requests_path, config.rejects_path, tokenizer, limits,
                    config.storage_conn_id or None)
    with database.connect(config.db) as con:
        database.start_run(con, config.run_id, config.to_json())
        database.load_requests(con, config.run_id, config.requests_path, config.rejects_path)
        database.put_metrics(con, config.run_id, {"ingest_read": report.read, "ingest_accepted": report.accepted,
                                               "ingest_rejected": report.rejected})
    return asdict(report)


def validate_input_step(config: RunConfig) -> dict:
    """great-expectations on the accepted requests; fails the step, naming the checks, if any fails."""
    with database.connect(config.db) as con:
        counts = dict(con.execute("SELECT name, value FROM metrics WHERE run_id = ? AND name LIKE 'ingest_%'",
                                  [config.run_id]).fetchall())
        results = check_requests(con, config.run_id, config.max_model_len,
                                 int(counts["ingest_read"]), int(counts["ingest_rejected"]))
        database.put_validation(con, config.run_id, results)
    raise_on_failure(results)
    return {"checks": len(results)}


def plan_step(config: RunConfig) -> list[int]:
    """Order the requests with the configured policy, cut the order into shards, write plan.parquet."""
    with phase(f"plan ({config.policy})"):
        inputs = load_inputs(config)
        rows = plan_rows(config, inputs)
    files.atomic_write_parquet(rows, config.plan_path)
    saved = rows.num_rows - pc.sum(pc.equal(rows.column("request_id"), rows.column("answered_by")), min_count=0).as_py()
    with database.connect(config.db) as con:
        database.put_plan(con, config.run_id, config.plan_path)
        database.record_hardware(con, config.run_id, inputs.cost.hardware.name)
        database.put_metrics(con, config.run_id, {"dedupe_saved": saved})  # inferences identical requests did not need
    log.info("plan: %d requests, policy %s, %d shards, %d duplicates answered by a twin",
             rows.num_rows, config.policy, config.shards, saved)
    return list(range(config.shards))


def explain_step(config: RunConfig) -> str:
    """Predicted time, GPU-hours and throughput of every policy (stored as predicted_* metrics),
    on the estimates the shards' warm-up samples gave: run it after ``load_step``."""
    text = explain_plan(config)
    log.info("plan explained:\n%s", text)
    return text


def report_step(config: RunConfig) -> str:
    """The run report (Markdown + PNG plots) beside the DuckDB file; first, on a calibrated profile, the
    replay of what ran (``replay_*`` metrics: the cost model's seconds against the measured ones)."""
    replay = replay_metrics(config)
    if replay:
        with database.connect(config.db) as con:
            database.put_metrics(con, config.run_id, replay)
        log.info("replay: %.1f s predicted for what ran, %.1f s measured (%+.1f%%)", replay["replay_seconds"],
                 replay["replay_measured_seconds"], 100 * replay["replay_error"])
    path = build_report(config.db, config.run_id)
    log.info("run report: %s", path)
    return str(path)


def infer_shard(config: RunConfig, shard: int, keep_engine: bool = False) -> dict:
    """Serve one shard: its warm-up sample first, then the rest ordered on the sample's lengths
    (``pipeline.shard``). Resumes after the committed part files. The engine stops at the end
    unless ``keep_engine`` (the next shard in this process reuses it)."""
    # the plan lists each shard's rows in run order (a position, or none where the shard orders them)
    plan = files.read_parquet([config.plan_path]).filter(pc.equal(pc.field("shard"), shard))
    # duplicates are not run: load_step copies their twin's answer
    runs = plan.filter(pc.equal(pc.field("request_id"), pc.field("answered_by"))).column("request_id").to_pylist()
    shard_dir = config.shard_dir(shard)
    done = parts.committed_lengths(shard_dir)
    work = plan_shard(config, runs, done)
    log.info("shard %d: %d requests to serve (%d already committed)", shard, len(work.todo), len(done))
    summary = _serve(config, shard, work, done, keep_engine) if work.todo else {"shard": shard, "served": 0}
    estimates = work.estimate_table()
    if estimates is not None:  # the warm-up's estimates, stored by load_step
        files.atomic_write_parquet(estimates, shard_dir / "estimates.parquet")
    del work
    # the shard's token array sits in reference cycles (re-planner and controller, simulator and its proxy):
    # free it now, not at some later collection, before the next step in this process reads the requests again
    gc.collect()
    return summary


class AdmissionLog(Delegating):
    """The controller's admissions, recorded in order: the order that ran."""

    def __init__(self, controller) -> None:  # type: ignore[no-untyped-def]
        self.controller = controller
        self.admitted: list[int] = []  # engine indices, in admission order

    def next_request(self, state: EngineState) -> int | None:
        index = self.controller.next_request(state)
        if index is not None:
            self.admitted.append(index)
        return index


def _serve(config: RunConfig, shard: int, work: ShardWork, done: dict[str, int], keep_engine: bool) -> dict:
    """Run ``work.todo`` on the engine in the order ``work.controller`` admits them (its indices are
    positions in ``todo``), committing results to the shard's part files."""
    shard_dir = config.shard_dir(shard)
    requests = work.engine_requests()
    writer = parts.PartWriter(shard_dir, config.run_id, shard, config.engine, config.part_rows)
    admissions = AdmissionLog(work.controller)

    def on_result(result) -> None:
        writer.add(result)
        if 0 <= config.fail_after_rows <= writer.committed + len(writer.buffer) - 1:
            raise InjectedFault(f"fault injection: shard {shard} stops after {config.fail_after_rows} rows")

    with engine_session(config, keep=keep_engine) as engine, Progress(f"shard {shard}", len(requests)) as progress:
        started = time.time()  # after the engine start: the run's wall counts serving, as the engine's own does
        stats = engine.run(requests, admissions, progress.wrap(on_result))
        finished = time.time()
    writer.flush()
    _write_admitted(shard_dir, done, [work.todo[i] for i in admissions.admitted])
    summary = {"shard": shard, "served": stats.requests, "errors": stats.errors, "wall_seconds": stats.wall_seconds,
               "started_at": started, "finished_at": finished,
               "prompt_tokens": stats.prompt_tokens, "cached_prompt_tokens": stats.cached_prompt_tokens,
               "output_tokens": stats.output_tokens}
    files.atomic_write_bytes(json.dumps(summary).encode(), shard_dir / parts.STATS_FILE)
    _write_timeline(stats.timeline, shard, shard_dir / "timeline.parquet")
    return summary


def _write_admitted(shard_dir: StoragePath, done: dict[str, int], admitted: list[str]) -> None:
    """``admitted.parquet``: the shard's requests in the order they were admitted, over all its tries.

    Requests an earlier try committed come first, in the order that try
    recorded (a try that failed recorded none: then their commit order).
    """
    path = shard_dir / ADMITTED_FILE
    earlier = files.read_parquet([path]).column("request_id").to_pylist() if path.exists() else []
    kept = [i for i in earlier if i in done]
    listed = set(kept)
    ids = kept + [i for i in done if i not in listed] + admitted
    files.atomic_write_parquet(pa.table({"request_id": pa.array(ids, pa.string()),
                                         "position": pa.array(range(len(ids)), pa.int32())}), path)


def _write_timeline(rows: list[dict], shard: int, path: StoragePath) -> None:
    """The engine's per-interval statistics, for the run report (last attempt of the shard)."""
    columns = {key: pa.array([row.get(key) for row in rows], pa.float64()) for key in TIMELINE_KEYS}
    table = pa.table({"shard": pa.array([shard] * len(rows), pa.int32()), **columns})
    files.atomic_write_parquet(table, path)


def load_step(config: RunConfig) -> dict:
    """Load every shard's part files into DuckDB, check one output per request."""
    part_files = files.list_parts(config.parts_dir, f"*/{parts.PART_GLOB}")
    estimates = files.list_parts(config.parts_dir, "shard-*/estimates.parquet")
    with database.connect(config.db) as con:
        inserted = database.load_outputs(con, config.run_id, part_files)
        inserted += database.fan_out_duplicates(con, config.run_id)
        if estimates:
            database.put_samples(con, config.run_id, files.read_parquet(estimates))
        database.put_timeline(con, config.run_id, files.list_parts(config.parts_dir, "*/timeline.parquet"))
        database.put_positions(con, config.run_id, files.list_parts(config.parts_dir, f"shard-*/{ADMITTED_FILE}"))
        missing = con.execute(
            """SELECT count(*) FROM requests r ANTI JOIN outputs o USING (run_id, request_id)
               WHERE r.run_id = ?""", [config.run_id]).fetchone()[0]
        if missing:
            raise RuntimeError(f"{missing} accepted requests have no output; re-run the infer shards")
        metrics = _run_metrics(config)
        database.put_metrics(con, config.run_id, metrics)
    return {"inserted": inserted, **metrics}


def _run_metrics(config: RunConfig) -> dict[str, float]:
    shards = parts.shard_stats(config.parts_dir)
    wall = run_wall_seconds(shards, simulated=config.engine == "simulator")
    prompt = sum(s["prompt_tokens"] for s in shards)
    cached = sum(s["cached_prompt_tokens"] for s in shards)
    output = sum(s["output_tokens"] for s in shards)
    return {
        "wall_seconds": wall,
        "tokens_per_second": (prompt + output) / wall if wall else 0.0,
        "prefix_hit_rate": cached / prompt if prompt else 0.0,
    }


def run_wall_seconds(shards: list[dict], simulated: bool = False) -> float:
    """Seconds during which at least one shard was serving: the union of the shards' [start, end]
    intervals. Side by side that is first start to last end; one after another (one pool slot, or
    the CLI) the sum of their busy times, never the longest shard alone. Simulated shards carry
    simulated seconds on separate simulated GPUs, so the longest one sets their wall."""
    if simulated or any("started_at" not in s for s in shards):  # stats.json of older runs: no times
        return max((s["wall_seconds"] for s in shards), default=0.0)
    wall, end = 0.0, float("-inf")
    for start, finish in sorted((s["started_at"], s["finished_at"]) for s in shards):
        wall += max(0.0, finish - max(start, end))
        end = max(end, finish)
    return wall


def validate_outputs_step(config: RunConfig) -> dict:
    """great-expectations on the outputs: exactly one per accepted request, sane values."""
    with database.connect(config.db) as con:
        results = check_outputs(con, config.run_id, config.max_model_len)
        database.put_validation(con, config.run_id, results)
        database.finish_run(con, config.run_id, "finished" if all(r.success for r in results) else "failed")
    raise_on_failure(results)
    return {"checks": len(results)}


def summary(config: RunConfig) -> dict:
    with database.connect(config.db, read_only=True) as con:
        row = con.execute(
            """SELECT count(*), sum(num_prompt_tokens), sum(num_output_tokens), count(*) FILTER (status = 'error')
               FROM outputs WHERE run_id = ?""", [config.run_id]).fetchone()
        rejected = con.execute("SELECT count(*) FROM rejects WHERE run_id = ?", [config.run_id]).fetchone()[0]
        metrics = dict(con.execute("SELECT name, value FROM metrics WHERE run_id = ?", [config.run_id]).fetchall())
        run = con.execute("SELECT config_json FROM runs WHERE run_id = ?", [config.run_id]).fetchone()
        samples = con.execute(
            """SELECT request_id, text FROM outputs WHERE run_id = ? AND status = 'ok' AND num_output_tokens > 1
               ORDER BY request_id LIMIT 1""", [config.run_id]).fetchall()
        samples += con.execute(
            """SELECT request_id, text FROM outputs WHERE run_id = ? AND status = 'ok' AND num_output_tokens <= 1
               ORDER BY request_id LIMIT 1""", [config.run_id]).fetchall()
    hardware = json.loads(run[0])["hardware"] if run else config.hardware  # as the plan step resolved it
    return {"run_id": config.run_id, "hardware": hardware, "requests": row[0], "rejected": rejected, "errors": row[3],
            "input_tokens": row[1] or 0, "output_tokens": row[2] or 0, **metrics,
            "db": str(config.db), "samples": samples}


def run_pipeline(config: RunConfig, overlap: bool = False) -> dict:
    """Every step in this process, shards one after another on one engine. A step that fails
    (or an interrupt) marks the run failed before the error goes on: never left ``running``.

    ``overlap`` (the CLI's): the engine starts while ingest, validation and the plan run in a
    child process, and stops while the committed answers are loaded, checked and reported; a
    run then pays about one engine start less than the steps in a row."""
    try:
        return _run_steps(config, overlap)
    except BaseException:
        mark_failed(config)
        raise


def mark_failed(config: RunConfig) -> None:
    """Set the run's status to failed, if it has a row; a locked or broken database only logs."""
    try:
        with database.connect(config.db, wait_s=5) as con:
            database.finish_run(con, config.run_id, "failed")
    except Exception:  # the original error is the one to report
        log.warning("could not mark run %s failed in %s", config.run_id, config.db, exc_info=True)


def prepare_steps(config: RunConfig) -> list[int]:
    """What runs before inference: ingest, validation, the plan; the shards to serve."""
    ingest_step(config)
    validate_input_step(config)
    return plan_step(config)


def _beside_engine_start(config: RunConfig, fn, *args):  # type: ignore[no-untyped-def]
    """``fn(*args)`` in a fresh (spawned), lower-priority process with this one's logging, while this
    process starts ``config``'s engine; its result or its error. The child is spawned first: it has its
    own imports to do, and the engine's import of vLLM here would only delay them."""
    verbose = logging.getLogger().getEffectiveLevel() <= logging.DEBUG
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_background_child, initargs=(verbose,))
    try:
        result = pool.submit(fn, *args)
        prestart(config)  # a thread of this process
        value = result.result()
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)  # the child's steps end before the run is marked failed
        raise
    # The child's exit (seconds, with its imports) need not hold up inference, but the run waits for it at its
    # end: a pool left to interpreter exit keeps its queues' semaphores, and multiprocessing warns of them
    exiting = threading.Thread(target=pool.shutdown, name="steps-child-exit")
    exiting.start()
    _CHILD_EXITS.append(exiting)
    return value


def _join_children() -> None:
    while _CHILD_EXITS:
        _CHILD_EXITS.pop().join()


def _background_child(verbose: bool) -> None:
    # The engine's start is the longer of the two and the run waits for it: on a few cores the steps
    # beside it should only take what it leaves (they still end well before it does).
    os.nice(CHILD_NICENESS)
    configure_logging(verbose)


def _run_steps(config: RunConfig, overlap: bool) -> dict:
    stages = Stages()
    try:
        try:
            with stages.timed("prepare"):
                if overlap:
                    expand_inputs(config.input, config.storage_conn_id or None)  # no engine start for a wrong path
                    shards = _beside_engine_start(config, prepare_steps, config)
                else:
                    shards = prepare_steps(config)
            with stages.timed("inference"):  # from the end of prepare: a wait for the engine's start is in it
                for shard in shards:
                    infer_shard(config, shard, keep_engine=True)
        finally:
            if not keep_engines():
                close_all(wait=not overlap)
        with stages.timed("finish"):
            load_step(config)
            if config.explain:
                explain_step(config)
            validate_outputs_step(config)
            report = report_step(config)  # before the summary: it stores the replay_* metrics the summary shows
        stages.add("engine start", START_TIMES.get(engine_key(config)))
        return {**summary(config), "report": report, "stages": stages.seconds}
    finally:
        join_closing()
        _join_children()
