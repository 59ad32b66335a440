"""bench_peer.py's pieces that need no engine: the CLI settings it matches, its figures, its table."""

from __future__ import annotations

import json
from pathlib import Path

from blendserve.cli import build_parser
from blendserve.config import default_dtype
from blendserve.commands.run import config_from_args

BENCH = Path(__file__).resolve().parent.parent / "bench"


def run_config(*flags: str):
    return config_from_args(build_parser().parse_args(["run", "--input", "x.jsonl", "--db", "x.duckdb", *flags]))


def test_blendserve_run_takes_the_engine_settings_the_peer_bench_matches() -> None:
    config = run_config("--dtype", "float32", "--max-num-seqs", "8", "--max-num-batched-tokens", "4096")
    assert config.extra["vllm"] == {"dtype": "float32", "max_num_batched_tokens": 4096} and config.max_num_seqs == 8
    default = run_config()
    assert default.extra["vllm"] == {"dtype": default_dtype()} and default.max_num_seqs == 64  # as before the flags
    assert run_config("--engine", "simulator").extra == {}


def test_figures_and_table(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_peer
    import tables

    def run(system: str, wall: float, answers: dict, **stages) -> "bench_peer.SystemRun":
        return bench_peer.SystemRun(system, "mixed", 0, wall, 2, 0, 90, 10, 100 / wall, 0.5, answers=answers, **stages)

    runs = [run("blendserve", 8.0, {"a": "B", "b": " yes"}, inference_s=4.0, job_s=7.0, replay_s=5.0, replay_error=0.25),
            run("run-batch", 10.0, {"a": "B", "b": "no"}), run("run-batch-sorted", 9.0, {"a": "B", "b": "no "})]
    summary, same = bench_peer.summarize(runs), bench_peer.agreement(runs)
    assert list(summary) == ["run-batch", "run-batch-sorted", "blendserve"]  # the same order in every table
    assert same == {"blendserve": 0.5, "run-batch-sorted": 1.0}
    assert summary["blendserve"]["job_s"] == 7.0 and "job_s" not in summary["run-batch"]
    data = {"provenance": {"cpu": "cpu", "cores": 2, "python": "3.11", "numpy": "2", "commit": "abc",
                           "uncommitted": [], "date": "today", "command": "bench/bench_peer.py --quick --out"},
            "settings": {"dtype": "float32", "max_num_seqs": 32, "max_model_len": 2048, "kv_gb": 1.0,
                         "locality_kv_gb": 0.25},
            "quick": True, "scale": 1.0, "rounds": 1, "batches": {"mixed": {
                "requests": 2, "prompt_tokens": 90, "max_output_tokens": 10, "kv_gb": 1.0, "kv_tokens": 100,
                "distinct_prefix_tokens": 0, "systems": summary, "identical_vs_run_batch": same}}}
    page = tables.peer_section(data)
    assert "| mixed | vllm run-batch | 10.0 (10.0 .. 10.0) |" in page
    assert "| **1.25x** | **1.12x** | 50.0% | 7 / 4 | 5 (+25%) | 0 |" in page  # blendserve over run-batch and over sorted


def test_a_full_size_batch_run_alone_joins_the_stored_ones(tmp_path, monkeypatch) -> None:
    """Full-size batches take tens of minutes each, so they are measured by separate runs: --out keeps the
    stored batches this run did not measure (same size and settings only), each with the run that measured it."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_peer
    import common
    import page_parts
    import tables

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    settings = {"dtype": "float32", "max_num_seqs": 32}
    earlier_run = {"commit": "old", "command": "bench_peer.py --batches mixed --out", "date": "yesterday", "cpu": "c",
                   "cores": 2, "python": "3", "numpy": "2", "uncommitted": []}
    (tmp_path / "peer-full.json").write_text(json.dumps({
        "provenance": earlier_run, "settings": settings, "quick": False, "scale": 1.0, "rounds": 3,
        "batches": {"mixed": {"requests": 440}, "locality": {"requests": 1}}}))
    now_run = {**earlier_run, "commit": "new", "command": "bench_peer.py --batches locality --out", "date": "today"}
    data = {"settings": settings, "quick": False, "scale": 1.0, "rounds": 1,
            "batches": {"locality": {"requests": 360, "rounds": 1, "provenance": now_run}}}
    merged = bench_peer.with_earlier("peer-full", data)
    assert list(merged["batches"]) == ["mixed", "locality"]
    assert merged["batches"]["locality"]["requests"] == 360  # measured now: replaces the stored one
    assert merged["batches"]["mixed"] == {"requests": 440, "provenance": earlier_run, "rounds": 3}
    assert tables._peer_rounds({**merged, "provenance": now_run}) == "3 (mixed), 1 (locality)"
    assert "mixed: blendserve old" in page_parts.measured_by({**merged, "provenance": now_run}, merged["batches"], "Batches")
    other = {**data, "settings": {**settings, "max_num_seqs": 8}}  # other settings: nothing is kept
    assert list(bench_peer.with_earlier("peer-full", other)["batches"]) == ["locality"]


def test_the_large_batch_is_ten_quick_mixed_batches_of_distinct_requests(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import peer_batches as pb

    rows = pb.build("large", pb.LARGE, seed=0)
    quick = pb.build("mixed", pb.QUICK, seed=0)
    kinds = lambda batch: {k: sum(r["custom_id"].startswith(k) for r in batch) for k in ("mmlu", "rewrite", "label")}  # noqa: E731
    assert kinds(rows) == {k: n * pb.LARGE_FACTOR for k, n in kinds(quick).items()} == {
        "mmlu": 960, "rewrite": 240, "label": 400}
    assert len({json.dumps(r["body"]["messages"]) for r in rows}) == len(rows)  # nothing repeats: no free hits
    assert {r["body"]["max_tokens"] for r in rows if r["custom_id"].startswith("rewrite")} == {pb.QUICK.rewrite_tokens}
    assert [r["custom_id"] for r in rows] != sorted(r["custom_id"] for r in rows)  # shuffled into one arrival order
