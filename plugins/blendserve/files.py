"""Run folders on local disk or in object storage (``s3://``, ``gs://``, any fsspec URL).

Workers on different hosts share a run (requests, plan, shard part files) only through a
store they can all reach; one host's disk is not one. These primitives take a local path or
a URL and keep local paths plain :class:`pathlib.Path`, so nothing changes for a single machine.

- :func:`resolve`: ``Path`` for local paths; for URLs Airflow's ``ObjectStoragePath`` where an
  installed provider serves the scheme (credentials from an Airflow connection), else a
  ``UPath`` (fsspec, credentials from the environment).
- :func:`atomic_write_parquet` / :func:`atomic_write_bytes`: a reader sees the whole file or
  nothing. Local: temporary name, then rename. Object stores: one put of the whole object,
  which S3, GCS and Azure Blob make visible all at once.
- :func:`staged_file`: the same guarantee for a file written in pieces (a streaming writer).
- :func:`list_parts`, :func:`read_parquet`: find and read committed part files anywhere.
- :func:`expand`: the files a path or URL glob names (inputs).
- :func:`parquet_dataset`: Parquet files as one Arrow dataset, for DuckDB to scan without reading
  object storage itself (its own ``httpfs`` would need credentials of its own).
- :func:`parse_roots`, :func:`in_roots`: data roots that may be URLs (``s3://b/x`` has a colon).
"""

from __future__ import annotations

import glob
import io
import os
import re
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Union

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from upath import UPath
from upath.extensions import ProxyUPath  # Airflow's ObjectStoragePath derives from it

StoragePath = Union[Path, UPath, ProxyUPath]
PathLike = Union[str, os.PathLike, StoragePath]

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*)://")
_LOCAL_SCHEMES = {"file", "local"}


def scheme(url: str | os.PathLike) -> str:
    """The URL scheme (``s3``, ``gs``, ``memory``), or ``""`` for a plain path."""
    match = _SCHEME.match(str(url))
    return match.group(1).lower() if match else ""


def is_remote(url: str | os.PathLike) -> bool:
    return scheme(url) not in ("", *_LOCAL_SCHEMES)


def resolve(url: str | os.PathLike, conn_id: str | None = None) -> StoragePath:
    """A path object for ``url``: ``Path`` when local, a universal path otherwise."""
    if isinstance(url, Path):
        return url
    if not is_remote(url):
        return Path(_strip_file_scheme(str(url)))
    if _airflow_serves(scheme(url)):
        from airflow.sdk import ObjectStoragePath

        return ObjectStoragePath(str(url), conn_id=conn_id)
    if conn_id:
        raise ValueError(
            f"no Airflow provider serves {scheme(url)}:// URLs, so connection {conn_id!r} cannot be used; "
            "install the provider (s3: apache-airflow-providers-amazon) or drop the connection"
        )
    return UPath(str(url))


def _strip_file_scheme(url: str) -> str:
    match = _SCHEME.match(url)
    return url[match.end() :] if match else url


def _airflow_serves(name: str) -> bool:
    """Whether an installed Airflow provider registers a filesystem for this scheme."""
    try:
        from airflow.sdk.io.fs import has_fs
    except ImportError:  # the library also runs without Airflow
        return False
    return has_fs(name)


def as_path(value: PathLike) -> StoragePath:
    """``value`` as a path object; path objects pass through unchanged (they keep their connection)."""
    if isinstance(value, (Path, UPath, ProxyUPath)):
        return value
    return resolve(os.fspath(value))


def ensure_dir(path: StoragePath) -> None:
    """Create a local folder; object stores have no folders, and making one on S3 can create a bucket."""
    if isinstance(path, Path):
        path.mkdir(parents=True, exist_ok=True)


def atomic_write_bytes(data: bytes, url: PathLike, overwrite: bool = True) -> StoragePath:
    """Write ``data`` so that readers see all of it or no file; return the path written.

    With ``overwrite=False`` an existing file raises ``FileExistsError`` (a committed part is
    never replaced). Locally that check is atomic (a hard link fails on an existing name); on an
    object store it is a look-up before the put, enough where one task attempt writes at a time.
    """
    path = as_path(url)
    if isinstance(path, Path):
        with staged_file(path, overwrite) as tmp:
            tmp.write_bytes(data)
    else:
        _refuse_existing(path, overwrite)
        path.fs.pipe_file(path.path, data)  # one request: the object appears whole or not at all
    return path


