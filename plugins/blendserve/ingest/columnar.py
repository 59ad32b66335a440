"""Parquet rows of plain token-id requests, checked and converted a record batch at a time.

``normalize`` checks a record field by field in Python, which at a million
requests means a Python int per prompt token. A Parquet row that is plainly
valid here (a printable string ``custom_id``, ``prompt_token_ids`` in the
vocabulary, sampling numbers in range, no text, chat or batch-API fields)
becomes a REQUEST_SCHEMA row with Arrow and numpy alone. Any other row goes
through ``normalize``, so every reason is worded in one place; these checks
only ever accept what ``normalize`` accepts.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from blendserve.ingest.normalize import Limits
from blendserve.ingest.readers import RAW_LIMIT, RawRecord
from blendserve.schema import REQUEST_SCHEMA

# a non-null value here needs the row path (text to tokenize, the batch API, stop strings, metadata to encode)
ROW_PATH_FIELDS = ("body", "url", "prompt", "messages", "max_completion_tokens", "stop", "metadata")
PRINTABLE_ID = r"^[ -~]*[!-~][ -~]*$"  # printable ASCII with something besides spaces (normalize: non-blank)
# field: (default when null, lowest, highest, lowest is exclusive)
NUMBERS = {
    "max_tokens": (None, 1, None, False),  # None: the limits' default / max_model_len
    "temperature": (0.0, 0.0, 2.0, False),
    "top_p": (1.0, 0.0, 1.0, True),
    "seed": (None, 0, 2**63 - 1, False),
    "expected_output_tokens": (None, 0, 10**9, False),
    "sim_output_tokens": (None, 0, 10**9, False),
}
INTEGER_FIELDS = ("max_tokens", "seed", "expected_output_tokens", "sim_output_tokens")


def plain_rows(batch: pa.RecordBatch, limits: Limits) -> np.ndarray:
    """(n,) bool: the rows of ``batch`` that pass ``normalize`` as token-id requests (prompt length and
    duplicate ids aside: the sink checks those for every row)."""
    names = set(batch.schema.names)
    if not {"custom_id", "prompt_token_ids"} <= names:
        return np.zeros(len(batch), dtype=bool)
    plain = _ids_ok(batch.column("custom_id")) & _tokens_ok(batch.column("prompt_token_ids"), limits.vocab_size)
    for name in ROW_PATH_FIELDS:
        if name in names:
            plain &= _valid_mask(batch.column(name).is_null())
    for name in NUMBERS:
        if name in names:
            plain &= _number_ok(batch.column(name), name, limits)
    return plain


def _valid_mask(mask: pa.Array) -> np.ndarray:
    return mask.fill_null(False).to_numpy(zero_copy_only=False).astype(bool)


def _ids_ok(ids: pa.Array) -> np.ndarray:
    if not pa.types.is_string(ids.type):
        return np.zeros(len(ids), dtype=bool)
    return _valid_mask(pc.match_substring_regex(ids, PRINTABLE_ID))


def _tokens_ok(lists: pa.Array, vocab_size: int) -> np.ndarray:
    if not pa.types.is_list(lists.type) or not _is_int(lists.type.value_type):
        return np.zeros(len(lists), dtype=bool)
    ok = _valid_mask(pc.greater(pc.list_value_length(lists), 0))  # null lists: null length, not ok
    values = lists.flatten()
    numbers = values.fill_null(-1).to_numpy(zero_copy_only=False)
    bad = (numbers < 0) | (numbers >= vocab_size)  # a null id is bad too
    ok[pc.list_parent_indices(lists).to_numpy()[bad]] = False
    return ok


def _is_int(t: pa.DataType) -> bool:
    return pa.types.is_signed_integer(t) or pa.types.is_unsigned_integer(t) and t.bit_width < 64


def _number_ok(column: pa.Array, name: str, limits: Limits) -> np.ndarray:
    _, low, high, exclusive = NUMBERS[name]
    high = limits.max_model_len if high is None else high
    if not (_is_int(column.type) or (name not in INTEGER_FIELDS and pa.types.is_floating(column.type))):
        return _valid_mask(column.is_null())
    values = column.to_numpy(zero_copy_only=False).astype(np.float64)  # nulls: NaN
    above = values > low if exclusive else values >= low
    return (above & (values <= high)) | _valid_mask(column.is_null())  # NaN fails both, as in normalize


def request_table(batch: pa.RecordBatch, rows: np.ndarray, source_file: str, rows_before: int,
                  limits: Limits) -> pa.Table:
    """REQUEST_SCHEMA rows for ``rows`` (positions of ``plain_rows`` in ``batch``), as ``normalize`` and the
    ingest sink would write them."""
    batch = batch.take(pa.array(rows, pa.int64()))
    lists = batch.column("prompt_token_ids").cast(pa.list_(pa.int32()))
    lens = pc.list_value_length(lists).to_numpy().astype(np.int32)
    n = len(rows)
    max_tokens = _filled(batch, "max_tokens", limits.default_max_tokens).astype(np.int64)
    return pa.table({
        "request_id": batch.column("custom_id"),
        "endpoint": pa.array(["tokens"] * n, pa.string()),
        "prompt": pa.nulls(n, pa.string()),
        "messages_json": pa.nulls(n, pa.string()),
        "prompt_token_ids": lists,
        "num_prompt_tokens": lens,
        # the engine refuses prompt + max_tokens beyond the context: capped, as for every request
        "max_tokens": np.minimum(max_tokens, limits.max_model_len - lens).astype(np.int32),
        "temperature": _filled(batch, "temperature", 0.0).astype(np.float32),
        "top_p": _filled(batch, "top_p", 1.0).astype(np.float32),
        "seed": _nullable(batch, "seed", pa.int64(), n),
        "stop_json": pa.nulls(n, pa.string()),
        "expected_output_tokens": _nullable(batch, "expected_output_tokens", pa.int32(), n),
        "sim_output_tokens": _nullable(batch, "sim_output_tokens", pa.int32(), n),
        "metadata_json": pa.nulls(n, pa.string()),
        "source_file": pa.array([source_file] * n, pa.string()),
        "source_row": rows.astype(np.int64) + rows_before + 1,
    }, schema=REQUEST_SCHEMA)


def _filled(batch: pa.RecordBatch, name: str, default: float) -> np.ndarray:
    if name not in batch.schema.names:
        return np.full(len(batch), default)
    return batch.column(name).fill_null(default).to_numpy(zero_copy_only=False)


def _nullable(batch: pa.RecordBatch, name: str, type_: pa.DataType, n: int) -> pa.Array:
    return batch.column(name).cast(type_) if name in batch.schema.names else pa.nulls(n, type_)


def token_row_record(path: object, batch: pa.RecordBatch, row: int, rows_before: int) -> RawRecord:
    """The reject record of a plain row, its ``raw`` as ``readers.parquet_records`` words it, without
    writing out every token id: only enough of them for RAW_LIMIT characters, and the JSON length counted."""
    ids = batch.column("prompt_token_ids")[row].values.to_numpy(zero_copy_only=False)
    data = {k: v for k, v in batch.slice(row, 1).drop_columns(["prompt_token_ids"]).to_pylist()[0].items()
            if v is not None}
    names = [n for n in batch.schema.names if n in data or n == "prompt_token_ids"]

    def text(token_ids: list[int]) -> str:
        ordered = {n: token_ids if n == "prompt_token_ids" else data[n] for n in names}  # the column order
        return json.dumps(ordered, default=str, ensure_ascii=False)

    # "[1, 23]": digits, ", " between ids, brackets; ids are non-negative here
    digits = int(np.sum(np.floor(np.log10(np.maximum(ids, 1))).astype(np.int64) + 1))
    length = len(text([])) + digits + 2 * (len(ids) - 1)
    head = text(ids[: RAW_LIMIT // 3 + 1].tolist())  # each id takes at least 3 characters: past RAW_LIMIT
    raw = head if length <= RAW_LIMIT else head[:RAW_LIMIT] + f"... [{length} chars]"  # as readers._truncate
    return RawRecord(str(path), rows_before + row + 1, raw, None)
