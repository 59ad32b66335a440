"""The warm-up inside each shard: its sample is admitted first, the rest is re-planned on the sampled
lengths, the estimates land in DuckDB, and a retried shard never runs a sampled request twice.

The simulator engine runs these (the warm-up logic is engine-independent); ``test_pipeline.py``
runs the same path on vLLM.
"""

from __future__ import annotations

import json

import duckdb
import pyarrow.compute as pc
import pytest

from blendserve import files
from blendserve.pipeline import parts, shard, steps
from blendserve.pipeline.steps import InjectedFault, infer_shard, ingest_step, load_step, plan_step
from blendserve.sampling.select import SHORT_CAP
from blendserve.scheduling import plan_worker
from blendserve.scheduling.choice import ChosenAdmission
from blendserve.scheduling.warmup import WarmupController
from conftest import FIXTURES, jsonl, record_admissions


def shard_runs(config, shard: int) -> list[str]:  # type: ignore[no-untyped-def]
    plan = files.read_parquet([config.plan_path]).filter(pc.equal(pc.field("shard"), shard))  # in run order
    return plan.filter(pc.equal(pc.field("request_id"), pc.field("answered_by"))).column("request_id").to_pylist()


def record_shard_admissions(monkeypatch: pytest.MonkeyPatch) -> list[tuple[shard.ShardWork, list[int]]]:
    """Every ShardWork the pipeline makes, with the engine indices its controller admitted, in order."""
    made: list[tuple[shard.ShardWork, list[int]]] = []
    original = steps.plan_shard

    def wrapped(*args, **kwargs) -> shard.ShardWork:  # type: ignore[no-untyped-def]
        plan = original(*args, **kwargs)
        made.append((plan, record_admissions(plan.controller)))
        return plan

    monkeypatch.setattr(steps, "plan_shard", wrapped)
    return made


def test_each_shard_admits_its_sample_first_then_replans_the_rest(make_config, monkeypatch):
    config = make_config(engine="simulator", sample_rate=0.1, shards=2, run_id="warm", max_num_seqs=2)  # room for few fillers
    # The choice lands at once: on a job this small its modelled time is longer than the job, and the quick
    # list would run the whole rest (tests/test_plan_worker.py covers that).
    for cost in ("PLAN_S_PER_REQUEST", "PLAN_S_PER_SIM_REQUEST", "PLAN_S_PER_SIM_STEP"):
        monkeypatch.setattr(plan_worker, cost, 0.0)
    ingest_step(config)
    plan_step(config)
    made = record_shard_admissions(monkeypatch)
    for shard in (0, 1):
        infer_shard(config, shard)
    assert len(made) == 2
    for plan, admitted in made:
        run = plan.scheduler.run
        assert len(run.sampled) >= 1
        assert admitted[: len(run.sampled)] == run.sampled.tolist()  # the sample goes in first
        assert sorted(admitted) == list(range(len(plan.todo)))  # then every other request, once
        assert isinstance(run.inner, ChosenAdmission)  # the rest: the registry's blendserve, on the sampled lengths

    load_step(config)
    with duckdb.connect(config.db, read_only=True) as con:
        inferences = con.execute("SELECT count(*) FROM plan WHERE run_id = ? AND request_id = answered_by",
                                 [config.run_id]).fetchone()[0]
        kinds = dict(con.execute("SELECT kind, count(*) FROM samples WHERE run_id = ? GROUP BY kind",
                                 [config.run_id]).fetchall())
        mismatched = con.execute(
            """SELECT count(*) FROM plan p JOIN samples s ON s.run_id = p.run_id AND s.request_id = p.answered_by
               WHERE p.run_id = ? AND p.est_output_tokens <> s.est_output_tokens""", [config.run_id]).fetchone()[0]
        sampled_actual = con.execute(
            """SELECT count(*) FROM samples s JOIN outputs o USING (run_id, request_id)
               WHERE s.run_id = ? AND s.kind = 'sampled' AND s.actual_output_tokens = o.num_output_tokens""",
            [config.run_id]).fetchone()[0]
    assert sum(kinds.values()) == inferences  # every inference has an estimate
    assert kinds["sampled"] == sum(len(plan.scheduler.sampled) for plan, _ in made) == sampled_actual
    assert mismatched == 0  # the plan table holds the estimates the shards planned with


