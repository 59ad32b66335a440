"""Run report: built from a finished small run (simulator engine), every section present, figures real PNGs."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pytest

from blendserve.cli import main
from blendserve.config import RunConfig
from blendserve.pipeline.steps import run_pipeline
from blendserve.report.build import SECTIONS, build_report
from blendserve.report.explain import explain_plan

FIXTURE = Path(__file__).parent / "fixtures" / "mini.jsonl"
BAD_LINE = '{"custom_id": "bad-1", "messages": [{"role": "robot", "content": "hi"}]}\n'


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> RunConfig:
    root = tmp_path_factory.mktemp("report")
    data = root / "in.jsonl"
    data.write_text(FIXTURE.read_text() + BAD_LINE)  # one reject, so that section has a row
    config = RunConfig(run_id="rep", input=str(data), db=str(root / "o.duckdb"), engine="simulator",
                       sample_rate=0.1, shards=2)
    run_pipeline(config)
    return config


def figures(report: Path) -> list[Path]:
    return [report.parent / name for name in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report.read_text())]


def assert_real_png(path: Path) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert float(np.var(pixels[..., :3])) > 0, f"{path.name} is blank"


def test_explain_plan_stores_the_prediction_and_names_every_policy(finished_run):
    text = explain_plan(finished_run)
    for policy in ("blendserve", "dfs", "fcfs", "balance"):
        assert re.search(rf"^\s+{re.escape(policy)}\s", text, re.M), policy
    assert "root density" in text and "shard balance" in text and "GPU-hours" in text
    # the run's policy, and the admission its model-predictive choice picked (what the shards ran)
    assert re.search(r"^\s+blendserve\s.*\(runs (dual-scan|static|spread-0\.05|spread-0\.15)\) <- chosen$", text, re.M)
    with duckdb.connect(finished_run.db, read_only=True) as con:
        stored = dict(con.execute("SELECT name, value FROM metrics WHERE run_id = ? AND name LIKE 'predicted%'",
                                  [finished_run.run_id]).fetchall())
    assert stored["predicted_seconds"] > 0 and stored["predicted_tokens_per_second"] > 0
    assert stored["predicted_root_density"] > 0


def test_report_has_every_section_and_real_figures(finished_run):
    report = build_report(finished_run.db, finished_run.run_id)
    assert report == Path(finished_run.db).parent / "reports" / "rep" / "report.md"
    text = report.read_text()
    for heading in SECTIONS:
        assert f"\n## {heading}\n" in text, heading
    assert "robot" in text  # the reject's reason
    assert "all passed" in text  # validation results
    pngs = figures(report)
    names = {p.name for p in pngs}
    assert {"throughput.png", "lengths.png", "shards.png", "utilization.png", "subtree_error.png"} <= names
    for png in pngs:
        assert_real_png(png)


def test_report_command_rebuilds_into_a_folder_and_says_what_is_missing(finished_run, tmp_path, capsys):
    # a copy of the DuckDB file alone: no run folder beside it, no warm-up sample, no KV figures
    db = tmp_path / "copy.duckdb"
    shutil.copy(finished_run.db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("DELETE FROM samples")
        con.execute("UPDATE engine_timeline SET kv_used_tokens = NULL, kv_total_tokens = NULL")
        con.execute("DELETE FROM metrics WHERE name LIKE 'predicted%'")
    assert main(["report", "rep", "--db", str(db), "--out", str(tmp_path / "out")]) == 0
    report = Path(capsys.readouterr().out.strip())
    text = report.read_text()
    assert report.parent == tmp_path / "out"
    assert "No warm-up sample" in text and "no KV cache use" in text
    assert "No prediction" in text  # requests.parquet is not beside the copy, nothing was stored
    for heading in SECTIONS:
        assert f"\n## {heading}\n" in text, heading
    for png in figures(report):
        assert_real_png(png)


def test_report_simulates_the_prediction_when_none_was_stored(finished_run, tmp_path):
    # a copy of the DuckDB file with its run folder beside it, but no stored prediction
    db = tmp_path / "copy.duckdb"
    shutil.copy(finished_run.db, db)
    shutil.copytree(Path(finished_run.db).parent / "runs" / "rep", tmp_path / "runs" / "rep")
    with duckdb.connect(str(db)) as con:
        con.execute("DELETE FROM metrics WHERE name LIKE 'predicted%'")
    text = build_report(str(db), "rep", str(tmp_path / "out")).read_text()
    assert "simulated while building this report from requests.parquet" in text
    assert re.search(r"Predicted for blendserve: [\d,.]+ tokens/s", text)


def test_reasons_list_the_most_common_and_count_the_rest() -> None:
    import pandas as pd

    from blendserve.report import build

    reasons = pd.DataFrame({"stage": ["rejected at ingest"] * 30, "reason": [f"prompt has {2048 + i} tokens" for i in range(30)],
                            "requests": list(range(60, 30, -1))})
    data = type("Data", (), {"reasons": reasons})()
    lines = build._reasons(data)
    assert sum("prompt has" in line for line in lines) == build.TOP_REASONS
    assert lines[-1].startswith("... and 5 more reasons (165 requests)")  # 35 + 34 + 33 + 32 + 31
