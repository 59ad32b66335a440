"""The benches' hidden-length mode: what a user would submit, and each policy run as a shard runs it."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from blendserve.batch import UNKNOWN
from blendserve.sim import SimConfig
from blendserve.sim.compare import compare_policies, true_outputs

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture()
def bench(monkeypatch) -> ModuleType:
    """bench/ on the path; every module loaded from bench/ is dropped again afterwards, all of them: a bench script
    left behind would keep the dropped ``common`` that a later test's monkeypatch cannot reach."""
    monkeypatch.syspath_prepend(str(BENCH))
    import as_shard

    yield as_shard
    for name, module in list(sys.modules.items()):
        if Path(getattr(module, "__file__", None) or "/").parent == BENCH:
            sys.modules.pop(name, None)


def _batch(n: int = 600):
    from synthetic import synthetic_batch

    return synthetic_batch(n, mean_prompt=60, family_size=50, seed=1)


def test_hide_lengths_one_round_cap_nothing_known_truth_untouched(bench) -> None:
    from common import hide_lengths

    batch = _batch()
    assert (batch.expected_output_tokens != UNKNOWN).any()  # the synthetic batch knows some lengths
    truth = true_outputs(batch)
    hidden, cap = hide_lengths(batch)
    assert cap == 1 << int(truth.max() - 1).bit_length() and cap >= truth.max() > cap // 2
    assert (hidden.max_tokens == cap).all()
    assert (hidden.expected_output_tokens == UNKNOWN).all()
    np.testing.assert_array_equal(hidden.sim_output_tokens, batch.sim_output_tokens)
    np.testing.assert_array_equal(true_outputs(hidden), truth)
    np.testing.assert_array_equal(hidden.tokens, batch.tokens)
    assert (batch.expected_output_tokens != UNKNOWN).any()  # the input batch is left as it was


def test_hide_lengths_keeps_a_truth_the_batch_held_elsewhere(bench) -> None:
    """Without sim_output_tokens the truth was the known length: hiding it must not change what runs."""
    import dataclasses

    from common import hide_lengths

    batch = _batch()
    batch = dataclasses.replace(batch, sim_output_tokens=np.full(len(batch), UNKNOWN, dtype=np.int32))
    hidden, _ = hide_lengths(batch)
    np.testing.assert_array_equal(true_outputs(hidden), true_outputs(batch))


def test_compare_as_shard_rows_match_compare_policies(bench) -> None:
    from common import SETUPS, hide_lengths

    hidden, _ = hide_lengths(_batch())
    # a small KV, so the fillers beside the sample cannot admit the whole batch before the plan exists
    cost, config = SETUPS["8b"].cost(), SimConfig(kv_capacity_tokens=8_000)
    policies = ["fcfs", "dfs", "blendserve"]
    shard = bench.compare_as_shard(hidden, cost, config, policies)
    plain = compare_policies(hidden, cost, config, policies)
    assert set(shard) == set(plain) and shard["t_opt_s"] == plain["t_opt_s"]
    rows = {r["policy"]: r for r in shard["policies"]}
    assert set(rows["dfs"]) >= set(plain["policies"][0])
    assert rows["fcfs"]["sampled"] == 0  # runs bare: no warm-up
    assert rows["blendserve"]["sampled"] > 0 and rows["blendserve"]["unplanned"] < len(hidden)
    assert rows["blendserve"]["chosen"]  # the choice of the plan made once the sample was back
    assert rows["dfs"]["sharing_vs_dfs"] == 1.0


def test_result_names_agree_with_render(bench) -> None:
    """The known-length file render.py looks for is the one the benches write."""
    import render
    from common import lengths_suffix, size_suffix

    for kind in ("policies-8b", "policies-70b", "timeline", "grid"):
        for requests in (40_000, 400_000):
            hidden = f"{kind}{lengths_suffix('hidden')}{size_suffix(requests)}"
            assert render.known(hidden) == f"{kind}{lengths_suffix('known')}{size_suffix(requests)}"
