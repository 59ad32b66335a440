"""Stream raw records out of input files, one at a time, naming file and row.

A record that cannot even be read (bad JSON, bad UTF-8) comes out with its
``error`` set, so ingestion can reject it with a reason and go on.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from blendserve import storage
from blendserve.storage import StoragePath

if TYPE_CHECKING:
    import pyarrow as pa

RAW_LIMIT = 2000  # characters of the raw record kept for a reject
NUMERIC_CSV_COLUMNS = {"max_tokens", "seed", "expected_output_tokens", "sim_output_tokens"}
FLOAT_CSV_COLUMNS = {"temperature", "top_p"}
JSON_CSV_COLUMNS = {"messages", "prompt_token_ids", "stop", "metadata"}


@dataclass
class RawRecord:
    source_file: str  # path of the file it came from
    source_row: int  # 1-based line (JSONL) or data row (CSV, Parquet)
    raw: str  # the record as text, truncated to RAW_LIMIT
    data: dict | None  # parsed record, None when it could not be parsed
    error: str | None = None  # why it could not be parsed


def expand_inputs(pattern: str, conn_id: str | None = None) -> list[StoragePath]:
    """A file or a glob, local or a URL, sorted, so runs are reproducible."""
    files = [p for p in storage.expand(pattern, conn_id) if p.is_file()]
    if not files:
        raise FileNotFoundError(f"no input files match {pattern!r}")
    return files


def read_records(path: StoragePath) -> Iterator[RawRecord]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        yield from _read_jsonl(path)
    elif suffix == ".csv":
        yield from _read_csv(path)
    elif suffix == ".parquet":
        yield from _read_parquet(path)
    else:
        raise ValueError(f"{path}: unsupported input format {suffix!r} (use .jsonl, .csv or .parquet)")


def _truncate(text: str) -> str:
    return text if len(text) <= RAW_LIMIT else text[:RAW_LIMIT] + f"... [{len(text)} chars]"


def _read_jsonl(path: StoragePath) -> Iterator[RawRecord]:
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue  # blank lines are not records
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as err:
                raw = line.decode("utf-8", errors="replace")
                yield RawRecord(str(path), number, _truncate(raw), None, f"line is not valid UTF-8 (byte {err.start})")
                continue
            try:
                data = json.loads(text)
            except json.JSONDecodeError as err:
                yield RawRecord(str(path), number, _truncate(text), None, f"malformed JSON: {err.msg} at column {err.colno}")
                continue
            if not isinstance(data, dict):
                yield RawRecord(str(path), number, _truncate(text), None, "a record must be a JSON object")
                continue
            yield RawRecord(str(path), number, _truncate(text.rstrip("\n")), data)


def _read_csv(path: StoragePath) -> Iterator[RawRecord]:
    raw_bytes = path.read_bytes()
    try:
        text = raw_bytes.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        yield RawRecord(str(path), 0, "", None, f"file is not valid UTF-8 (byte {err.start})")
        return
    reader = csv.DictReader(io.StringIO(text, newline=""))
    for number, row in enumerate(reader, start=1):
        raw = _truncate(json.dumps(row, ensure_ascii=False))
        try:
            yield RawRecord(str(path), number, raw, _csv_values(row))
        except ValueError as err:
            yield RawRecord(str(path), number, raw, None, str(err))


def _csv_values(row: dict) -> dict:
    """CSV cells are text: turn the known columns into numbers, lists and objects."""
    out: dict = {}
    for key, value in row.items():
        if key is None:
            raise ValueError("row has more cells than the header has columns")
        if value is None or value == "":
            continue
        if key in NUMERIC_CSV_COLUMNS:
            out[key] = _parse(value, int, key)
        elif key in FLOAT_CSV_COLUMNS:
            out[key] = _parse(value, float, key)
        elif key in JSON_CSV_COLUMNS and value.lstrip()[:1] in "[{":
            out[key] = _parse(value, json.loads, key)
        else:
            out[key] = value
    return out


def _parse(value: str, parse, column: str):
    try:
        return parse(value)
    except (ValueError, json.JSONDecodeError):
        raise ValueError(f"column {column!r} has {value[:50]!r}, which is not a valid {getattr(parse, '__name__', 'value')}")


def _read_parquet(path: StoragePath) -> Iterator[RawRecord]:
    number = 0
    for batch in parquet_batches(path):
        yield from parquet_records(path, batch, number)
        number += batch.num_rows


def parquet_batches(path: StoragePath) -> Iterator["pa.RecordBatch"]:
    import pyarrow.parquet as pq

    with path.open("rb") as f:
        yield from pq.ParquetFile(f).iter_batches(batch_size=4096)


def parquet_records(path: StoragePath, batch: "pa.RecordBatch", rows_before: int) -> Iterator[RawRecord]:
    """The batch's rows as records; ``rows_before``: rows of the file before this batch."""
    for number, row in enumerate(batch.to_pylist(), start=rows_before + 1):
        data = {k: v for k, v in row.items() if v is not None}
        yield RawRecord(str(path), number, _truncate(json.dumps(data, default=str, ensure_ascii=False)), data)
