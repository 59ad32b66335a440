"""The inbox: input files dropped in a folder, each run once, known by its content hash.

``blendserve_inbox`` (a DAG on a short schedule) calls :func:`claim_new_files`,
triggers one ``blendserve_batch`` run per pending claim, then :func:`mark_triggered`.
The ledger is a folder inside the inbox, ``.blendserve/``: a claim is the folder
``claims/<sha256>/`` made with one ``mkdir`` (atomic: of two racing scans one
wins), holding the file moved in as ``input<suffix>`` and ``claim.json``. A file
whose hash is already claimed is a re-drop: it is moved to ``duplicates/`` and
not run again. ``triggered`` inside a claim marks its batch run as created; until
then every scan offers the claim again, and the batch run's id (from the hash)
makes a second trigger a no-op, so a scan that dies half way loses nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from blendserve import files
from blendserve.ingest.readers import READERS
LEDGER = ".blendserve"


@dataclass
class Claim:
    sha256: str
    name: str  # the file's name as dropped
    input: str  # where the claimed file now is: the batch run's input
    claimed_at: str

    @property
    def run_id(self) -> str:
        """The batch run's Airflow id: one per content hash."""
        return f"inbox__{self.sha256[:24]}"


def claim_new_files(inbox: Path, settle_seconds: float = 5.0) -> list[Claim]:
    """Claim every new, settled input file in ``inbox``; return every claim not yet triggered."""
    ledger = inbox / LEDGER
    (ledger / "claims").mkdir(parents=True, exist_ok=True)
    for path in _settled_files(inbox, settle_seconds):
        _claim(path, ledger)
    return pending_claims(inbox)


def pending_claims(inbox: Path) -> list[Claim]:
    claims = sorted((inbox / LEDGER / "claims").glob("*/claim.json"))
    return [Claim(**json.loads(p.read_text())) for p in claims if not (p.parent / "triggered").exists()]


def mark_triggered(inbox: Path, run_ids: set[str]) -> None:
    """Mark the claims whose batch runs (by id) now exist: later scans no longer offer them."""
    for claim in pending_claims(inbox):
        if claim.run_id in run_ids:
            (inbox / LEDGER / "claims" / claim.sha256 / "triggered").touch()


def _settled_files(inbox: Path, settle_seconds: float) -> list[Path]:
    """Input files not modified for ``settle_seconds`` (a copy still in progress waits for the next scan).
    Hidden names and other suffixes (``.tmp``, ``.part``) are left alone: write elsewhere, then rename."""
    now = time.time()
    return sorted(p for p in inbox.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in READERS
                  and now - p.stat().st_mtime >= settle_seconds)


def _claim(path: Path, ledger: Path) -> None:
    sha = _sha256(path)
    folder = ledger / "claims" / sha
    try:
        folder.mkdir()
    except FileExistsError:  # this content was claimed before (or by a racing scan)
        if any(folder.glob("input.*")):
            _move(path, ledger / "duplicates" / f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S%fZ}-{path.name}")
            return
        # else a scan died between mkdir and the move: finish its claim with this copy
    target = folder / f"input{path.suffix.lower()}"  # a fixed name: no glob characters reach the input
    claim = Claim(sha, path.name, str(target), datetime.now(timezone.utc).isoformat())
    files.atomic_write_bytes(json.dumps(asdict(claim)).encode(), folder / "claim.json")
    _move(path, target)


def _move(path: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(path, target)
    except FileNotFoundError:  # a racing scan moved it first
        pass


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
