"""great-expectations checks on the accepted requests and on the outputs.

GX 1.x with an ephemeral context: suites are built in code, run inside the
task, and their results are stored in DuckDB (``validation_results``). A failed
check raises ``ValidationFailed`` with the expectation, the column and example
rows, so the task log says what is wrong.

Above ``GX_ROWS`` rows, a pandas frame per check is what costs: GX then checks
a seeded sample of ``GX_ROWS`` rows, and the same checks run exactly over every
row as DuckDB counts; each result's stage says which (the run report shows it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    import duckdb

EXAMPLES = 5  # unexpected values quoted in a failure message
GX_ROWS = 100_000  # rows great-expectations checks; a larger table gets a sample and exact SQL counts


@dataclass
class CheckResult:
    stage: str  # "input" | "outputs"
    expectation: str  # GX expectation type, e.g. expect_column_values_to_be_unique
    column: str  # column checked, or "" for table-level checks
    success: bool
    observed: str  # observed value or unexpected count, as text
    unexpected: str  # a few offending values, JSON


class ValidationFailed(RuntimeError):
    """One or more checks failed; the message lists them."""


def _validate(stage: str, frame: pd.DataFrame, expectations: list) -> list[CheckResult]:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = gx.data_context.types.base.ProgressBarsConfig(globally=False)
    asset = context.data_sources.add_pandas(f"blendserve_{stage}").add_dataframe_asset(stage)
    batch = asset.add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame})
    suite = gx.ExpectationSuite(name=f"blendserve_{stage}")
    for expectation in expectations:
        suite.add_expectation(expectation)
    report = batch.validate(suite, result_format="SUMMARY")
    return [_check(stage, r) for r in report.results]


def _check(stage: str, result) -> CheckResult:
    config, details = result.expectation_config, result.result
    observed = details.get("observed_value", details.get("unexpected_count"))
    examples = details.get("partial_unexpected_list") or []
    return CheckResult(stage, config.type, config.kwargs.get("column", config.kwargs.get("column_A", "")),
                       bool(result.success), str(observed), json.dumps(examples[:EXAMPLES], default=str))


def validate_requests(requests: pd.DataFrame, max_model_len: int, read: int, rejected: int,
                      accepted: int | None = None) -> list[CheckResult]:
    """Accepted requests: ids unique and present, token counts within the context; read = accepted + rejected
    (``accepted``: the count when ``requests`` is a sample of them)."""
    import great_expectations as gx

    e = gx.expectations
    results = _validate("input", requests, [
        e.ExpectColumnValuesToNotBeNull(column="request_id"),
        e.ExpectColumnValuesToBeUnique(column="request_id"),
        e.ExpectColumnValuesToBeBetween(column="num_prompt_tokens", min_value=1, max_value=max_model_len - 1),
        e.ExpectColumnValuesToBeBetween(column="max_tokens", min_value=1, max_value=max_model_len),
    ])
    accepted = len(requests) if accepted is None else accepted
    counts = pd.DataFrame({"read": [read], "accepted_plus_rejected": [accepted + rejected]})
    return results + _validate("input_counts", counts, [
        e.ExpectColumnPairValuesToBeEqual(column_A="read", column_B="accepted_plus_rejected"),
    ])


def validate_outputs(outputs: pd.DataFrame, accepted_ids: list[str] | None, max_model_len: int) -> list[CheckResult]:
    """Exactly one output per accepted request (unique, in the accepted set, as many), sane token counts.
    ``accepted_ids`` None: ``outputs`` is a sample, whose count and membership SQL checks instead."""
    import great_expectations as gx

    e = gx.expectations
    whole = [] if accepted_ids is None else [
        e.ExpectTableRowCountToEqual(value=len(accepted_ids)),
        e.ExpectColumnValuesToBeInSet(column="request_id", value_set=accepted_ids),
    ]
    return _validate("outputs", outputs, whole + [
        e.ExpectColumnValuesToNotBeNull(column="request_id"),
        e.ExpectColumnValuesToBeUnique(column="request_id"),
        e.ExpectColumnValuesToBeInSet(column="status", value_set=["ok", "error"]),
        e.ExpectColumnValuesToBeBetween(column="num_output_tokens", min_value=0, max_value=max_model_len),
        e.ExpectColumnValuesToBeInSet(column="finish_reason", value_set=["stop", "length", "error"]),
    ])


def check_requests(con: "duckdb.DuckDBPyConnection", run_id: str, max_model_len: int, read: int,
                   rejected: int) -> list[CheckResult]:
    """``validate_requests`` on the run's requests table; above GX_ROWS on a sample, plus exact SQL counts."""
    query = "SELECT request_id, num_prompt_tokens, max_tokens FROM requests WHERE run_id = ?"
    total = _count(con, "requests", run_id)
    if total <= GX_ROWS:
        return validate_requests(con.execute(query, [run_id]).df(), max_model_len, read, rejected)
    sample = validate_requests(_sample(con, query, run_id), max_model_len, read, rejected, accepted=total)
    return _sampled(sample, total) + sql_checks(con, "input", "requests", run_id, [
        ("expect_column_values_to_not_be_null", "request_id", "count(*) FILTER (request_id IS NULL)"),
        ("expect_column_values_to_be_unique", "request_id", "count(*) - count(DISTINCT request_id)"),
        ("expect_column_values_to_be_between", "num_prompt_tokens",
         f"count(*) FILTER (num_prompt_tokens NOT BETWEEN 1 AND {max_model_len - 1})"),
        ("expect_column_values_to_be_between", "max_tokens",
         f"count(*) FILTER (max_tokens NOT BETWEEN 1 AND {max_model_len})"),
    ])


