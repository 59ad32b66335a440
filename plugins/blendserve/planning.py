"""The pipeline's planning half: warm-up sample, output-length estimates, the plan file.

Glue between the run configuration and the planner (``blendserve.planner``)
and sampler (``blendserve.sampling``): which cost model and KV capacity a run
plans with, which requests are identical, which ones the warm-up runs, and
the plan rows every shard task reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from blendserve import storage
from blendserve.batch import RequestBatch
from blendserve.config import RunConfig
from blendserve.costmodel import CostModel, get_hardware

if TYPE_CHECKING:
    from blendserve.planner.prefix_tree import PrefixTree
    from blendserve.sampling import Estimates

PLANNER_POLICIES = ("blendserve", "blendserve-nosplit")  # built by planner.build_plan with shards from both ends


def submitted_policy(policy: str) -> str:
    """The registry policy whose order a run's shards submit: the dual scan's static list for ``blendserve``.

    Shards hand the engine one list (the plan), so the prediction a run is
    measured against is that list's, not the step-by-step controller's.
    """
    return "blendserve-static" if policy == "blendserve" else policy
WARMUP_SHARD = -1  # shard number of the warm-up phase's results


def cost_model_for(config: RunConfig) -> CostModel:
    """The simulator engine's model and GPU; for real engines, the model's own shapes and the
    configured hardware profile (on a CPU the profile is nominal: the order depends on density
    ratios, which any profile scales alike)."""
    if config.engine == "simulator":
        from blendserve.engines.sim_engine import simulator_setup

        return simulator_setup(config)[0]
    from blendserve.costmodel.model_spec import from_hf_config

    return CostModel(from_hf_config(config.model_path() / "config.json"), get_hardware(config.hardware))


def kv_capacity_for(config: RunConfig, cost: CostModel) -> int:
    """M of the dual scan, in tokens: what the engine that runs the plan can hold."""
    if config.engine == "simulator":
        from blendserve.engines.sim_engine import simulator_setup
        from blendserve.sim import kv_capacity_tokens

        return kv_capacity_tokens(cost, simulator_setup(config)[1])
    return int(config.kv_cache_gb * 2**30 // cost.model.kv_bytes_per_token)


def sampling_keys(requests: pa.Table) -> np.ndarray:
    """int64 per request: equal keys (and equal tokens) mean one inference answers both.
    Only deterministic requests (greedy, or sampled with a fixed seed) can share an answer."""
    columns = [requests.column(c).to_pylist() for c in ("max_tokens", "temperature", "top_p", "seed", "stop_json")]
    keys = np.empty(requests.num_rows, dtype=np.int64)
    for i, (max_tokens, temperature, top_p, seed, stop) in enumerate(zip(*columns)):
        deterministic = temperature == 0 or seed is not None
        identity = (max_tokens, round(temperature, 6), round(top_p, 6), seed, stop) if deterministic else ("row", i)
        keys[i] = hash(identity) & 0x7FFF_FFFF_FFFF_FFFF
    return keys


@dataclass
class Inputs:
    table: pa.Table  # requests.parquet
    batch: RequestBatch
    keys: np.ndarray  # sampling keys (dedupe)
    cost: CostModel
    kv_capacity: int  # tokens


def load_inputs(config: RunConfig) -> Inputs:
    table = storage.read_parquet([config.requests_path])
    cost = cost_model_for(config)
    return Inputs(table, RequestBatch.from_table(table), sampling_keys(table), cost, kv_capacity_for(config, cost))


def select_warmup(config: RunConfig, inputs: Inputs) -> list[str]:
    """Request ids the warm-up phase runs (empty when the policy does not use estimates)."""
    if config.sample_rate <= 0 or config.policy not in PLANNER_POLICIES + ("dfs", "density") or not len(inputs.batch):
        return []
    from blendserve.planner.prefix_tree import build_prefix_tree
    from blendserve.sampling import select_samples

    tree = build_prefix_tree(inputs.batch, inputs.cost, sampling_keys=inputs.keys)
    # Every subtree holding 1/16 of the job gets a sample (up to the sampler's 100): in a small job
    # a 1% draw alone can miss a whole kind of request and leave it with another kind's lengths.
    min_subtree = max(2, min(100, len(inputs.batch) // 16))
    sampled = select_samples(inputs.batch, tree, rate=config.sample_rate, min_subtree=min_subtree, seed=0)
    return inputs.batch.request_ids[sampled].astype(str).tolist()


@dataclass
class Warmup:
    tree: "PrefixTree"  # the prefix tree the estimates were made on
    sampled: np.ndarray  # batch indices of the requests the warm-up ran
    estimates: "Estimates"  # per request: mean, high quantile, where it came from
    observed: dict[str, int]  # request id -> output tokens the warm-up produced


def estimates_from_warmup(inputs: Inputs, observed: dict[str, int]) -> Warmup | None:
    if not observed:
        return None
    from blendserve.planner.prefix_tree import build_prefix_tree
    from blendserve.sampling import estimate_outputs

    tree = build_prefix_tree(inputs.batch, inputs.cost, sampling_keys=inputs.keys)
    ids = inputs.batch.request_ids.astype(str)
    sampled = np.flatnonzero(np.isin(ids, list(observed)))
    lengths = np.array([observed[i] for i in ids[sampled]], dtype=np.int64)
    return Warmup(tree, sampled, estimate_outputs(inputs.batch, tree, sampled, lengths), observed)


def plan_rows(config: RunConfig, inputs: Inputs, warm: Warmup | None) -> pa.Table:
    """One row per accepted request: its shard and position, or the request whose result it takes."""
    from blendserve.planner.estimates import default_output_estimates

    batch, ids = inputs.batch, inputs.batch.request_ids.astype(str)
    estimates = default_output_estimates(batch) if warm is None else warm.estimates.mean
    done, fanned, answered_by, rest = _split_done(batch, warm)
    rows = _policy_rows(config, inputs, rest, estimates)
    extra = pa.table({"request_id": ids[done].tolist() + ids[fanned].tolist(),
                      "shard": [WARMUP_SHARD] * (len(done) + len(fanned)),
                      "position": list(range(len(done) + len(fanned))),
                      "est_output_tokens": estimates[np.concatenate([done, fanned])].astype(np.int32).tolist(),
                      "answered_by": ids[done].tolist() + answered_by})
    return pa.concat_tables([rows, extra.cast(rows.schema)])


def _split_done(batch: RequestBatch, warm: Warmup | None) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """Sampled requests (done), their duplicates (fanned out from them) and the rest (to plan)."""
    if warm is None:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), [], np.arange(len(batch))
    from blendserve.sampling import split_warmup

    tree = warm.tree
    split = split_warmup(tree, warm.sampled)
    reps = batch.request_ids[tree.leaf_request[tree.request_leaf[split.fanned]]].astype(str).tolist()
    return split.run, split.fanned, reps, split.rest


def _policy_rows(config: RunConfig, inputs: Inputs, rest: np.ndarray, estimates: np.ndarray) -> pa.Table:
    sub = inputs.batch.take(rest)
    if config.policy in PLANNER_POLICIES:
        from blendserve.planner.plan import build_plan, plan_table

        plan = build_plan(sub, inputs.cost, output_estimates=estimates[rest],
                          sampling_keys=inputs.keys[rest], shards=config.shards, keep_sharing=config.keep_sharing,
                          with_split=config.policy == "blendserve")
        table = plan_table(plan, sub, inputs.cost)
        return table.select(["request_id", "shard", "position", "est_output_tokens", "answered_by"])
    return _ordered_rows(config, inputs, sub, estimates[rest])


def _ordered_rows(config: RunConfig, inputs: Inputs, sub: RequestBatch, estimates: np.ndarray) -> pa.Table:
    """Baselines (fcfs, dfs, balance, density): the policy's order cut into equal contiguous shards."""
    import blendserve.planner  # noqa: F401  (registers dfs and density)
    from blendserve.admission import StaticOrder
    from blendserve.policies import PolicyContext, make_controller

    controller = make_controller(config.policy, PolicyContext(sub, estimates, inputs.cost, inputs.kv_capacity))
    if not isinstance(controller, StaticOrder):
        raise ValueError(f"policy {config.policy!r} admits at run time; plan it with build_plan")
    order = controller.order
    cuts = np.linspace(0, len(order), config.shards + 1).astype(int)
    shard = np.repeat(np.arange(config.shards), np.diff(cuts))
    position = np.arange(len(order)) - cuts[shard]
    ids = sub.request_ids[order].astype(str).tolist()
    return pa.table({"request_id": ids, "shard": shard.astype(np.int32), "position": position.astype(np.int32),
                     "est_output_tokens": estimates[order].astype(np.int32), "answered_by": ids})


def estimate_rows(inputs: Inputs, warm: Warmup | None) -> pa.Table | None:
    """Per request: estimate, high quantile, where it came from (for the samples table)."""
    if warm is None:
        return None
    from blendserve.sampling import estimate_table

    actual = np.full(len(inputs.batch), -1, dtype=np.int64)
    actual[warm.sampled] = [warm.observed[i] for i in inputs.batch.request_ids[warm.sampled].astype(str)]
    return estimate_table(inputs.batch, warm.estimates, actual)
