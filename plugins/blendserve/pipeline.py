"""The pipeline's steps as plain functions: the CLI runs them in a row, the DAG
runs each as a task. Each step reads what the previous one wrote under the run
folder, so any step can be re-run alone.

ingest -> validate_input -> plan -> infer_shard (x shards) -> load -> validate_outputs -> summary
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from blendserve import parts, store
from blendserve.config import RunConfig
from blendserve.engines.base import EngineRequest

log = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    """Raised by the fault-injection setting, to prove that retries resume."""


def ingest_step(config: RunConfig) -> dict:
    from blendserve.ingest import ingest
    from blendserve.ingest.normalize import Limits
    from blendserve.ingest.tokenize import PromptTokenizer

    tokenizer = PromptTokenizer(config.model_path())
    limits = Limits(config.default_max_tokens, config.max_model_len, tokenizer.vocab_size)
    report = ingest(config.input, config.requests_path, config.rejects_path, tokenizer, limits)
    with store.connect(config.db) as con:
        store.start_run(con, config.run_id, config.to_json())
        store.load_requests(con, config.run_id, config.requests_path, config.rejects_path)
        store.put_metrics(con, config.run_id, {"ingest_read": report.read, "ingest_accepted": report.accepted,
                                               "ingest_rejected": report.rejected})
    return asdict(report)


def validate_input_step(config: RunConfig) -> dict:
    """great-expectations on the accepted requests; fails the step, naming the checks, if any fails."""
    from blendserve.validation import raise_on_failure, validate_requests

    requests = pq.read_table(config.requests_path, columns=["request_id", "num_prompt_tokens", "max_tokens"])
    with store.connect(config.db) as con:
        counts = dict(con.execute("SELECT name, value FROM metrics WHERE run_id = ? AND name LIKE 'ingest_%'",
                                  [config.run_id]).fetchall())
        results = validate_requests(requests.to_pandas(), config.max_model_len,
                                    int(counts["ingest_read"]), int(counts["ingest_rejected"]))
        store.put_validation(con, config.run_id, results)
    raise_on_failure(results)
    return {"checks": len(results)}


def plan_step(config: RunConfig) -> list[int]:
    """Order the requests with the configured policy and cut the order into shards."""
    from blendserve.admission import StaticOrder
    from blendserve.batch import RequestBatch
    from blendserve.costmodel import CostModel, get_hardware, get_model
    from blendserve.policies import PolicyContext, make_controller

    batch = RequestBatch.from_parquet(config.requests_path)
    estimates = np.where(batch.expected_output_tokens >= 0, batch.expected_output_tokens, batch.max_tokens)
    cost = CostModel(get_model("smollm2-135m"), get_hardware("a100-80g"))
    controller = make_controller(config.policy, PolicyContext(batch, estimates, cost, kv_capacity_tokens=1 << 20))
    if not isinstance(controller, StaticOrder):
        raise NotImplementedError(f"policy {config.policy!r} needs the planner's static order")
    order = controller.order
    shard_of = np.repeat(np.arange(config.shards), np.diff(np.linspace(0, len(order), config.shards + 1).astype(int)))
    plan = pa.table({
        "request_id": pa.array(batch.request_ids[order].tolist(), pa.string()),
        "shard": pa.array(shard_of, pa.int32()),
        "position": pa.array(np.arange(len(order)), pa.int64()),
    })
    pq.write_table(plan, config.plan_path)
    return list(range(config.shards))


def infer_shard(config: RunConfig, shard: int, keep_engine: bool = False) -> dict:
    """Serve one shard's requests in plan order; resumes after the committed part files.
    The engine stops at the end unless ``keep_engine`` (the next shard in this process reuses it)."""
    from blendserve.admission import StaticOrder
    from blendserve.engines import engine_session

    shard_dir = config.shard_dir(shard)
    requests = _shard_requests(config, shard, skip=parts.committed_ids(shard_dir))
    writer = parts.PartWriter(shard_dir, config.run_id, shard, config.engine, config.part_rows)
    log.info("shard %d: %d requests to serve", shard, len(requests))
    if not requests:
        return {"shard": shard, "served": 0}

    def on_result(result) -> None:
        writer.add(result)
        if 0 <= config.fail_after_rows <= writer.committed + len(writer.buffer) - 1:
            raise InjectedFault(f"fault injection: shard {shard} stops after {config.fail_after_rows} rows")

    with engine_session(config, keep=keep_engine) as engine:
        stats = engine.run(requests, StaticOrder(np.arange(len(requests))), on_result)
    writer.flush()
    summary = {"shard": shard, "served": stats.requests, "errors": stats.errors, "wall_seconds": stats.wall_seconds,
               "prompt_tokens": stats.prompt_tokens, "cached_prompt_tokens": stats.cached_prompt_tokens,
               "output_tokens": stats.output_tokens}
    (shard_dir / "stats.json").write_text(json.dumps(summary))
    return summary


def _shard_requests(config: RunConfig, shard: int, skip: set[str]) -> list[EngineRequest]:
    plan = pq.read_table(config.plan_path).filter(pc.equal(pc.field("shard"), shard)).sort_by("position")
    requests = pq.read_table(config.requests_path)
    by_id = {r["request_id"]: r for r in requests.to_pylist()}
    out = []
    for request_id in plan.column("request_id").to_pylist():
        if request_id in skip:
            continue
        row = by_id[request_id]
        out.append(EngineRequest(
            request_id=request_id,
            prompt_token_ids=row["prompt_token_ids"],
            max_tokens=row["max_tokens"],
            temperature=row["temperature"],
            top_p=row["top_p"],
            seed=row["seed"],
            stop=None if row["stop_json"] is None else json.loads(row["stop_json"]),
        ))
    return out


def load_step(config: RunConfig) -> dict:
    """The single DuckDB writer: load every shard's part files, check one output per request."""
    files = sorted(config.run_dir.glob(f"parts/shard-*/{parts.PART_GLOB}"))
    with store.connect(config.db) as con:
        inserted = store.load_outputs(con, config.run_id, files)
        missing = con.execute(
            """SELECT count(*) FROM requests r ANTI JOIN outputs o USING (run_id, request_id)
               WHERE r.run_id = ?""", [config.run_id]).fetchone()[0]
        if missing:
            raise RuntimeError(f"{missing} accepted requests have no output; re-run the infer shards")
        metrics = _run_metrics(config)
        store.put_metrics(con, config.run_id, metrics)
    return {"inserted": inserted, **metrics}


