"""Export a run's outputs as OpenAI batch output and error files (JSONL), with a manifest.

Users of the OpenAI batch API already have code that reads these files, matched
by ``custom_id``: successes go to ``<run>-output.jsonl`` in the response shape
of their endpoint (chat.completion or text_completion, with usage), failures to
``<run>-errors.jsonl``: engine errors, then the rows ingest rejected (their
``custom_id`` when the row had one, the file, row and reason in the message).
``<run>-manifest.json`` names the Airflow run id the safe ``<run>`` came from,
the model, and the counts. Each file appears whole or not at all, so a retried
export simply writes them again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from blendserve import files
from blendserve.model_prep import MODEL_NAME
from blendserve.pipeline import database


@dataclass
class ExportReport:
    output_path: str  # successes, one JSON line each
    error_path: str  # engine errors and ingest rejects, one JSON line each
    manifest_path: str  # run ids, model and counts (JSON)
    outputs: int
    errors: int  # requests the engine failed
    rejected: int  # rows ingest rejected


OUTPUTS_QUERY = """
SELECT o.request_id, r.endpoint, o.status, o.text, o.finish_reason, o.num_prompt_tokens, o.num_output_tokens,
       o.error, epoch(o.finished_at)::BIGINT AS created
FROM outputs o JOIN requests r USING (run_id, request_id)
WHERE o.run_id = ? ORDER BY r.source_file, r.source_row
"""
REJECTS_QUERY = "SELECT source_file, source_row, raw, reason FROM rejects WHERE run_id = ? ORDER BY source_file, source_row"


def export_openai(db: str | Path, run_id: str, out_dir: str | Path) -> ExportReport:
    out_dir = Path(out_dir)
    paths = {kind: out_dir / f"{run_id}-{kind}.{ext}" for kind, ext in
             (("output", "jsonl"), ("errors", "jsonl"), ("manifest", "json"))}
    counts = {"outputs": 0, "errors": 0, "rejected": 0}
    with database.connect(db, read_only=True) as con, ExitStack() as stack:
        airflow_run_id, model = _run_info(con, run_id)
        ok_file, err_file = (stack.enter_context(files.staged_file(paths[k])).open("w", encoding="utf-8")
                             for k in ("output", "errors"))
        with ok_file, err_file:
            for n, row in enumerate(_rows(con, OUTPUTS_QUERY, run_id)):
                line = _line(run_id, n, row, model)
                (ok_file if line["error"] is None else err_file).write(json.dumps(line, ensure_ascii=False) + "\n")
                counts["outputs" if line["error"] is None else "errors"] += 1
            for n, row in enumerate(_rows(con, REJECTS_QUERY, run_id)):
                err_file.write(json.dumps(_reject_line(run_id, n, row), ensure_ascii=False) + "\n")
                counts["rejected"] += 1
    report = ExportReport(str(paths["output"]), str(paths["errors"]), str(paths["manifest"]), **counts)
    manifest = {"run_id": run_id, "airflow_run_id": airflow_run_id, "model": model, **asdict(report)}
    files.atomic_write_bytes(json.dumps(manifest, indent=2).encode(), paths["manifest"])
    return report


def _rows(con, query: str, run_id: str, batch: int = 10_000) -> Iterator[tuple]:
    cursor = con.execute(query, [run_id])
    while rows := cursor.fetchmany(batch):
        yield from rows


def _run_info(con, run_id: str) -> tuple[str | None, str]:
    """The Airflow run id ``run_id`` was made from, and the name of the model the run used."""
    row = con.execute("SELECT airflow_run_id, config_json FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        raise LookupError(f"run {run_id!r} is not in the runs table")
    model = json.loads(row[1]).get("model") or MODEL_NAME
    return row[0], Path(model).name


def _line(run_id: str, n: int, row: tuple, model: str) -> dict:
    request_id, endpoint, status, text, finish, prompt_tokens, output_tokens, error, created = row
    line_id = f"batch_req_{run_id}_{n}"
    if status != "ok":
        return {"id": line_id, "custom_id": request_id, "response": None,
                "error": {"code": "request_failed", "message": error}}
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": output_tokens,
             "total_tokens": prompt_tokens + output_tokens}
    if endpoint == "chat":
        body = {"object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}]}
    else:
        body = {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    body.update(id=f"{line_id}-resp", created=created, model=model, usage=usage)
    return {"id": line_id, "custom_id": request_id,
            "response": {"status_code": 200, "request_id": line_id, "body": body}, "error": None}


def _reject_line(run_id: str, n: int, row: tuple) -> dict:
    source_file, source_row, raw, reason = row
    return {"id": f"batch_reject_{run_id}_{n}", "custom_id": _custom_id(raw), "response": None,
            "error": {"code": "rejected_at_ingest", "message": f"{source_file} row {source_row}: {reason}",
                      "line": source_row}}


def _custom_id(raw: str) -> str | None:
    """The rejected record's custom_id, when it was a JSON object that had one."""
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    value = record.get("custom_id") if isinstance(record, dict) else None
    return value if isinstance(value, str) else None
