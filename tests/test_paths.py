"""Input and output paths must stay inside the data roots."""

from __future__ import annotations

import pytest

from blendserve.data_roots import PathOutsideRoots, data_roots, resolve_in_roots


@pytest.fixture
def roots(tmp_path):
    (tmp_path / "data" / "in").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (tmp_path / "data" / "link").symlink_to(tmp_path / "secret")
    return [(tmp_path / "data").resolve()]


@pytest.mark.parametrize("bad", ["../../etc/passwd", "/etc/passwd", "data/../../../../etc/shadow", "/tmp/../etc/*.conf"])
def test_paths_outside_the_roots_are_refused(roots, bad):
    with pytest.raises(PathOutsideRoots, match="outside the data roots"):
        resolve_in_roots(bad, "input", roots)


def test_symlink_out_of_a_root_is_refused(roots, tmp_path):
    with pytest.raises(PathOutsideRoots):
        resolve_in_roots(str(tmp_path / "data" / "link" / "x.jsonl"), "input", roots)


def test_paths_and_globs_inside_a_root_resolve(roots, tmp_path):
    inside = resolve_in_roots(str(tmp_path / "data" / "in" / "*.jsonl"), "input", roots)
    assert inside == str(roots[0] / "in" / "*.jsonl")
    assert resolve_in_roots(str(tmp_path / "data" / "in" / ".." / "out.duckdb"), "db", roots) == str(roots[0] / "out.duckdb")


def test_object_storage_urls_are_allowed_only_inside_url_roots(roots):
    with_bucket = [*roots, "s3://bucket/runs"]
    assert resolve_in_roots("s3://bucket/runs/r1", "runs_dir", with_bucket) == "s3://bucket/runs/r1"
    assert resolve_in_roots("s3://bucket/runs/in/*.jsonl", "input", with_bucket) == "s3://bucket/runs/in/*.jsonl"
    for bad in ("s3://bucket/other/r1", "s3://bucket/runs/../secrets", "gs://bucket/runs/r1"):
        with pytest.raises(PathOutsideRoots, match="outside the data roots"):
            resolve_in_roots(bad, "runs_dir", with_bucket)
    with pytest.raises(PathOutsideRoots):
        resolve_in_roots("s3://bucket/runs/r1", "runs_dir", roots)  # no URL root: no object storage at all


def test_data_roots_keep_urls_whole(monkeypatch, tmp_path):
    monkeypatch.setenv("BLENDSERVE_DATA_ROOTS", f"{tmp_path}:s3://bucket/runs:gs://other")
    assert data_roots() == [tmp_path.resolve(), "s3://bucket/runs", "gs://other"]
