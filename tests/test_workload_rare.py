"""The rare-heavy mixes (issue 20): a few requests with outputs over 8k tokens among short answers, built from
the real data in ../shared/data through the workload builder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from blendserve.batch import RequestBatch
from blendserve.cli import main
from blendserve.costmodel import CostModel, get_hardware, get_model, unique_prompt_tokens
from blendserve.model_prep import REPO_ROOT
from blendserve.workload import (
    RARE_MIXES, WorkloadSpec, load_pools, mix_report, mix_spec, plan_requests, spec_pools, write_workload,
)
from blendserve.workload_sources import system_prompt

DATA = REPO_ROOT.parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} (the shared data sets) is absent")
COST = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
N = 2000
SYSTEM = 64  # WorkloadSpec.system_prompt_tokens


@pytest.fixture(scope="module")
def pools():
    return load_pools(WorkloadSpec(1, 1.0, 0.1), DATA)  # all three (tokenizing MMLU: the slow part)


def build(name: str, pools, path: Path, seed: int = 0):
    spec = mix_spec(name, N, seed=seed)
    drawn = spec_pools(spec, pools)
    plan = plan_requests(spec, drawn, COST)
    write_workload(plan, drawn, spec, path)
    return mix_report(plan, drawn, spec, COST)


@pytest.fixture(scope="module")
def mixes(pools, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, object, Path]]:
    out = {}
    for name in RARE_MIXES:
        path = tmp_path_factory.mktemp("rare") / f"{name}.parquet"
        report = build(name, pools, path)
        rows = pq.read_table(path, columns=["metadata_json", "sim_output_tokens", "prompt_token_ids"]).to_pydict()
        out[name] = (rows, report, path)
    return out


def _heavy(rows: dict) -> np.ndarray:
    return np.array([json.loads(m)["source"] == "video" for m in rows["metadata_json"]])


@pytest.mark.parametrize("name, low, high", [("rare-0.3", 0.002, 0.004), ("rare-1", 0.008, 0.012),
                                             ("shared-sys", 0.004, 0.011)])
def test_heavy_family_is_rare_long_and_most_of_the_decode(mixes, name: str, low: float, high: float) -> None:
    rows, report, _ = mixes[name]
    heavy, out = _heavy(rows), np.array(rows["sim_output_tokens"])
    assert len(out) == N and low <= heavy.mean() <= high
    assert (out[heavy] > 8192).all()  # the heavy family: every output over 8k tokens
    assert out[~heavy].max() <= 2048  # the rest: short answers
    assert out[heavy].sum() / out.sum() > 0.6  # yet most of the tokens decoded
    assert report.output_tokens == out.sum() and report.counts["video"] == heavy.sum()


def test_hidden_cap_is_above_8k(mixes, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    from common import hide_lengths

    for _, _, path in mixes.values():
        _, cap = hide_lengths(RequestBatch.from_parquet(path))
        assert cap in (16384, 32768)
    sys.modules.pop("common", None)


def test_rare_mixes_put_the_heavy_family_under_its_own_prefix(mixes) -> None:
    for name in ("rare-0.3", "rare-1"):
        rows, _, _ = mixes[name]
        heavy = _heavy(rows)
        firsts = [tuple(ids[:SYSTEM]) for ids in rows["prompt_token_ids"]]
        family = {f for f, h in zip(firsts, heavy) if h}
        assert family == {tuple(system_prompt("video", SYSTEM).tolist())}  # one subtree: its own system prompt
        assert family.isdisjoint(f for f, h in zip(firsts, heavy) if not h)  # no short answer in it


def test_shared_sys_every_request_starts_with_one_system_prompt(mixes) -> None:
    rows, report, _ = mixes["shared-sys"]
    assert set(report.counts) >= {"api", "video"} and report.counts["mmlu"] == 0
    system = system_prompt("azure-code", SYSTEM).tolist()
    assert all(ids[:SYSTEM] == system and len(ids) > SYSTEM for ids in rows["prompt_token_ids"])


@pytest.mark.parametrize("name", list(RARE_MIXES))
def test_report_counts_the_shared_prefixes_once(mixes, name: str) -> None:
    # (within 1%, as test_workload: MMLU questions of a subject share a few tokens past its prefix; counting
    # shared-sys's system prompt once per request instead would be 3% over)
    _, report, path = mixes[name]
    batch = RequestBatch.from_parquet(path)
    assert int(batch.prompt_lens.sum()) == report.input_tokens
    assert report.unique_prompt_tokens == pytest.approx(unique_prompt_tokens(batch), rel=0.01)


def test_rare_mix_is_seeded(pools, mixes, tmp_path) -> None:
    _, _, path = mixes["shared-sys"]
    build("shared-sys", pools, tmp_path / "again.parquet")
    build("shared-sys", pools, tmp_path / "other.parquet", seed=1)
    assert pq.read_table(path).equals(pq.read_table(tmp_path / "again.parquet"))
    assert not pq.read_table(path).equals(pq.read_table(tmp_path / "other.parquet"))


def test_paper_mix_specs_are_unchanged() -> None:
    """The cached paper mixes (.cache/bench/) were built from these specs: a change would silently stale them."""
    assert mix_spec("d1.4-s35", 40_000) == WorkloadSpec(40_000, 1.4, 0.35, name="d1.4-s35")
    assert spec_pools(mix_spec("d0.9-s5", 10), {"x": None}) == {"x": None}  # no system prompt added


def test_workload_command_builds_a_rare_mix(tmp_path) -> None:
    """``blendserve workload --mix shared-sys``: the CLI takes the rare-heavy mixes by name (and loads only the
    pools they draw from: no MMLU here)."""
    out = tmp_path / "shared.parquet"
    assert main(["workload", "--mix", "shared-sys", "--num-requests", "400", "--output", str(out),
                 "--data", str(DATA)]) == 0
    rows = pq.read_table(out, columns=["metadata_json", "prompt_token_ids"]).to_pydict()
    assert _heavy(rows).sum() == 2  # 0.5% of 400
    assert {tuple(ids[:SYSTEM]) for ids in rows["prompt_token_ids"]} == {tuple(system_prompt("azure-code", SYSTEM))}


def test_with_prefix_puts_the_ids_in_front_and_keeps_each_prompt() -> None:
    from blendserve.workload import with_prefix
    from blendserve.workload_sources import Pool

    tokens = np.array([1, 2, 3, 4, 5, 6], dtype=np.int32)  # rows: [1, 2, 3], [4], [5, 6]
    pool = Pool("video", np.array([0, 3, 4, 6]), tokens, np.array([3, 1, 2]), np.zeros(3, np.int64), None,
                ["f"] * 3, np.arange(1, 4), np.zeros(3, np.int64))
    out = with_prefix(pool, np.array([9, 8], dtype=np.int32))
    rows = [out.tokens[out.offsets[i] : out.offsets[i + 1]].tolist() for i in range(3)]
    assert rows == [[9, 8, 1, 2, 3], [9, 8, 4], [9, 8, 5, 6]] and out.prompt_lens.tolist() == [5, 3, 4]
    api = Pool("api", np.zeros(0, np.int64), np.zeros(0, np.int32), np.array([10, 3]), np.ones(2, np.int64), None,
               ["a"] * 2, np.arange(1, 3), np.zeros(2, np.int64))
    assert with_prefix(api, np.array([9, 8])).prompt_lens.tolist() == [12, 5]  # ids generated at write time
