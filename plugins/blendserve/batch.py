"""A columnar batch of requests for the planner and the simulator.

Token ids are stored CSR-style (one flat array plus offsets, exactly Arrow's
list layout), so a million requests cost a few arrays, not a million objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

UNKNOWN = -1  # marks an unknown length in the int32 length arrays


@dataclass
class RequestBatch:
    request_ids: np.ndarray  # (n,) str: the user's custom_id
    token_offsets: np.ndarray  # (n + 1,) int64: prompt i is tokens[offsets[i]:offsets[i + 1]]
    tokens: np.ndarray  # (total prompt tokens,) int32, after the chat template
    max_tokens: np.ndarray  # (n,) int32: the request's own cap on output tokens
    expected_output_tokens: np.ndarray  # (n,) int32, UNKNOWN if not known in advance
    sim_output_tokens: np.ndarray  # (n,) int32 true lengths for the simulator only, UNKNOWN if absent

    def __len__(self) -> int:
        return len(self.request_ids)

    @property
    def prompt_lens(self) -> np.ndarray:
        return np.diff(self.token_offsets).astype(np.int64)

    def prompt(self, i: int) -> np.ndarray:
        return self.tokens[self.token_offsets[i] : self.token_offsets[i + 1]]

    def take(self, indices: np.ndarray) -> "RequestBatch":
        """A new batch of the given rows, in the given order."""
        indices = np.asarray(indices, dtype=np.int64)
        lens = self.prompt_lens[indices]
        offsets = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        starts = self.token_offsets[indices]
        gather = np.repeat(starts - offsets[:-1], lens) + np.arange(offsets[-1], dtype=np.int64)
        return RequestBatch(
            request_ids=self.request_ids[indices],
            token_offsets=offsets,
            tokens=self.tokens[gather],
            max_tokens=self.max_tokens[indices],
            expected_output_tokens=self.expected_output_tokens[indices],
            sim_output_tokens=self.sim_output_tokens[indices],
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
        )

    @classmethod
    def from_parquet(cls, path: str | Path) -> "RequestBatch":
        columns = ["request_id", "prompt_token_ids", "max_tokens", "expected_output_tokens", "sim_output_tokens"]
        present = set(pq.read_schema(path).names)
        return cls.from_table(pq.read_table(path, columns=[c for c in columns if c in present]))


def _int_column(table: pa.Table, name: str, default: int) -> np.ndarray:
    if name not in table.column_names:
        return np.full(table.num_rows, default, dtype=np.int32)
    column = table.column(name).combine_chunks().fill_null(default)
    return column.to_numpy(zero_copy_only=False).astype(np.int32)
