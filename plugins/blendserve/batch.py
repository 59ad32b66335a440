"""A columnar batch of requests for the planner and the simulator.

Token ids are stored CSR-style (one flat array plus offsets, exactly Arrow's
list layout), so a million requests cost a few arrays, not a million objects.
A batch taken from another (``take``) shares its token array and locates each
prompt by ``token_starts``: reordering a million prompts copies no token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

UNKNOWN = -1  # marks an unknown length in the int32 length arrays
# The metadata keys whose value tags a request's task (the first one a request's metadata holds): with its
# source file, a feature of the request known before it runs (``sampling.strata``).
TAG_KEYS = ("task", "source")
_TAG = r'"(?:' + "|".join(TAG_KEYS) + r')"\s*:\s*"(?P<tag>[^"]*)"'


@dataclass
class RequestBatch:
    request_ids: np.ndarray  # (n,) str: the user's custom_id
    token_offsets: np.ndarray  # (n + 1,) int64: prompt i is tokens[offsets[i]:offsets[i + 1]]
    tokens: np.ndarray  # (total prompt tokens,) int32, after the chat template
    max_tokens: np.ndarray  # (n,) int32: the request's own cap on output tokens
    expected_output_tokens: np.ndarray  # (n,) int32, UNKNOWN if not known in advance
    sim_output_tokens: np.ndarray  # (n,) int32 true lengths for the simulator only, UNKNOWN if absent
    # (n,) int64 where prompt i starts in ``tokens`` when it is shared with the batch it was taken from;
    # None: contiguous, prompt i starts at token_offsets[i] (offsets then only give the lengths)
    token_starts: np.ndarray | None = None
    # (n,) int64 the request's group as the user's data gives it: its source file and metadata task tag
    # (TAG_KEYS); None: one group
    group: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.request_ids)

    @property
    def prompt_lens(self) -> np.ndarray:
        return np.diff(self.token_offsets).astype(np.int64)

    @property
    def prompt_starts(self) -> np.ndarray:
        """(n,) int64: where each prompt starts in ``tokens``."""
        return self.token_offsets[:-1] if self.token_starts is None else self.token_starts

    def prompt(self, i: int) -> np.ndarray:
        start = self.token_offsets[i] if self.token_starts is None else self.token_starts[i]
        return self.tokens[start : start + self.token_offsets[i + 1] - self.token_offsets[i]]

    def take(self, indices: np.ndarray) -> "RequestBatch":
        """A batch of the given rows, in the given order, sharing this batch's tokens (no token is copied)."""
        indices = np.asarray(indices, dtype=np.int64)
        offsets = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(self.prompt_lens[indices], out=offsets[1:])
        return RequestBatch(
            request_ids=self.request_ids[indices],
            token_offsets=offsets,
            tokens=self.tokens,
            max_tokens=self.max_tokens[indices],
            expected_output_tokens=self.expected_output_tokens[indices],
            sim_output_tokens=self.sim_output_tokens[indices],
            token_starts=self.prompt_starts[indices],
            group=None if self.group is None else self.group[indices],
        )

    @classmethod
    def from_table(cls, table: pa.Table) -> "RequestBatch":
        """From a table with REQUEST_SCHEMA's columns (extra columns are ignored)."""
        ids = table.column("request_id").combine_chunks()
        prompts = table.column("prompt_token_ids").combine_chunks()
        offsets = prompts.offsets.to_numpy().astype(np.int64)
        tokens = prompts.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
        tokens = tokens[offsets[0] : offsets[-1]]
        offsets = offsets - offsets[0]
        return cls(
            request_ids=np.asarray(ids.to_pylist(), dtype=object),
            token_offsets=offsets,
            tokens=tokens,
            max_tokens=_int_column(table, "max_tokens", 256),
            expected_output_tokens=_int_column(table, "expected_output_tokens", UNKNOWN),
            sim_output_tokens=_int_column(table, "sim_output_tokens", UNKNOWN),
            group=request_groups(table),
        )

    @classmethod
    def from_parquet(cls, path: str | Path) -> "RequestBatch":
        present = set(pq.read_schema(path).names)
        if "num_prompt_tokens" in present:
            return read_batch(ds.dataset(str(path), format="parquet"))[0]
        columns = ["request_id", "prompt_token_ids", "max_tokens", "expected_output_tokens", "sim_output_tokens",
                   *GROUP_COLUMNS]
        return cls.from_table(pq.read_table(path, columns=[c for c in columns if c in present]))


