"""Stream raw records out of input files, one at a time, naming file and row.

A record that cannot even be read (bad JSON, bad UTF-8) comes out with its
``error`` set, so ingestion can reject it with a reason and go on.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from blendserve import files
from blendserve.config import ConfigError
from blendserve.files import StoragePath

if TYPE_CHECKING:
    import pyarrow as pa

RAW_LIMIT = 2000  # characters of the raw record kept for a reject
MAX_CSV_FIELD = 1 << 26  # characters in one CSV cell (the csv module's own limit, 131,072, is below a long prompt)
BOM = b"\xef\xbb\xbf"  # a byte-order mark: Windows editors start UTF-8 files with one
_SURROGATE = re.compile("[\udc80-\udcff]")  # an undecodable byte, as errors="surrogateescape" keeps it
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
    """A file or a glob, local or a URL, sorted, so runs are reproducible. A file whose name holds
    glob characters (``in[1].jsonl``) names itself, not the files the pattern would match."""
    literal = files.resolve(pattern, conn_id)
    found = [literal] if literal.is_file() else [p for p in files.expand(pattern, conn_id) if p.is_file()]
    if not found:
        raise FileNotFoundError(f"no input files match {pattern!r}")
    for path in found:  # before any is read: a wrong file in a glob fails the run at once, not midway
        _reader(path)
    return found


def read_records(path: StoragePath) -> Iterator[RawRecord]:
    yield from _reader(path)(path)


def _reader(path: StoragePath):  # type: ignore[no-untyped-def]
    suffix = path.suffix.lower()
    if suffix not in READERS:
        raise ConfigError(f"{path}: unsupported input format {suffix!r} (use .jsonl, .csv or .parquet)")
    return READERS[suffix]


def _truncate(text: str) -> str:
    return text if len(text) <= RAW_LIMIT else text[:RAW_LIMIT] + f"... [{len(text)} chars]"


def _read_jsonl(path: StoragePath) -> Iterator[RawRecord]:
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            if number == 1:
                line = line.removeprefix(BOM)  # editors on Windows write one; it is not part of the first record
            if not line.strip():
                continue  # blank lines are not records
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as err:
                raw = line.decode("utf-8", errors="replace")
                yield RawRecord(str(path), number, _truncate(raw), None, f"line is not valid UTF-8 (byte {err.start})")
                continue
            yield _json_record(str(path), number, text)


def _json_record(source: str, number: int, text: str) -> RawRecord:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        return RawRecord(source, number, _truncate(text), None, f"malformed JSON: {err.msg} at column {err.colno}")
    except ValueError as err:  # an integer beyond Python's digit limit
        return RawRecord(source, number, _truncate(text), None, f"JSON value not accepted: {err}".split(";")[0])
    except RecursionError:
        return RawRecord(source, number, _truncate(text), None, "JSON nested too deeply")
    if not isinstance(data, dict):
        return RawRecord(source, number, _truncate(text), None, "a record must be a JSON object")
    return RawRecord(source, number, _truncate(text.rstrip("\n")), data)


def _read_csv(path: StoragePath) -> Iterator[RawRecord]:
    """Rows stream from the file; a row with invalid UTF-8 or broken quoting is rejected alone."""
    csv.field_size_limit(max(csv.field_size_limit(), MAX_CSV_FIELD))
    with _CsvLines(path) as lines:
        rows = _csv_rows(lines)
        _, names, error = next(rows, (0, [], None))
        if error is not None:  # without column names no row can be read: the file is one reject
            yield RawRecord(str(path), 0, _truncate(_readable(lines.record_line)), None, f"CSV header: {error}")
            return
        names = [_readable(name) for name in names or []]
        for number, (line, cells, error) in enumerate(rows, start=1):
            raw = _truncate(_readable(lines.record_line if cells is None else json.dumps(
                dict(zip(names, cells)), ensure_ascii=False)))
            yield _csv_record(str(path), number, raw, names, cells, error or _not_utf8(cells, line))


def _csv_record(source: str, number: int, raw: str, names: list[str], cells: list[str] | None,
                error: str | None) -> RawRecord:
    if cells is not None and len(cells) > len(names):
        error = error or "row has more cells than the header has columns"
    if error is not None or cells is None:
        return RawRecord(source, number, raw, None, error)
    row = dict(zip(names, cells))
    try:
        return RawRecord(source, number, raw, _csv_values(row))
    except ValueError as err:
        return RawRecord(source, number, raw, None, str(err))


class _CsvLines:
    """The file's lines (``\n``, ``\r\n`` or ``\r``) for ``csv.reader``, with the line each record began on,
    so parsing can restart on the next line after a record whose quote never closed (else it would swallow
    the rest of the file). Bytes that are not UTF-8 pass through as surrogate escapes: only their row is
    rejected. A leading BOM is dropped."""

    def __init__(self, path: StoragePath) -> None:
        self.path = path
        self.file = self._open()
        self.number = 0  # lines read
        self.record_start: int | None = None  # the line the record being parsed began on
        self.record_line = ""  # that line's text

    def _open(self):  # type: ignore[no-untyped-def]
        return self.path.open("r", encoding="utf-8-sig", errors="surrogateescape", newline="")

    def __enter__(self) -> "_CsvLines":
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()

    def __iter__(self) -> "_CsvLines":
        return self

    def __next__(self) -> str:
        line = self.file.readline()
        if not line:
            raise StopIteration
        self.number += 1
        if self.record_start is None:
            self.record_start, self.record_line = self.number, line.rstrip("\r\n")
        return line

    def restart_after(self, line: int) -> None:
        """Read on from line ``line + 1`` (rare: reopening and skipping costs a pass over those lines)."""
        self.file.close()
        self.file = self._open()
        for self.number in range(1, line + 1):
            self.file.readline()


def _csv_rows(lines: _CsvLines) -> Iterator[tuple[int, list[str] | None, str | None]]:
    """(first line, cells, None) per record, or (first line, None, why) for one that cannot be parsed."""
    reader = csv.reader(lines, strict=True)
    while True:
        lines.record_start = None
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            start = lines.record_start or lines.number
            if str(err) == "unexpected end of data":  # a quote opened on that line never closed
                lines.restart_after(start)
                reader = csv.reader(lines, strict=True)
                yield start, None, f"unclosed quote starting on line {start}; the lines after it are read as rows"
            else:
                yield start, None, f"malformed CSV on line {lines.number}: {err}"
            continue
        if cells:  # blank lines are not records
            yield lines.record_start or lines.number, cells, None


def _not_utf8(cells: list[str] | None, line: int) -> str | None:
    if cells is not None and any(_SURROGATE.search(cell) for cell in cells):
        return f"row (line {line}) is not valid UTF-8"
    return None


def _readable(text: str) -> str:
    """Text with undecodable bytes (surrogate escapes) shown as U+FFFD, so it can be stored."""
    return text.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")


def _csv_values(row: dict) -> dict:
    """CSV cells are text: turn the known columns into numbers, lists and objects."""
    out: dict = {}
    for key, value in row.items():
        if value == "":
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
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        raise ValueError(f"column {column!r} has {value[:50]!r}, which is not a valid {getattr(parse, '__name__', 'value')}")


def _read_parquet(path: StoragePath) -> Iterator[RawRecord]:
    number = 0
    for batch in parquet_batches(path):
        if isinstance(batch, RawRecord):
            yield batch
            return
        yield from parquet_records(path, batch, number)
        number += batch.num_rows


def parquet_batches(path: StoragePath) -> Iterator["pa.RecordBatch | RawRecord"]:
    """The file's record batches; a file (or the rest of one) that Arrow cannot read ends them with one
    unparsed RawRecord naming why. Only the reading is guarded: what a caller does with a batch
    raises in the caller."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    number = 0
    with path.open("rb") as f:
        try:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=4096):
                yield batch
                number += batch.num_rows
        except (pa.ArrowException, OSError, ValueError) as err:
            where = "the file" if number == 0 else f"the rows after row {number}"
            yield RawRecord(str(path), number + 1, "", None, f"Parquet: {where} cannot be read ({err})")


def parquet_records(path: StoragePath, batch: "pa.RecordBatch", rows_before: int) -> Iterator[RawRecord]:
    """The batch's rows as records; ``rows_before``: rows of the file before this batch."""
    for number, row in enumerate(batch.to_pylist(), start=rows_before + 1):
        data = {k: v for k, v in row.items() if v is not None}
        yield RawRecord(str(path), number, _truncate(json.dumps(data, default=str, ensure_ascii=False)), data)


# file suffix -> its reader; the inbox offers exactly these files to ingest
READERS = {".jsonl": _read_jsonl, ".json": _read_jsonl, ".ndjson": _read_jsonl, ".csv": _read_csv,
           ".parquet": _read_parquet}
