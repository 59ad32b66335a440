"""Input and output paths must stay inside the data roots."""

from __future__ import annotations

import pytest

from blendserve.paths import PathOutsideRoots, resolve_in_roots


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
