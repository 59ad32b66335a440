"""Airflow as its users meet it: a live standalone Airflow started by bin/airflow-local, nothing
unpaused by hand; the README's REST trigger, the UI's Trigger form in headless Chromium, a file
dropped in the inbox; then DuckDB, the export files and the report; then no process left.

Slow (one Airflow start, three small vLLM runs one after another, a one-minute inbox scan):
marked ``live``. Chromium comes from Debian's package (`.ci/run` installs it); without it the
browser test is skipped, never the others.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import duckdb
import pytest

import live_airflow
from live_airflow import quote
from conftest import REPO

pytestmark = pytest.mark.live

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# out/ is ignored by git; docs/img/airflow-trigger-form.png (in the README) is a copy of one
SCREENSHOT = REPO / "out" / "screenshots" / "airflow-trigger-form.png"
SMALL_SAMPLE = REPO / "data" / "sample" / "requests-small.jsonl"


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow-home")
    live = live_airflow.start(home, tmp_path_factory.mktemp("airflow-work"))
    try:
        yield live
    finally:
        live_airflow.stop(live)
        time.sleep(2)
        left = live_airflow.processes_of(live)
        assert not left, f"processes left after bin/airflow-local stop: {left}"


def readme_trigger(live) -> dict:
    """Run the README's REST trigger block word for word, but for this instance's port and home."""
    readme = (REPO / "README.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", readme, re.S) if "/dagRuns" in b)
    script = block.replace("localhost:8080", f"localhost:{live.port}").replace(".cache/airflow/", f"{live.home}/")
    out = subprocess.run(["bash", "-c", script], cwd=REPO, env=live.env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def one_output_per_request(db: Path, airflow_run_id: str) -> str:
    """The run's safe id, after checking it has exactly one output per accepted request."""
    with duckdb.connect(str(db), read_only=True) as con:
        run_id, status = con.execute("SELECT run_id, status FROM runs WHERE airflow_run_id = ?",
                                     [airflow_run_id]).fetchone()
        requests = con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [run_id]).fetchone()[0]
        outputs = con.execute("SELECT count(*), count(DISTINCT request_id) FROM outputs WHERE run_id = ?",
                              [run_id]).fetchone()
    assert status == "finished"
    assert requests == outputs[0] == outputs[1] == 24
    return run_id


def exported(live, db: Path, run_id: str, airflow_run_id: str) -> None:
    """The export DAG ran for this run (on the Asset event) and succeeded; its files match DuckDB."""
    manifest = db.parent / "exports" / f"{run_id}-manifest.json"
    deadline = time.monotonic() + 300
    while not manifest.exists() and time.monotonic() < deadline:
        time.sleep(5)
    assert manifest.exists(), f"no export for {run_id}"
    assert all(r["state"] in ("success", "running", "queued") for r in live.runs("blendserve_export"))
    facts = json.loads(manifest.read_text())
    assert facts["airflow_run_id"] == airflow_run_id and facts["model"] == "smollm2-135m-instruct"
    lines = Path(facts["output_path"]).read_text().splitlines()
    assert facts["outputs"] + facts["errors"] == 24 and len(lines) == facts["outputs"]


