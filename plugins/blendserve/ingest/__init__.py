"""Ingestion: input files -> normalized requests Parquet + rejects Parquet.

Streams records in chunks (memory stays flat), rejects bad ones with a
reason naming file and row, and checks that rows read = accepted + rejected.
Inputs and outputs may be object-storage URLs; both Parquet files appear whole
or not at all (``files.staged_file``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from blendserve import files
from blendserve.files import PathLike, StoragePath
from blendserve.ingest.columnar import plain_rows, request_table, token_row_record
from blendserve.ingest.normalize import Limits, Normalized, Reject, normalize
from blendserve.ingest.readers import RawRecord, expand_inputs, parquet_batches, parquet_records, read_records
from blendserve.ingest.tokenize import PromptTokenizer
from blendserve.schema import REJECT_SCHEMA, REQUEST_SCHEMA

log = logging.getLogger(__name__)
CHUNK_ROWS = 2048  # records tokenized and written together


@dataclass
class IngestReport:
    files: int  # input files read
    read: int  # records read (blank lines are not records)
    accepted: int  # rows in requests.parquet
    rejected: int  # rows in rejects.parquet
    requests_path: str
    rejects_path: str

    def check(self) -> None:
        if self.read != self.accepted + self.rejected:
            raise AssertionError(f"ingest lost rows: read {self.read} != accepted {self.accepted} + rejected {self.rejected}")


def ingest(pattern: str, requests_path: PathLike, rejects_path: PathLike, tokenizer: PromptTokenizer,
           limits: Limits, conn_id: str | None = None) -> IngestReport:
    """``conn_id``: the Airflow connection for URL inputs and outputs (None: credentials from the environment)."""
    inputs = expand_inputs(pattern, conn_id)
    with files.staged_file(requests_path) as requests_file, files.staged_file(rejects_path) as rejects_file:
        sink = _Sink(requests_file, rejects_file, tokenizer, limits)
        for path in inputs:
            log.info("ingesting %s", path)
            if path.suffix.lower() == ".parquet":
                _add_parquet(sink, path)
                continue
            for record in read_records(path):
                sink.add(record)
        sink.close()
    report = IngestReport(len(inputs), sink.read, sink.accepted, sink.rejected, str(requests_path), str(rejects_path))
    report.check()
    log.info("ingest: read %d, accepted %d, rejected %d", report.read, report.accepted, report.rejected)
    if not report.accepted:  # the run still finishes: every row is in rejects, with its reason
        log.warning("ingest accepted no request from %s (%d rejected): the run will have no outputs",
                    pattern, report.rejected)
    return report


def _add_parquet(sink: "_Sink", path: StoragePath) -> None:
    """A batch at a time: plain token-id rows as columns, the others row by row."""
    rows_before = 0
    for batch in parquet_batches(path):
        if isinstance(batch, RawRecord):  # the rest of the file cannot be read: one reject says why
            sink.add(batch)
            return
        sink.add_columns(path, batch, rows_before)
        rows_before += batch.num_rows


class _Sink:
    """Collects records, tokenizes them a chunk at a time, writes both Parquet files."""

    def __init__(self, requests_path: Path, rejects_path: Path, tokenizer: PromptTokenizer, limits: Limits) -> None:
        self.tokenizer, self.limits = tokenizer, limits
        self.requests = pq.ParquetWriter(requests_path, REQUEST_SCHEMA)
        self.rejects = pq.ParquetWriter(rejects_path, REJECT_SCHEMA)
        self.pending: list[tuple[RawRecord, Normalized]] = []
        self.reject_rows: list[dict] = []
        self.seen_ids: set[str] = set()  # ids of accepted rows
        self.read = self.accepted = self.rejected = 0

    def add(self, record: RawRecord) -> None:
        if self._admit(record) and len(self.pending) >= CHUNK_ROWS:
            self._flush_requests()

    def _admit(self, record: RawRecord) -> bool:
        """Reject the record or queue it for tokenizing; True when queued."""
        self.read += 1
        try:
            if record.error is not None:
                raise Reject(record.error)
            request = normalize(record.data, self.limits)
            if request.request_id in self.seen_ids:
                raise Reject(_duplicate(request.request_id))
        except Reject as err:
            self._reject(record, str(err))
            return False
        # a pending row with this id may still be rejected as too long: _flush_requests decides duplicates
        self.pending.append((record, request))
        return True

    def add_columns(self, path: StoragePath, batch: pa.RecordBatch, rows_before: int) -> None:
        """A Parquet batch, in row order: ``plain_rows`` as columns (only a duplicate id or a too-long prompt
        rejects one), the others through ``normalize``; written as one table in the file's order."""
        self._flush_requests()  # what came before this batch is written before it
        plain = plain_rows(batch, self.limits)
        if plain.any():
            ids = batch.column("custom_id").to_pylist()
            lens = pc.list_value_length(batch.column("prompt_token_ids")).to_numpy(zero_copy_only=False)
        keep = []
        for row in range(batch.num_rows):
            if not plain[row]:
                self._admit(next(parquet_records(path, batch.slice(row, 1), rows_before + row)))
                continue
            self.read += 1
            reason = self._columnar_reject(ids[row], int(lens[row]))
            if reason is None:
                self.seen_ids.add(ids[row])
                keep.append(row)
            else:
                self._reject(token_row_record(path, batch, row, rows_before), reason)
        rows = np.array(keep, dtype=np.int64)
        self._flush_requests(request_table(batch, rows, str(path), rows_before, self.limits) if keep else None)

    def _columnar_reject(self, request_id: str, length: int) -> str | None:
        # the checks _admit() and _flush_requests() make of a token-id request
        if request_id in self.seen_ids:
            return _duplicate(request_id)
        if length >= self.limits.max_model_len:
            return _too_long(length, self.limits.max_model_len)
        return None

    def close(self) -> None:
        self._flush_requests()
        self._flush_rejects()
        self.requests.close()
        self.rejects.close()

    def _reject(self, record: RawRecord, reason: str) -> None:
        self.rejected += 1
        self.reject_rows.append(
            {"source_file": record.source_file, "source_row": record.source_row, "raw": record.raw, "reason": reason}
        )
        if len(self.reject_rows) >= CHUNK_ROWS:
            self._flush_rejects()

    def _flush_rejects(self) -> None:
        if self.reject_rows:
            self.rejects.write_table(pa.Table.from_pylist(self.reject_rows, schema=REJECT_SCHEMA))
            self.reject_rows = []

    def _flush_requests(self, columns: pa.Table | None = None) -> None:
        """Tokenize and write the pending rows; ``columns``: rows of the same Parquet batch made by
        ``request_table``, merged in by source row."""
        token_ids = self._tokenize([request for _, request in self.pending])
        rows = []
        for (record, request), ids in zip(self.pending, token_ids):
            if len(ids) >= self.limits.max_model_len:  # a later valid row may reuse the id
                self._reject(record, _too_long(len(ids), self.limits.max_model_len))
                continue
            if request.request_id in self.seen_ids:
                self._reject(record, _duplicate(request.request_id))
                continue
            self.seen_ids.add(request.request_id)
            rows.append(_request_row(record, request, ids, self.limits.max_model_len))
        table = pa.Table.from_pylist(rows, schema=REQUEST_SCHEMA)
        if columns is not None and columns.num_rows:
            table = pa.concat_tables([table, columns]).sort_by("source_row") if rows else columns
        if table.num_rows:
            self.requests.write_table(table)
            self.accepted += table.num_rows
        self.pending = []

    def _tokenize(self, requests: list[Normalized]) -> list[list[int]]:
        chats = [r.messages for r in requests if r.endpoint == "chat"]
        texts = [r.prompt for r in requests if r.endpoint == "completion"]
        chat_ids = iter(self.tokenizer.encode_chats(chats))
        text_ids = iter(self.tokenizer.encode_texts(texts))
        by_endpoint = {"chat": chat_ids, "completion": text_ids}
        return [r.prompt_token_ids if r.endpoint == "tokens" else next(by_endpoint[r.endpoint]) for r in requests]


def _duplicate(request_id: str) -> str:
    return f"duplicate custom_id {request_id!r}: an earlier row has it (kept the first)"


def _too_long(tokens: int, max_model_len: int) -> str:
    return f"prompt has {tokens} tokens; the model's context is {max_model_len}"


def _request_row(record: RawRecord, request: Normalized, ids: list[int], max_model_len: int) -> dict:
    return {
        "request_id": request.request_id,
        "endpoint": request.endpoint,
        "prompt": request.prompt,
        "messages_json": None if request.messages is None else json.dumps(request.messages, ensure_ascii=False),
        "prompt_token_ids": ids,
        "num_prompt_tokens": len(ids),
        # The engine refuses prompt + max_tokens beyond the context: cap here, visibly.
        "max_tokens": min(request.max_tokens, max_model_len - len(ids)),
        "temperature": request.temperature,
        "top_p": request.top_p,
        "seed": request.seed,
        "stop_json": None if request.stop is None else json.dumps(request.stop),
        "expected_output_tokens": request.expected_output_tokens,
        "sim_output_tokens": request.sim_output_tokens,
        "metadata_json": request.metadata_json,
        "source_file": record.source_file,
        "source_row": record.source_row,
    }