@contextmanager
def staged_file(url: PathLike, overwrite: bool = True) -> Iterator[Path]:
    """A local file to write in pieces; on a clean exit it becomes ``url`` whole.

    Local: a temporary name beside ``url``, then a rename. Object stores: a local temporary file,
    then one upload (a multipart upload too becomes visible only when it completes).
    ``overwrite`` as in :func:`atomic_write_bytes`. On an error nothing is published.
    """
    path = as_path(url)
    if isinstance(path, Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")  # unique: two writers never share it
    else:
        tmp = Path(tempfile.mkdtemp(prefix="blendserve-")) / path.name
    try:
        yield tmp
        _publish(tmp, path, overwrite)
    finally:
        tmp.unlink(missing_ok=True)
        if not isinstance(path, Path):
            tmp.parent.rmdir()


def _publish(tmp: Path, path: StoragePath, overwrite: bool) -> None:
    if not isinstance(path, Path):
        _refuse_existing(path, overwrite)
        path.fs.put_file(str(tmp), path.path)
    elif overwrite:
        os.replace(tmp, path)
    else:
        os.link(tmp, path)  # fails with FileExistsError if another writer got there first


def _refuse_existing(path: StoragePath, overwrite: bool) -> None:
    if not overwrite and path.exists():
        raise FileExistsError(str(path))


def atomic_write_parquet(table: pa.Table, url: PathLike, overwrite: bool = True) -> StoragePath:
    """Write ``table`` as one Parquet file with :func:`atomic_write_bytes`'s guarantee."""
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return atomic_write_bytes(buffer.getvalue(), url, overwrite=overwrite)


def list_parts(folder: PathLike, pattern: str = "part-*.parquet") -> list[StoragePath]:
    """Committed files matching ``pattern`` under ``folder``, by name; none if it does not exist.

    Temporary files never match the default pattern, so a half-written part is never listed.
    """
    root = as_path(folder)
    if not root.exists():
        return []
    return sorted(root.glob(pattern), key=str)


def read_parquet(
    paths: Sequence[PathLike], columns: list[str] | None = None, schema: pa.Schema | None = None
) -> pa.Table:
    """One table from Parquet files on one filesystem (local or a single object store).

    No files gives an empty table of ``schema``; without a schema that is an error, because an
    empty result with no columns would surface later as a confusing missing-column failure.
    """
    if not paths:
        if schema is None:
            raise ValueError("no Parquet files to read and no schema for an empty table")
        table = schema.empty_table()
        return table.select(columns) if columns else table
    names, filesystem = _arrow_source(paths)
    return pq.read_table(names, columns=columns, schema=schema, filesystem=filesystem)


def parquet_dataset(paths: Sequence[PathLike]) -> ds.Dataset:
    """Parquet files (at least one) as one lazily read Arrow dataset: scanning it streams batches."""
    names, filesystem = _arrow_source(paths)
    return ds.dataset(names, format="parquet", filesystem=filesystem)


def _arrow_source(paths: Sequence[PathLike]) -> tuple[list[str], object]:
    """File names and the pyarrow filesystem they are on (``None``: local)."""
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    resolved = [as_path(p) for p in paths]
    if all(isinstance(p, Path) for p in resolved):
        return [str(p) for p in resolved], None
    filesystems = {_fs_key(p) for p in resolved}
    if len(filesystems) != 1:
        raise ValueError(f"Parquet files on more than one filesystem: {sorted(filesystems)}")
    return [p.path for p in resolved], PyFileSystem(FSSpecHandler(resolved[0].fs))


def _fs_key(path: StoragePath) -> str:
    if isinstance(path, Path):
        return "file"
    return f"{path.protocol}:{id(path.fs)}"


def expand(pattern: str, conn_id: str | None = None) -> list[StoragePath]:
    """The paths a file name or glob names, sorted; a name without wildcards comes back as it is.

    ``**`` matches across folders, as in :func:`glob.glob` with ``recursive=True``.
    """
    if not glob.has_magic(pattern):
        return [resolve(pattern, conn_id)]
    if not is_remote(pattern):
        return sorted(Path(p) for p in glob.glob(_strip_file_scheme(pattern), recursive=True))
    folder = re.split(r"[*?\[]", pattern, maxsplit=1)[0].rpartition("/")[0]  # the part before any wildcard
    return sorted(resolve(folder, conn_id).glob(pattern[len(folder) + 1 :]), key=str)


def parse_roots(value: str) -> list[str]:
    """Data roots from ``BLENDSERVE_DATA_ROOTS``: split on ``:`` except inside ``scheme://``.

    ``/data:s3://bucket/runs:/out`` gives ``['/data', 's3://bucket/runs', '/out']``; a plain
    ``value.split(':')`` would cut the URL in two.
    """
    roots: list[str] = []
    for piece in value.split(os.pathsep):
        if roots and piece.startswith("//") and re.fullmatch(r"[a-zA-Z][a-zA-Z0-9+.\-]*", roots[-1]):
            roots[-1] = f"{roots[-1]}:{piece}"
        elif piece:
            roots.append(piece)
    return roots


def in_roots(url: str, roots: Sequence[str]) -> bool:
    """Whether a remote ``url`` lies inside one of the remote ``roots`` (same scheme and prefix).

    Local paths are for ``blendserve.data_roots.resolve_in_roots``, which also follows symlinks.
    ``..`` in a URL is refused outright: object stores do not normalise it, readers might.
    """
    if not is_remote(url) or "/../" in f"{url}/" or "/./" in f"{url}/":
        return False
    target = _normalise(url)
    return any(is_remote(root) and (target == _normalise(root) or target.startswith(_normalise(root) + "/"))
               for root in roots)


def _normalise(url: str) -> str:
    name = scheme(url)
    rest = str(url)[len(name) + 3 :].rstrip("/")
    return f"{name}://{re.sub('/+', '/', rest)}"