def test_readme_rest_trigger_runs_without_unpausing_and_the_export_follows(airflow):
    run = readme_trigger(airflow)
    finished = airflow.wait_for_run("blendserve_batch", run["dag_run_id"])
    assert finished["state"] == "success", airflow.task_states("blendserve_batch", run["dag_run_id"])
    db = REPO / run["conf"]["db"]
    run_id = one_output_per_request(db, run["dag_run_id"])
    summary = airflow.xcom("blendserve_batch", run["dag_run_id"], "summary")
    assert Path(summary["report"]).is_file()
    # two shards through a one-slot pool run one after another: the run's wall is both, not the longest
    shard_walls = [airflow.xcom("blendserve_batch", run["dag_run_id"], "infer", i) for i in range(2)]
    assert summary["wall_seconds"] >= 0.99 * sum(s["wall_seconds"] for s in shard_walls)
    exported(airflow, db, run_id, run["dag_run_id"])


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (.ci/run installs it)")
def test_trigger_form_with_its_defaults_runs_from_the_browser(airflow):
    from playwright.sync_api import sync_playwright

    before = {r["dag_run_id"] for r in airflow.runs("blendserve_batch")}
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        browser = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                                       headless=True, viewport={"width": 1300, "height": 2100})  # the whole form
        page = browser.new_page()
        page.goto(airflow.url + "/")
        page.get_by_label("Username").fill("admin")
        page.get_by_label("Password").fill(airflow.password)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(airflow.url + "/")
        page.goto(airflow.url + "/dags/blendserve_batch")
        page.get_by_role("button", name="Trigger").first.click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_text("Run Parameters").wait_for()
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT))
        assert SCREENSHOT.stat().st_size > 10_000
        trigger = dialog.get_by_role("button", name="Trigger")
        assert trigger.is_enabled()  # with every default: no field left required and empty
        trigger.click()
        run_id = wait_for_new_run(airflow, before)
        page.goto(f"{airflow.url}/dags/blendserve_batch/runs/{quote(run_id)}")
        # the run's own state badge, beside its heading (the task rows below have badges too)
        badge = page.get_by_role("heading", name=run_id, exact=True).locator("xpath=..").get_by_test_id("state-badge")
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and badge.inner_text().strip() not in ("Success", "Failed"):
            time.sleep(10)
            page.reload()
        assert badge.inner_text().strip() == "Success", airflow.task_states("blendserve_batch", run_id)
        browser.close()
    assert airflow.wait_for_run("blendserve_batch", run_id, timeout=60)["state"] == "success"
    one_output_per_request(airflow.work / "live.duckdb", run_id)


def wait_for_new_run(live, before: set[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = [r for r in live.runs("blendserve_batch") if r["dag_run_id"] not in before]
        if new:
            return new[0]["dag_run_id"]
        time.sleep(1)
    raise TimeoutError("the form's Trigger created no run")


def test_a_file_dropped_in_the_inbox_runs_once_and_a_redrop_is_recognised(airflow):
    inbox = airflow.work / "inbox"
    data = SMALL_SAMPLE.read_bytes()
    shutil.copy(SMALL_SAMPLE, inbox / "first.jsonl")
    run_id = f"inbox__{hashlib.sha256(data).hexdigest()[:24]}"
    deadline = time.monotonic() + 180
    while run_id not in {r["dag_run_id"] for r in airflow.runs("blendserve_batch")} and time.monotonic() < deadline:
        time.sleep(5)
    assert airflow.wait_for_run("blendserve_batch", run_id)["state"] == "success"
    one_output_per_request(airflow.work / "live.duckdb", run_id)

    (inbox / "again.jsonl").write_bytes(data)  # the same content under another name
    duplicates = inbox / ".blendserve" / "duplicates"
    deadline = time.monotonic() + 180
    while not list(duplicates.glob("*-again.jsonl")) and time.monotonic() < deadline:
        time.sleep(5)
    assert list(duplicates.glob("*-again.jsonl")), "the re-dropped file was not recognised"
    inbox_runs = [r for r in airflow.runs("blendserve_batch") if r["dag_run_id"].startswith("inbox__")]
    assert [r["dag_run_id"] for r in inbox_runs] == [run_id]


def test_every_successful_batch_run_was_exported_and_no_export_failed(airflow):
    from blendserve.config import safe_run_id

    for run in airflow.runs("blendserve_batch"):
        if run["state"] == "success":
            db = REPO / run["conf"]["db"] if run["conf"].get("db") else airflow.work / "live.duckdb"
            exported(airflow, db, safe_run_id(run["dag_run_id"]), run["dag_run_id"])
    exports = airflow.runs("blendserve_export")
    assert exports and all(r["state"] == "success" for r in exports), [(r["dag_run_id"], r["state"]) for r in exports]


def test_the_local_executor_keeps_a_small_pool_of_workers(airflow):
    workers = [p for p in live_airflow.processes_of(airflow) if "LocalExecutor" in p]
    assert 1 <= len(workers) <= 4, workers  # standalone's default parallelism would start 32