def _run_metrics(config: RunConfig) -> dict[str, float]:
    shards = [json.loads(p.read_text()) for p in config.run_dir.glob("parts/shard-*/stats.json")]
    wall = max((s["wall_seconds"] for s in shards), default=0.0)  # shards run side by side
    prompt = sum(s["prompt_tokens"] for s in shards)
    cached = sum(s["cached_prompt_tokens"] for s in shards)
    output = sum(s["output_tokens"] for s in shards)
    return {
        "wall_seconds": wall,
        "tokens_per_second": (prompt + output) / wall if wall else 0.0,
        "prefix_hit_rate": cached / prompt if prompt else 0.0,
    }


def validate_outputs_step(config: RunConfig) -> dict:
    """great-expectations on the outputs: exactly one per accepted request, sane values."""
    from blendserve.validation import raise_on_failure, validate_outputs

    with store.connect(config.db) as con:
        outputs = con.execute("""SELECT request_id, status, num_output_tokens, finish_reason
                                 FROM outputs WHERE run_id = ?""", [config.run_id]).df()
        accepted = [r[0] for r in con.execute("SELECT request_id FROM requests WHERE run_id = ?",
                                              [config.run_id]).fetchall()]
        results = validate_outputs(outputs, accepted, config.max_model_len)
        store.put_validation(con, config.run_id, results)
        store.finish_run(con, config.run_id, "finished" if all(r.success for r in results) else "failed")
    raise_on_failure(results)
    return {"checks": len(results)}


def summary(config: RunConfig) -> dict:
    with store.connect(config.db, read_only=True) as con:
        row = con.execute(
            """SELECT count(*), sum(num_prompt_tokens), sum(num_output_tokens), count(*) FILTER (status = 'error')
               FROM outputs WHERE run_id = ?""", [config.run_id]).fetchone()
        rejected = con.execute("SELECT count(*) FROM rejects WHERE run_id = ?", [config.run_id]).fetchone()[0]
        metrics = dict(con.execute("SELECT name, value FROM metrics WHERE run_id = ?", [config.run_id]).fetchall())
        samples = con.execute(
            """SELECT request_id, text FROM outputs WHERE run_id = ? AND status = 'ok' AND num_output_tokens > 1
               ORDER BY request_id LIMIT 1""", [config.run_id]).fetchall()
        samples += con.execute(
            """SELECT request_id, text FROM outputs WHERE run_id = ? AND status = 'ok' AND num_output_tokens <= 1
               ORDER BY request_id LIMIT 1""", [config.run_id]).fetchall()
    return {"run_id": config.run_id, "requests": row[0], "rejected": rejected, "errors": row[3],
            "input_tokens": row[1] or 0, "output_tokens": row[2] or 0, **metrics,
            "db": str(config.db), "samples": samples}


def run_pipeline(config: RunConfig) -> dict:
    """Every step in this process, shards one after another on one engine."""
    from blendserve.engines import close_all, keep_engines

    ingest_step(config)
    validate_input_step(config)
    try:
        for shard in plan_step(config):
            infer_shard(config, shard, keep_engine=True)
    finally:
        if not keep_engines():
            close_all()
    load_step(config)
    validate_outputs_step(config)
    return summary(config)
