"""great-expectations checks on the accepted requests and on the outputs.

GX 1.x with an ephemeral context: suites are built in code, run inside the
task, and their results are stored in DuckDB (``validation_results``). A failed
check raises ``ValidationFailed`` with the expectation, the column and example
rows, so the task log says what is wrong.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pandas as pd

EXAMPLES = 5  # unexpected values quoted in a failure message


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


def validate_requests(requests: pd.DataFrame, max_model_len: int, read: int, rejected: int) -> list[CheckResult]:
    """Accepted requests: ids unique and present, token counts within the context; read = accepted + rejected."""
    import great_expectations as gx

    e = gx.expectations
    results = _validate("input", requests, [
        e.ExpectColumnValuesToNotBeNull(column="request_id"),
        e.ExpectColumnValuesToBeUnique(column="request_id"),
        e.ExpectColumnValuesToBeBetween(column="num_prompt_tokens", min_value=1, max_value=max_model_len - 1),
        e.ExpectColumnValuesToBeBetween(column="max_tokens", min_value=1, max_value=max_model_len),
    ])
    counts = pd.DataFrame({"read": [read], "accepted_plus_rejected": [len(requests) + rejected]})
    return results + _validate("input_counts", counts, [
        e.ExpectColumnPairValuesToBeEqual(column_A="read", column_B="accepted_plus_rejected"),
    ])


def validate_outputs(outputs: pd.DataFrame, accepted_ids: list[str], max_model_len: int) -> list[CheckResult]:
    """Exactly one output per accepted request (unique, in the accepted set, as many), sane token counts."""
    import great_expectations as gx

    e = gx.expectations
    return _validate("outputs", outputs, [
        e.ExpectTableRowCountToEqual(value=len(accepted_ids)),
        e.ExpectColumnValuesToNotBeNull(column="request_id"),
        e.ExpectColumnValuesToBeUnique(column="request_id"),
        e.ExpectColumnValuesToBeInSet(column="request_id", value_set=accepted_ids),
        e.ExpectColumnValuesToBeInSet(column="status", value_set=["ok", "error"]),
        e.ExpectColumnValuesToBeBetween(column="num_output_tokens", min_value=0, max_value=max_model_len),
        e.ExpectColumnValuesToBeInSet(column="finish_reason", value_set=["stop", "length", "error"]),
    ])


def raise_on_failure(results: list[CheckResult]) -> None:
    failed = [r for r in results if not r.success]
    if failed:
        lines = [f"- {r.stage}: {r.expectation}({r.column}) failed; observed {r.observed}; examples {r.unexpected}"
                 for r in failed]
        raise ValidationFailed(f"{len(failed)} of {len(results)} checks failed:\n" + "\n".join(lines))
