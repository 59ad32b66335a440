"""The inbox ledger: each content hash is claimed once, re-drops are recognised, a cut-off scan loses nothing."""

from __future__ import annotations

import hashlib
import os
import time

from blendserve.inbox import LEDGER, claim_new_files, mark_triggered, pending_claims


def drop(inbox, name: str, text: str, age_s: float = 60.0):
    path = inbox / name
    path.write_text(text)
    past = time.time() - age_s
    os.utime(path, (past, past))
    return path


def test_a_new_file_is_claimed_by_its_hash_and_offered_until_triggered(tmp_path):
    drop(tmp_path, "batch.jsonl", '{"custom_id": "a", "prompt": "hi"}\n')
    claims = claim_new_files(tmp_path)
    sha = hashlib.sha256(b'{"custom_id": "a", "prompt": "hi"}\n').hexdigest()
    assert [(c.sha256, c.name, c.run_id) for c in claims] == [(sha, "batch.jsonl", f"inbox__{sha[:24]}")]
    assert not (tmp_path / "batch.jsonl").exists() and open(claims[0].input).read().startswith('{"custom_id"')
    assert claim_new_files(tmp_path) == claims  # not triggered yet: offered again, same run id
    mark_triggered(tmp_path, {claims[0].run_id})
    assert claim_new_files(tmp_path) == []


def test_the_same_content_dropped_again_is_not_claimed_twice(tmp_path):
    drop(tmp_path, "one.jsonl", "same\n")
    mark_triggered(tmp_path, {c.run_id for c in claim_new_files(tmp_path)})
    drop(tmp_path, "two.jsonl", "same\n")
    drop(tmp_path, "other.csv", "different\n")
    claims = claim_new_files(tmp_path)
    assert [c.name for c in claims] == ["other.csv"]
    assert [p.name.endswith("-two.jsonl") for p in (tmp_path / LEDGER / "duplicates").iterdir()] == [True]


def test_files_still_being_written_hidden_or_of_other_kinds_wait(tmp_path):
    drop(tmp_path, "fresh.jsonl", "x\n", age_s=0)
    drop(tmp_path, ".hidden.jsonl", "y\n")
    drop(tmp_path, "copying.jsonl.tmp", "z\n")
    assert claim_new_files(tmp_path, settle_seconds=30) == []
    assert (tmp_path / "fresh.jsonl").exists()


def test_a_scan_cut_off_after_its_claim_folder_is_finished_by_the_next(tmp_path):
    path = drop(tmp_path, "batch.jsonl", "content\n")
    sha = hashlib.sha256(b"content\n").hexdigest()
    (tmp_path / LEDGER / "claims" / sha).mkdir(parents=True)  # the scan died right after mkdir
    assert pending_claims(tmp_path) == []
    claims = claim_new_files(tmp_path)
    assert [c.sha256 for c in claims] == [sha] and not path.exists()
    assert open(claims[0].input).read() == "content\n"