GROUP_COLUMNS = ["source_file", "metadata_json"]
BATCH_COLUMNS = ["request_id", "num_prompt_tokens", "max_tokens", "expected_output_tokens", "sim_output_tokens",
                 *GROUP_COLUMNS]


def request_groups(table: pa.Table) -> np.ndarray | None:
    """(n,) group of each row: its source file and metadata task tag (``TAG_KEYS``) together; None when the
    table has neither column."""
    parts = []
    if "source_file" in table.column_names:
        parts.append(table.column("source_file").combine_chunks().cast(pa.string()).fill_null(""))
    if "metadata_json" in table.column_names:
        meta = table.column("metadata_json").combine_chunks().cast(pa.string()).fill_null("")
        parts.append(pc.struct_field(pc.extract_regex(meta, _TAG), [0]).fill_null(""))
    if not parts:
        return None
    key = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, "\x00")
    return pc.dictionary_encode(key).indices.to_numpy().astype(np.int64)


def read_batch(dataset: ds.Dataset, columns: list[str] = (), request_ids: list[str] | None = None
               ) -> tuple[RequestBatch, pa.Table]:
    """The batch of a request dataset (``num_prompt_tokens`` beside ``prompt_token_ids``, as in REQUEST_SCHEMA),
    only ``request_ids``' rows when given, in file order; and the other ``columns`` of those rows.

    Token ids are copied once, a record batch at a time, into one array sized
    by ``num_prompt_tokens``: the peak is the batch's tokens plus one record
    batch, not the Arrow table and its concatenated copy.
    """
    present = set(dataset.schema.names)
    small = dataset.to_table(columns=[c for c in BATCH_COLUMNS if c in present] + list(columns))
    keep = None if request_ids is None else pc.is_in(small.column("request_id"),
                                                      value_set=pa.array(request_ids, pa.string()))
    if keep is not None:
        keep = keep.combine_chunks() if keep.num_chunks else pa.array([], pa.bool_())
        small = small.filter(keep)
    lens = small.column("num_prompt_tokens").to_numpy().astype(np.int64)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    batch = RequestBatch(
        request_ids=np.asarray(small.column("request_id").to_pylist(), dtype=object),
        token_offsets=offsets,
        tokens=_read_tokens(dataset, keep, int(offsets[-1])),
        max_tokens=_int_column(small, "max_tokens", 256),
        expected_output_tokens=_int_column(small, "expected_output_tokens", UNKNOWN),
        sim_output_tokens=_int_column(small, "sim_output_tokens", UNKNOWN),
        group=request_groups(small),
    )
    return batch, small.select(list(columns))


def _read_tokens(dataset: ds.Dataset, keep: pa.BooleanArray | None, total: int) -> np.ndarray:
    tokens = np.empty(total, dtype=np.int32)
    filled = row = 0
    # one thread keeps the record batches in file order, the order of the small columns; pre-buffering
    # would hold the whole column's compressed pages (2.4 GB more at 1M requests)
    no_prebuffer = ds.ParquetFragmentScanOptions(pre_buffer=False)
    for record_batch in dataset.to_batches(columns=["prompt_token_ids"], use_threads=False, batch_size=4096,
                                           fragment_scan_options=no_prebuffer):
        lists = record_batch.column(0)
        if keep is not None:
            lists = lists.filter(keep.slice(row, len(lists)))
        row += record_batch.num_rows
        values = lists.flatten().to_numpy(zero_copy_only=False)
        tokens[filled : filled + len(values)] = values
        filled += len(values)
    if filled != total:
        raise ValueError(f"prompt_token_ids hold {filled} tokens, num_prompt_tokens says {total}")
    return tokens


def _int_column(table: pa.Table, name: str, default: int) -> np.ndarray:
    if name not in table.column_names:
        return np.full(table.num_rows, default, dtype=np.int32)
    column = table.column(name).combine_chunks().fill_null(default)
    return column.to_numpy(zero_copy_only=False).astype(np.int32)
