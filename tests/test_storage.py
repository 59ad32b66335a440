"""Run-folder storage primitives on local disk and on fsspec's in-memory object store."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from upath import UPath

from blendserve import files

TABLE = pa.table({"request_id": ["a", "b"], "num_output_tokens": [3, 5]})


# --- resolve -------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["out/runs/r1", "/tmp/runs/r1", "file:///tmp/runs/r1"])
def test_local_paths_stay_plain_pathlib(url: str) -> None:
    path = files.resolve(url)
    assert type(path) is type(Path())
    assert str(path).endswith("runs/r1")
    assert not str(path).startswith("file:")


def test_file_url_keeps_its_absolute_path() -> None:
    assert files.resolve("file:///tmp/runs/r1") == Path("/tmp/runs/r1")


def test_url_without_provider_is_an_fsspec_path(bucket: str) -> None:
    path = files.resolve(f"{bucket}/runs/r1")
    assert isinstance(path, UPath)
    assert path.protocol == "memory"


def test_connection_for_a_scheme_no_provider_serves_is_refused(bucket: str) -> None:
    with pytest.raises(ValueError, match="no Airflow provider serves memory://"):
        files.resolve(f"{bucket}/runs/r1", conn_id="aws_default")


def test_scheme_served_by_airflow_gives_object_storage_path(bucket: str, airflow_memory_fs: None) -> None:
    from airflow.sdk import ObjectStoragePath

    path = files.resolve(f"{bucket}/runs/r1", conn_id="my_store")
    assert isinstance(path, ObjectStoragePath)
    assert path.conn_id == "my_store"
    written = files.atomic_write_parquet(TABLE, path / "part-00000.parquet")
    assert files.read_parquet(files.list_parts(path)).equals(TABLE)
    assert isinstance(written, ObjectStoragePath)


# --- atomic writes ---------------------------------------------------------------------------


def test_local_write_commits_whole_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    final = tmp_path / "shard-00000" / "part-00000.parquet"
    files.atomic_write_parquet(TABLE, str(final))
    assert files.read_parquet([final]).equals(TABLE)
    assert sorted(p.name for p in final.parent.iterdir()) == ["part-00000.parquet"]


def test_local_write_refuses_to_replace_a_commit(tmp_path: Path) -> None:
    final = tmp_path / "part-00000.parquet"
    files.atomic_write_parquet(TABLE, final)
    with pytest.raises(FileExistsError):
        files.atomic_write_parquet(TABLE.slice(0, 1), final, overwrite=False)
    assert files.read_parquet([final]).num_rows == 2
    assert [p.name for p in tmp_path.iterdir()] == ["part-00000.parquet"]


def test_local_overwrite_replaces(tmp_path: Path) -> None:
    final = tmp_path / "plan.parquet"
    files.atomic_write_parquet(TABLE, final)
    files.atomic_write_parquet(TABLE.slice(0, 1), final)
    assert files.read_parquet([final]).num_rows == 1


def test_local_crash_before_rename_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(src: str, dst: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        files.atomic_write_bytes(b"x" * 100, tmp_path / "part-00000.parquet")
    assert list(tmp_path.iterdir()) == []


def test_object_store_write_is_one_put_of_the_whole_object(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []
    original = MemoryFileSystem.pipe_file

    def spy(self: MemoryFileSystem, path: str, value: bytes, *args, **kwargs) -> None:
        calls.append((path, len(value)))
        return original(self, path, value, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "pipe_file", spy)
    url = f"{bucket}/runs/r1/parts/shard-00000/part-00000.parquet"
    files.atomic_write_parquet(TABLE, url)
    assert len(calls) == 1 and calls[0][0].endswith("shard-00000/part-00000.parquet")
    assert MemoryFileSystem().find(bucket) == [calls[0][0]]  # no temporary object left behind
    assert files.read_parquet([url]).equals(TABLE)


def test_object_store_refuses_to_replace_a_commit(bucket: str) -> None:
    url = f"{bucket}/part-00000.parquet"
    files.atomic_write_parquet(TABLE, url, overwrite=False)
    with pytest.raises(FileExistsError):
        files.atomic_write_parquet(TABLE.slice(0, 1), url, overwrite=False)
    assert files.read_parquet([url]).num_rows == 2


def test_object_store_write_makes_no_folders(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # On S3, making a "folder" under a missing bucket creates the bucket: writes must not try.
    def refuse(*args, **kwargs) -> None:
        raise AssertionError("mkdir called on an object store")

    monkeypatch.setattr(MemoryFileSystem, "mkdir", refuse)
    monkeypatch.setattr(MemoryFileSystem, "makedirs", refuse)
    path = files.resolve(f"{bucket}/a/b/part-00000.parquet")
    files.ensure_dir(path.parent)
    files.atomic_write_parquet(TABLE, path)
    assert path.exists()


@pytest.mark.parametrize("where", ["local", "memory"])
def test_staged_file_appears_only_when_written_whole(where: str, tmp_path: Path, bucket: str) -> None:
    url = f"{tmp_path if where == 'local' else bucket}/runs/r1/requests.parquet"
    with files.staged_file(url) as local:
        local.write_bytes(b"first half")
        assert not files.resolve(url).exists()  # readers see nothing while it is being written
        with local.open("ab") as f:
            f.write(b", second half")
    assert files.resolve(url).read_bytes() == b"first half, second half"
    assert not local.exists()


@pytest.mark.parametrize("where", ["local", "memory"])
def test_staged_file_publishes_nothing_on_error(where: str, tmp_path: Path, bucket: str) -> None:
    url = f"{tmp_path if where == 'local' else bucket}/plan.parquet"
    with pytest.raises(RuntimeError, match="writer died"):
        with files.staged_file(url) as local:
            local.write_bytes(b"half")
            raise RuntimeError("writer died")
    assert not files.resolve(url).exists() and not local.exists()
    assert where == "memory" or list(tmp_path.iterdir()) == []


# --- listing and reading ---------------------------------------------------------------------


def _commit_shards(root: str) -> None:
    for shard in range(2):
        for part in range(2):
            rows = TABLE.slice(part, 1)
            files.atomic_write_parquet(rows, f"{root}/parts/shard-{shard:05d}/part-{part:05d}.parquet")


@pytest.mark.parametrize("where", ["local", "memory"])
def test_list_and_read_parts_across_shards(where: str, tmp_path: Path, bucket: str) -> None:
    root = str(tmp_path) if where == "local" else bucket
    _commit_shards(root)
    files.atomic_write_bytes(b"half", f"{root}/parts/shard-00000/part-00002.parquet.tmp")
    one_shard = files.list_parts(f"{root}/parts/shard-00001")
    every_shard = files.list_parts(f"{root}/parts", "*/part-*.parquet")
    assert [p.name for p in one_shard] == ["part-00000.parquet", "part-00001.parquet"]
    assert len(every_shard) == 4
    table = files.read_parquet(every_shard, columns=["request_id"])
    assert table.column_names == ["request_id"]
    assert sorted(table.column("request_id").to_pylist()) == ["a", "a", "b", "b"]


@pytest.mark.parametrize("where", ["local", "memory"])
def test_missing_folder_has_no_parts(where: str, tmp_path: Path, bucket: str) -> None:
    root = str(tmp_path / "nothing") if where == "local" else f"{bucket}/nothing"
    assert files.list_parts(root) == []


@pytest.mark.parametrize("where", ["local", "memory"])
def test_expand_globs_paths_and_urls(where: str, tmp_path: Path, bucket: str) -> None:
    root = str(tmp_path) if where == "local" else bucket
    for name in ("in/b.jsonl", "in/a.jsonl", "in/deep/c.jsonl", "in/d.csv"):
        files.atomic_write_bytes(b"{}", f"{root}/{name}")
    assert [p.name for p in files.expand(f"{root}/in/*.jsonl")] == ["a.jsonl", "b.jsonl"]
    assert [p.name for p in files.expand(f"{root}/in/**/*.jsonl")] == ["a.jsonl", "b.jsonl", "c.jsonl"]
    (one,) = files.expand(f"{root}/in/d.csv")
    assert one.read_bytes() == b"{}" and isinstance(one, Path) == (where == "local")


def test_parquet_dataset_scans_object_storage(bucket: str) -> None:
    _commit_shards(bucket)
    dataset = files.parquet_dataset(files.list_parts(f"{bucket}/parts", "*/part-*.parquet"))
    assert dataset.to_table().num_rows == 4


def test_reading_no_files_needs_a_schema() -> None:
    with pytest.raises(ValueError, match="no schema"):
        files.read_parquet([])
    empty = files.read_parquet([], columns=["request_id"], schema=TABLE.schema)
    assert empty.num_rows == 0 and empty.column_names == ["request_id"]


def test_reading_across_filesystems_is_refused(tmp_path: Path, bucket: str) -> None:
    local = files.atomic_write_parquet(TABLE, tmp_path / "part-00000.parquet")
    remote = files.atomic_write_parquet(TABLE, f"{bucket}/part-00000.parquet")
    with pytest.raises(ValueError, match="more than one filesystem"):
        files.read_parquet([local, remote])


# --- data roots ------------------------------------------------------------------------------


def test_roots_split_on_colons_but_keep_urls_whole() -> None:
    assert files.parse_roots("/data:s3://bucket/runs::/out:gs://b") == ["/data", "s3://bucket/runs", "/out", "gs://b"]


@pytest.mark.parametrize(
    ("url", "inside"),
    [
        ("s3://bucket/runs/r1/plan.parquet", True),
        ("s3://bucket/runs", True),
        ("s3://bucket//runs/r1", True),
        ("s3://bucket/runs2/r1", False),  # a sibling sharing the prefix's characters
        ("s3://bucket/runs/../secrets", False),
        ("gs://bucket/runs/r1", False),  # same path, other store
        ("/data/x.jsonl", False),  # local paths are checked by blendserve.data_roots
    ],
)
def test_remote_urls_inside_roots(url: str, inside: bool) -> None:
    assert files.in_roots(url, ["/data", "s3://bucket/runs/"]) is inside
