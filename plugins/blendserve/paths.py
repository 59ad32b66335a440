"""Where a run may read and write: every input and output path must resolve
inside a configured data root, so a trigger form cannot reach anything else.

Roots: ``BLENDSERVE_DATA_ROOTS`` (paths separated by ``os.pathsep``), default
the repository's ``data/`` and ``out/``. Relative paths are taken from the
first root's parent (the repository), so ``data/sample/requests.jsonl`` works.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from blendserve.model_prep import REPO_ROOT


class PathOutsideRoots(ValueError):
    """A path that resolves outside every data root."""


def data_roots() -> list[Path]:
    configured = os.environ.get("BLENDSERVE_DATA_ROOTS")
    roots = configured.split(os.pathsep) if configured else [str(REPO_ROOT / "data"), str(REPO_ROOT / "out")]
    return [Path(r).resolve() for r in roots if r]


def resolve_in_roots(path: str, what: str, roots: list[Path] | None = None) -> str:
    """``path`` made absolute, if it (or, for a glob, its fixed leading part) lies inside a root."""
    roots = roots or data_roots()
    candidate = Path(path) if os.path.isabs(path) else REPO_ROOT / path
    fixed = _fixed_part(candidate)
    resolved_fixed = fixed.resolve()  # follows symlinks and '..'
    if not any(resolved_fixed == root or root in resolved_fixed.parents for root in roots):
        allowed = ", ".join(str(r) for r in roots)
        raise PathOutsideRoots(f"{what} {path!r} resolves to {resolved_fixed}, outside the data roots ({allowed})")
    rest = candidate.relative_to(fixed) if candidate != fixed else Path()
    return str(resolved_fixed / rest)


def _fixed_part(path: Path) -> Path:
    """The leading components of a path before any glob pattern."""
    parts = path.parts
    for i, part in enumerate(parts):
        if glob.has_magic(part):
            return Path(*parts[:i])
    return path
