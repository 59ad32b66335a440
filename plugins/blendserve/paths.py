"""Where a run may read and write: every input and output path must resolve
inside a configured data root, so a trigger form cannot reach anything else.

Roots: ``BLENDSERVE_DATA_ROOTS`` (separated by ``os.pathsep``; a root may be an
``s3://`` or ``gs://`` URL, whose colon does not split it), default the
repository's ``data/`` and ``out/``. Relative paths are taken from the first
root's parent (the repository), so ``data/sample/requests.jsonl`` works.
A URL is allowed only inside a URL root; a local path only inside a local one.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from blendserve import storage
from blendserve.config import ConfigError
from blendserve.model_prep import REPO_ROOT

Root = Path | str  # a resolved local folder, or an object-storage URL


class PathOutsideRoots(ConfigError):
    """A path that resolves outside every data root."""


def data_roots() -> list[Root]:
    configured = os.environ.get("BLENDSERVE_DATA_ROOTS")
    roots = storage.parse_roots(configured) if configured else [str(REPO_ROOT / "data"), str(REPO_ROOT / "out")]
    return [r if storage.is_remote(r) else Path(r).resolve() for r in roots]


def resolve_in_roots(path: str, what: str, roots: list[Root] | None = None) -> str:
    """``path`` made absolute, if it (or, for a glob, its fixed leading part) lies inside a root."""
    roots = roots or data_roots()
    if storage.is_remote(path):
        if not storage.in_roots(path, [str(r) for r in roots]):
            raise PathOutsideRoots(f"{what} {path!r} is outside the data roots ({_listed(roots)})")
        return path
    local = [Path(r) for r in roots if not storage.is_remote(r)]
    candidate = Path(path) if os.path.isabs(path) else REPO_ROOT / path
    fixed = _fixed_part(candidate)
    resolved_fixed = fixed.resolve()  # follows symlinks and '..'
    if not any(resolved_fixed == root or root in resolved_fixed.parents for root in local):
        raise PathOutsideRoots(f"{what} {path!r} resolves to {resolved_fixed}, outside the data roots ({_listed(roots)})")
    rest = candidate.relative_to(fixed) if candidate != fixed else Path()
    return str(resolved_fixed / rest)


def _listed(roots: list[Root]) -> str:
    return ", ".join(str(r) for r in roots)


def _fixed_part(path: Path) -> Path:
    """The leading components of a path before any glob pattern."""
    parts = path.parts
    for i, part in enumerate(parts):
        if glob.has_magic(part):
            return Path(*parts[:i])
    return path
