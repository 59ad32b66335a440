"""great-expectations checks catch what they promise and name the offending rows."""

from __future__ import annotations

import pandas as pd
import pytest

from blendserve.validation import ValidationFailed, raise_on_failure, validate_outputs, validate_requests


def outputs_frame(ids: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"request_id": ids, "status": ["ok"] * len(ids),
                         "num_output_tokens": [3] * len(ids), "finish_reason": ["stop"] * len(ids)})


def test_outputs_one_per_accepted_request_passes():
    results = validate_outputs(outputs_frame(["a", "b", "c"]), ["a", "b", "c"], 2048)
    assert results and all(r.success for r in results)
    raise_on_failure(results)


@pytest.mark.parametrize("ids,failing,named", [
    (["a", "b"], "expect_table_row_count_to_equal", "2"),  # c lost
    (["a", "b", "b"], "expect_column_values_to_be_unique", "b"),  # b twice
    (["a", "b", "zzz"], "expect_column_values_to_be_in_set", "zzz"),  # an output nobody asked for
])
def test_outputs_missing_duplicated_or_foreign_rows_fail(ids, failing, named):
    results = validate_outputs(outputs_frame(ids), ["a", "b", "c"], 2048)
    failed = [r for r in results if not r.success]
    assert [r.expectation for r in failed] == [failing]
    with pytest.raises(ValidationFailed, match=failing) as err:
        raise_on_failure(results)
    assert named in str(err.value)


def test_request_checks_name_the_duplicate_and_the_count_mismatch():
    frame = pd.DataFrame({"request_id": ["a", "b", "b"], "num_prompt_tokens": [5, 6, 7], "max_tokens": [8, 8, 8]})
    results = validate_requests(frame, 2048, read=5, rejected=1)  # 3 + 1 != 5
    failed = {r.expectation: r for r in results if not r.success}
    assert "'b'" in failed["expect_column_values_to_be_unique"].unexpected.replace('"', "'")
    assert "expect_column_pair_values_to_be_equal" in failed
    assert len(failed) == 2