def test_retried_shard_never_runs_a_sampled_request_twice(make_config):
    config = make_config(engine="simulator", sample_rate=0.1, part_rows=1, fail_after_rows=22, run_id="warm-crash")
    ingest_step(config)
    plan_step(config)
    with pytest.raises(InjectedFault):
        infer_shard(config, 0)
    done = parts.committed_lengths(config.shard_dir(0))
    runs = shard_runs(config, 0)
    retry = shard.plan_shard(config, runs, done)
    sampled = {retry.scheduler.ids[b] for b in retry.scheduler.sampled}
    assert sampled & set(done), "the first try should have answered part of the sample"
    assert not set(retry.todo) & set(done)  # committed answers, sampled or not, are not run again

    config.fail_after_rows = -1
    infer_shard(config, 0)
    rows = files.read_parquet(files.list_parts(config.shard_dir(0), parts.PART_GLOB))
    ids = rows.column("request_id").to_pylist()
    assert len(ids) == len(set(ids)) == len(runs)  # one committed answer per inference over both tries
    lengths = dict(zip(ids, rows.column("num_output_tokens").to_pylist()))
    estimates = files.read_parquet([config.shard_dir(0) / "estimates.parquet"]).to_pylist()
    observed = {r["request_id"]: r["actual_output_tokens"] for r in estimates if r["kind"] == "sampled"}
    assert set(observed) == sampled and all(observed[i] == lengths[i] for i in sampled)  # first try's lengths kept


def test_no_warmup_for_orders_that_ignore_lengths(make_config):
    config = make_config(engine="simulator", sample_rate=0.1, policy="fcfs", run_id="fcfs")
    ingest_step(config)
    plan_step(config)
    plan = shard.plan_shard(config, shard_runs(config, 0), {})
    assert plan.scheduler is None and plan.controller.order.tolist() == list(range(len(plan.todo)))


def test_a_shard_with_nothing_worth_sampling_plans_once_on_its_caps(make_config, tmp_path):
    """Every cap at SHORT_CAP or under: no request is sampled, so nothing is learnt, and the shard plans once
    as without a warm-up (no plan beside the engine, no re-plan); a cap over it brings the warm-up back."""
    rows = [json.loads(line) for line in (FIXTURES / "mini.jsonl").read_text().splitlines()]
    for row in rows:  # the fixture mixes OpenAI batch lines and plain ones
        row.get("body", row)["max_tokens"] = SHORT_CAP
    short = tmp_path / "short.jsonl"
    short.write_bytes(jsonl(*rows))
    config = make_config(engine="simulator", sample_rate=0.5, input=str(short), run_id="short-caps")
    ingest_step(config)
    plan_step(config)
    plan = shard.plan_shard(config, shard_runs(config, 0), {})
    assert not plan.scheduler.learns and len(plan.scheduler.sampled) == 0 and plan.estimate_table() is None
    assert isinstance(plan.controller, ChosenAdmission)  # the policy's own choice, made once over the whole shard

    rows[0].get("body", rows[0])["max_tokens"] = SHORT_CAP + 1
    short.write_bytes(jsonl(*rows))
    config = make_config(engine="simulator", sample_rate=0.5, input=str(short), run_id="one-longer-cap",
                         db=str(tmp_path / "longer.duckdb"))
    ingest_step(config)
    plan_step(config)
    plan = shard.plan_shard(config, shard_runs(config, 0), {})
    assert plan.scheduler.learns and isinstance(plan.controller, WarmupController)


def test_without_a_sample_the_shard_still_runs_the_registry_policy(make_config):
    config = make_config(engine="simulator", sample_rate=0, run_id="no-sample")
    ingest_step(config)
    plan_step(config)
    plan = shard.plan_shard(config, shard_runs(config, 0), {})
    assert isinstance(plan.controller, ChosenAdmission)  # what the prediction simulates is what runs
    assert plan.estimate_table() is None and len(plan.scheduler.sampled) == 0
