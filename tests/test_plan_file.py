"""What the run folder and the plan table claim about order is what ran: the plan step writes a
position only where the shard runs it, each shard records the order it admitted, and the report
explains that order without planning again."""

from __future__ import annotations

import duckdb
import pytest

from blendserve import files
from blendserve.pipeline import plan as plan_module
from blendserve.pipeline.steps import explain_step, infer_shard, ingest_step, load_step, plan_step


def plan_positions(config) -> dict[str, int | None]:  # type: ignore[no-untyped-def]
    rows = files.read_parquet([config.plan_path]).to_pylist()
    return {r["request_id"]: r["position"] for r in rows}


def loaded_plan(config) -> list[tuple]:  # type: ignore[no-untyped-def]
    with duckdb.connect(str(config.db), read_only=True) as con:
        return con.execute("SELECT request_id, shard, position, answered_by FROM plan WHERE run_id = ?",
                           [config.run_id]).fetchall()


def admitted(config, shard: int) -> list[str]:  # type: ignore[no-untyped-def]
    return files.read_parquet([config.shard_dir(shard) / "admitted.parquet"]).column("request_id").to_pylist()


@pytest.mark.parametrize("policy", ["blendserve", "dfs"])
def test_a_policy_that_orders_inside_its_shards_claims_no_position_until_the_shards_ran(make_config, policy):
    config = make_config(engine="simulator", policy=policy, shards=2, sample_rate=0.1, run_id=f"pos-{policy}")
    ingest_step(config)
    plan_step(config)
    assert set(plan_positions(config).values()) == {None}  # the plan does not fix the order inside a shard
    for shard in range(2):
        infer_shard(config, shard)
    load_step(config)
    rows = loaded_plan(config)
    ran = {r[0]: (r[1], r[2]) for r in rows}
    for shard in range(2):
        order = admitted(config, shard)
        assert order and [ran[i] for i in order] == [(shard, k) for k in range(len(order))]
    # a duplicate takes its twin's place; every request now has one
    assert all(position is not None for _, _, position, _ in rows)
    assert all(ran[rid] == ran[twin] for rid, _, _, twin in rows)


def test_fcfs_runs_the_plans_positions(make_config):
    config = make_config(engine="simulator", policy="fcfs", shards=2, run_id="pos-fcfs")
    ingest_step(config)
    plan_step(config)
    planned = plan_positions(config)
    assert None not in planned.values()
    for shard in range(2):
        infer_shard(config, shard)
        order = admitted(config, shard)
        assert [planned[i] for i in order] == list(range(len(order)))  # admitted exactly in plan order


def test_a_retried_shard_records_one_admission_per_request(make_config):
    from blendserve.pipeline.steps import InjectedFault

    config = make_config(engine="simulator", sample_rate=0.1, part_rows=1, fail_after_rows=3, run_id="pos-retry")
    ingest_step(config)
    plan_step(config)
    with pytest.raises(InjectedFault):
        infer_shard(config, 0)
    config.fail_after_rows = -1
    infer_shard(config, 0)
    order = admitted(config, 0)
    answered = [r[0] for r in loaded_plan_after_load(config) if r[0] == r[3]]
    assert len(order) == len(set(order)) == len(answered) and set(order) == set(answered)


def loaded_plan_after_load(config) -> list[tuple]:  # type: ignore[no-untyped-def]
    load_step(config)
    return loaded_plan(config)


def test_explain_reads_the_order_that_ran_and_plans_nothing(make_config, monkeypatch):
    config = make_config(engine="simulator", shards=2, sample_rate=0.1, run_id="pos-explain")
    ingest_step(config)
    plan_step(config)
    for shard in range(2):
        infer_shard(config, shard)
    load_step(config)

    def no_plan(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("explain planned the run again")

    monkeypatch.setattr(plan_module, "cut_shards", no_plan)  # every build_plan ends in it
    text = explain_step(config)
    assert "prefix sharing" in text and "2 shard(s)" in text
