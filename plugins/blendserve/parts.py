"""Shard part files: how a shard commits results so a retry can resume.

Results are buffered and written every ``part_rows`` rows as one Parquet file,
first under a temporary name and then renamed: a file either holds a whole
committed batch or does not exist. A crash loses at most the uncommitted batch.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from blendserve.engines.base import EngineResult
from blendserve.schema import RESULT_SCHEMA

PART_GLOB = "part-*.parquet"


def part_files(shard_dir: Path) -> list[Path]:
    return sorted(shard_dir.glob(PART_GLOB))


def committed_ids(shard_dir: Path) -> set[str]:
    """Request ids that already have a committed result in this shard."""
    files = part_files(shard_dir)
    if not files:
        return set()
    return set(pq.read_table(files, columns=["request_id"]).column("request_id").to_pylist())


class PartWriter:
    def __init__(self, shard_dir: Path, run_id: str, shard: int, engine: str, part_rows: int) -> None:
        self.dir, self.run_id, self.shard, self.engine, self.part_rows = shard_dir, run_id, shard, engine, part_rows
        self.dir.mkdir(parents=True, exist_ok=True)
        self.buffer: list[dict] = []
        self.next_part = len(part_files(shard_dir))
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
        final = self.dir / f"part-{self.next_part:05d}.parquet"
        while final.exists():  # another attempt wrote this number: never overwrite a commit
            self.next_part += 1
            final = self.dir / f"part-{self.next_part:05d}.parquet"
        tmp = final.with_suffix(".parquet.tmp")
        pq.write_table(pa.Table.from_pylist(self.buffer, schema=RESULT_SCHEMA), tmp)
        os.replace(tmp, final)
        self.committed += len(self.buffer)
        self.next_part += 1
        self.buffer = []
