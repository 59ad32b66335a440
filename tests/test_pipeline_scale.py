"""A `blendserve workload` file through `blendserve run` on the simulator, with the at-scale paths forced small:
validation on a sample plus exact SQL counts, explain on a sample."""

from __future__ import annotations

import duckdb
import pytest

from blendserve import validation
from blendserve.model_prep import REPO_ROOT
from blendserve.report import explain
from blendserve.workload import WorkloadSpec, build_workload

DATA = REPO_ROOT.parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} (the shared data sets) is absent")


@pytest.fixture(scope="module")
def scaled_run(tmp_path_factory: pytest.TempPathFactory, model_dir):
    from blendserve.config import RunConfig
    from blendserve.costmodel import CostModel, get_hardware, get_model
    from blendserve.pipeline.steps import run_pipeline

    folder = tmp_path_factory.mktemp("scale")
    path = folder / "mix.parquet"
    build_workload(WorkloadSpec(600, density=1.4, sharing=0.35, seed=3, name="s"), path,
                   CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g")), DATA)
    config = RunConfig(run_id="scale", input=str(path), db=str(folder / "out.duckdb"), engine="simulator")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(validation, "GX_ROWS", 200)
        patch.setattr(explain, "EXPLAIN_ROWS", 150)
        summary = run_pipeline(config)
    return config, summary


def test_a_workload_file_runs_as_is_one_output_per_accepted_request(scaled_run) -> None:
    config, summary = scaled_run
    with duckdb.connect(config.db, read_only=True) as con:
        metrics = dict(con.execute("SELECT name, value FROM metrics").fetchall())
        accepted, distinct = con.execute("SELECT count(*), count(DISTINCT request_id) FROM requests").fetchone()
        outputs = con.execute("SELECT count(*) FROM outputs o SEMI JOIN requests r USING (run_id, request_id)").fetchone()[0]
    assert metrics["ingest_read"] == 600 == metrics["ingest_accepted"] + metrics["ingest_rejected"]
    assert accepted == distinct == outputs == summary["requests"] > 400  # rejects: prompts beyond the context only


def test_large_tables_are_checked_on_a_sample_and_by_exact_sql_counts(scaled_run) -> None:
    config, summary = scaled_run
    with duckdb.connect(config.db, read_only=True) as con:
        stages = dict(con.execute("SELECT stage, bool_and(success) FROM validation_results GROUP BY stage").fetchall())
    n = summary["requests"]
    assert stages == {"input (all rows, SQL)": True, "outputs (all rows, SQL)": True, "input_counts": True,
                      f"input (great-expectations on 200 of {n:,} rows)": True,
                      f"outputs (great-expectations on 200 of {n:,} rows)": True}
    report = open(summary["report"]).read()
    assert f"great-expectations on 200 of {n:,} rows" in report
    assert "policies simulated on a uniform sample of 150 requests" in report


def test_sql_counts_catch_an_output_of_no_accepted_request(scaled_run) -> None:
    config, _ = scaled_run
    with duckdb.connect(config.db) as con:
        con.begin()
        con.execute("""UPDATE outputs SET request_id = 'stranger'
                       WHERE request_id = (SELECT min(request_id) FROM outputs)""")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(validation, "GX_ROWS", 200)
            results = validation.check_outputs(con, config.run_id, config.max_model_len)
        con.rollback()
    failed = {(r.stage, r.expectation, r.column) for r in results if not r.success}
    assert failed == {("outputs (all rows, SQL)", "expect_column_values_to_be_in_set", "request_id")}


def test_explain_on_a_sample_says_so_and_scales_to_the_whole_job(scaled_run) -> None:
    config, summary = scaled_run
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(explain, "EXPLAIN_ROWS", 150)
        e = explain.explain_run(config)
    assert e.simulated_requests == 150 and e.requests == summary["requests"]
    assert e.input_tokens == summary["input_tokens"]
    assert all(0 < p.fraction_of_optimum <= 1 for p in e.policies)
    assert "uniform sample of 150 requests" in explain.format_explanation(e)
