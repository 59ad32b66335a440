"""Shard part files: how a shard commits results so a retry can resume.

Results are buffered and written every ``part_rows`` rows as one Parquet file,
atomically (``blendserve.files``: rename on disk, one put in object storage):
a file either holds a whole committed batch or does not exist. A crash loses at
most the uncommitted batch.
"""

from __future__ import annotations

import json

import pyarrow as pa

from blendserve import files
from blendserve.engines.base import EngineResult
from blendserve.files import StoragePath
from blendserve.schema import RESULT_SCHEMA

PART_GLOB = "part-*.parquet"
STATS_FILE = "stats.json"  # per shard: what its last serving wrote (served, tokens, wall seconds, when)


def committed_lengths(shard_dir: StoragePath) -> dict[str, int]:
    """Request id -> output tokens of every result already committed in this shard (an error counts 0).

    The keys are what a retry skips; the lengths are what the shard's warm-up
    sample already taught, so a resumed shard plans as the first try did.
    """
    committed = files.list_parts(shard_dir, PART_GLOB)
    table = files.read_parquet(committed, columns=["request_id", "num_output_tokens"], schema=RESULT_SCHEMA)
    return {i: n or 0 for i, n in zip(table.column("request_id").to_pylist(),
                                      table.column("num_output_tokens").to_pylist())}


class PartWriter:
    def __init__(self, shard_dir: StoragePath, run_id: str, shard: int, engine: str, part_rows: int) -> None:
        self.dir, self.run_id, self.shard, self.engine, self.part_rows = shard_dir, run_id, shard, engine, part_rows
        files.ensure_dir(self.dir)
        self.buffer: list[dict] = []
        self.next_part = len(files.list_parts(shard_dir, PART_GLOB))
        self.committed = 0  # rows committed by this writer

    def add(self, result: EngineResult) -> None:
        row = dict(vars(result))
        row.update(run_id=self.run_id, shard=self.shard, engine=self.engine)
        self.buffer.append(row)
        if len(self.buffer) >= self.part_rows:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        table = pa.Table.from_pylist(self.buffer, schema=RESULT_SCHEMA)
        while True:
            try:
                files.atomic_write_parquet(table, self.dir / f"part-{self.next_part:05d}.parquet", overwrite=False)
                break
            except FileExistsError:  # another attempt wrote this number: never overwrite a commit
                self.next_part += 1
        self.committed += len(self.buffer)
        self.next_part += 1
        self.buffer = []


def shard_stats(parts_dir: StoragePath) -> list[dict]:
    """Every shard's ``STATS_FILE`` under a run's parts folder."""
    return [json.loads(p.read_text()) for p in files.list_parts(parts_dir, f"shard-*/{STATS_FILE}")]
