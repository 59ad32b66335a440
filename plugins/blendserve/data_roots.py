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

from blendserve import files
from blendserve.config import ConfigError
from blendserve.model_prep import REPO_ROOT

Root = Path | str  # a resolved local folder, or an object-storage URL
READ_PATTERNS = ("input",)  # settings that name files to read and so may be globs; all others are written to


class PathOutsideRoots(ConfigError):
    """A path that resolves outside every data root."""


def data_roots() -> list[Root]:
    configured = os.environ.get("BLENDSERVE_DATA_ROOTS")
    roots = files.parse_roots(configured) if configured else [str(REPO_ROOT / "data"), str(REPO_ROOT / "out")]
    return [r if files.is_remote(r) else Path(r).resolve() for r in roots]


def resolve_in_roots(path: str, what: str, roots: list[Root] | None = None) -> str:
    """``path`` made absolute, if it lies inside a root after symlinks and ``..`` are resolved.

    Only a setting in ``READ_PATTERNS`` may be a glob: its fixed leading part must lie in a root,
    it may not climb (``..``) after a wildcard, and every file it matches now, resolved, must lie in
    a root too (a glob follows symlinks). A path written to must name one place: no wildcards.
    """
    roots = roots or data_roots()
    if glob.has_magic(path) and what not in READ_PATTERNS:
        raise ConfigError(f"{what} {path!r} has a wildcard (* ? [): it is written to, so it must name one place")
    if files.is_remote(path):
        if not files.in_roots(path, [str(r) for r in roots]):
            raise PathOutsideRoots(f"{what} {path!r} is outside the data roots ({_listed(roots)})")
        return path
    local = [Path(r) for r in roots if not files.is_remote(r)]
    candidate = Path(path) if os.path.isabs(path) else REPO_ROOT / path
    fixed = _fixed_part(candidate)
    resolved = _inside(fixed, local, f"{what} {path!r}", roots)
    if fixed == candidate:
        return str(resolved)
    rest = candidate.relative_to(fixed)
    if ".." in rest.parts:
        raise PathOutsideRoots(f"{what} {path!r} has '..' after a wildcard, which could climb out of the data roots")
    pattern = str(resolved / rest)
    # ingest reads a file named literally like the pattern (``in[1].jsonl``) in place of its matches
    literal = [pattern] if os.path.lexists(pattern) else []
    for match in literal + glob.glob(pattern, recursive=True):
        _inside(Path(match), local, f"{what} {path!r} matches {match}, which", roots)
    return pattern


def _inside(path: Path, local: list[Path], named: str, roots: list[Root]) -> Path:
    """``path`` resolved (symlinks, ``..``), if inside a local root; else PathOutsideRoots starting with ``named``."""
    resolved = path.resolve()
    if not any(resolved == root or root in resolved.parents for root in local):
        raise PathOutsideRoots(f"{named} resolves to {resolved}, outside the data roots ({_listed(roots)})")
    return resolved


def _listed(roots: list[Root]) -> str:
    return ", ".join(str(r) for r in roots)


def _fixed_part(path: Path) -> Path:
    """The leading components of a path before any glob pattern."""
    parts = path.parts
    for i, part in enumerate(parts):
        if glob.has_magic(part):
            return Path(*parts[:i])
    return path
