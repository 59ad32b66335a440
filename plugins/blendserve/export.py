"""Export a run's outputs as OpenAI batch output and error files (JSONL).

Users of the OpenAI batch API already have code that reads these files, matched
by ``custom_id``: successes go to ``<run>-output.jsonl`` in the response shape
of their endpoint (chat.completion or text_completion, with usage), failures
to ``<run>-errors.jsonl``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from blendserve import store


@dataclass
class ExportReport:
    output_path: str  # successes, one JSON line each
    error_path: str  # failures, one JSON line each
    outputs: int
    errors: int


QUERY = """
SELECT o.request_id, r.endpoint, o.status, o.text, o.finish_reason, o.num_prompt_tokens, o.num_output_tokens,
       o.error, epoch(o.finished_at)::BIGINT AS created
FROM outputs o JOIN requests r USING (run_id, request_id)
WHERE o.run_id = ? ORDER BY r.source_file, r.source_row
"""


def export_openai(db: str | Path, run_id: str, out_dir: str | Path, model: str = "smollm2-135m-instruct") -> ExportReport:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    output_path, error_path = out_dir / f"{run_id}-output.jsonl", out_dir / f"{run_id}-errors.jsonl"
    with store.connect(db, read_only=True) as con:
        rows = con.execute(QUERY, [run_id]).fetchall()
    outputs = errors = 0
    with open(output_path, "w", encoding="utf-8") as ok_file, open(error_path, "w", encoding="utf-8") as err_file:
        for n, row in enumerate(rows):
            line = _line(run_id, n, row, model)
            if line["error"] is None:
                ok_file.write(json.dumps(line, ensure_ascii=False) + "\n")
                outputs += 1
            else:
                err_file.write(json.dumps(line, ensure_ascii=False) + "\n")
                errors += 1
    return ExportReport(str(output_path), str(error_path), outputs, errors)


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