def check_outputs(con: "duckdb.DuckDBPyConnection", run_id: str, max_model_len: int) -> list[CheckResult]:
    """``validate_outputs`` on the run's outputs table; above GX_ROWS on a sample, plus exact SQL counts."""
    query = "SELECT request_id, status, num_output_tokens, finish_reason FROM outputs WHERE run_id = ?"
    total = _count(con, "outputs", run_id)
    if total <= GX_ROWS:
        accepted = [r[0] for r in con.execute("SELECT request_id FROM requests WHERE run_id = ?", [run_id]).fetchall()]
        return validate_outputs(con.execute(query, [run_id]).df(), accepted, max_model_len)
    sample = validate_outputs(_sample(con, query, run_id), None, max_model_len)
    return _sampled(sample, total) + sql_checks(con, "outputs", "outputs", run_id, [
        ("expect_table_row_count_to_equal", "",
         "count(*) - (SELECT count(*) FROM requests r WHERE r.run_id = $run_id)"),
        ("expect_column_values_to_not_be_null", "request_id", "count(*) FILTER (request_id IS NULL)"),
        ("expect_column_values_to_be_unique", "request_id", "count(*) - count(DISTINCT request_id)"),
        ("expect_column_values_to_be_in_set", "request_id",
         "count(*) FILTER (request_id NOT IN (SELECT request_id FROM requests r WHERE r.run_id = $run_id))"),
        ("expect_column_values_to_be_in_set", "status", "count(*) FILTER (status NOT IN ('ok', 'error'))"),
        ("expect_column_values_to_be_between", "num_output_tokens",
         f"count(*) FILTER (num_output_tokens NOT BETWEEN 0 AND {max_model_len})"),
        ("expect_column_values_to_be_in_set", "finish_reason",
         "count(*) FILTER (finish_reason NOT IN ('stop', 'length', 'error'))"),
    ])


def sql_checks(con: "duckdb.DuckDBPyConnection", stage: str, table: str, run_id: str,
               checks: list[tuple[str, str, str]]) -> list[CheckResult]:
    """Exact checks over every row of the run in ``table``: (expectation, column, SQL counting the rows that
    break it; a count off the expected one for a table-level check). One scan for all of them."""
    counts = con.execute(f"SELECT {', '.join(sql for _, _, sql in checks)} FROM {table} WHERE run_id = $run_id",
                         {"run_id": run_id}).fetchone()
    return [CheckResult(f"{stage} (all rows, SQL)", expectation, column, int(count) == 0, str(int(count)), "[]")
            for (expectation, column, _), count in zip(checks, counts)]


def _count(con: "duckdb.DuckDBPyConnection", table: str, run_id: str) -> int:
    return con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [run_id]).fetchone()[0]


def _sample(con: "duckdb.DuckDBPyConnection", query: str, run_id: str) -> pd.DataFrame:
    # seeded: a re-run checks the same rows
    return con.execute(f"SELECT * FROM ({query}) USING SAMPLE reservoir({GX_ROWS} ROWS) REPEATABLE (0)",
                       [run_id]).df()


def _sampled(results: list[CheckResult], total: int) -> list[CheckResult]:
    """GX results on a sample, their stage naming it (the counts checks stay whole)."""
    for r in results:
        if not r.stage.endswith("_counts"):
            r.stage = f"{r.stage} (great-expectations on {GX_ROWS:,} of {total:,} rows)"
    return results


def raise_on_failure(results: list[CheckResult]) -> None:
    failed = [r for r in results if not r.success]
    if failed:
        lines = [f"- {r.stage}: {r.expectation}({r.column}) failed; observed {r.observed}; examples {r.unexpected}"
                 for r in failed]
        raise ValidationFailed(f"{len(failed)} of {len(results)} checks failed:\n" + "\n".join(lines))
