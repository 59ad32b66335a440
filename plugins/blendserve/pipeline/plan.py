"""The plan step's library: the run's requests as the planner sees them, the plan, and the plan file.

``build_plan`` runs the tree side (prefix tree, sort and split, groups, the
dual scan's static list, shards) and times each stage. ``plan_rows`` is what
the plan step writes: each request's shard, and its position only where the
shard will run that position (policies that order on output lengths order
their shard's requests when it runs: ``pipeline.shard``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from blendserve import files
from blendserve.batch import RequestBatch, read_batch
from blendserve.config import RunConfig
from blendserve.costmodel import CostModel
from blendserve.costmodel.model_spec import DTYPE_BYTES, ModelSpec, from_hf_config
from blendserve.costmodel.profiles import resolve_hardware
from blendserve.engines.sim_engine import simulator_setup
from blendserve.planner.estimates import default_output_estimates
from blendserve.planner.groups import LeafGroups, leaf_groups
from blendserve.planner.items import ScanItems, ordered_leaves, scan_items
from blendserve.planner.prefix_tree import PrefixTree, build_prefix_tree
from blendserve.planner.shards import Shards, cut_shards
from blendserve.planner.sort_split import SplitResult, order_sharing
from blendserve.scheduling.admission import StaticOrder
from blendserve.scheduling.dual_scan import static_dual_scan_order
from blendserve.scheduling.registry import PolicyContext, get_policy, make_controller
from blendserve.sim import kv_capacity_tokens

PLAN_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("shard", pa.int32(), nullable=False),  # data-parallel rank that runs it
        pa.field("position", pa.int32()),  # admission order inside the shard; null where the shard decides it
        pa.field("leaf_group", pa.int32(), nullable=False),  # group in the density-ordered leaf list
        pa.field("side", pa.int8(), nullable=False),  # 0: taken by the left (compute) cursor, 1: right
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("est_output_tokens", pa.int32(), nullable=False),
        pa.field("density", pa.float64(), nullable=False),  # rho of the request alone
        pa.field("answered_by", pa.string(), nullable=False),  # request whose inference answers it (itself if unique)
    ]
)


@dataclass
class Plan:
    tree: PrefixTree  # the resource-aware prefix tree (one leaf per distinct inference)
    split: SplitResult | None  # what splitting did; None when it was off
    leaf_order: np.ndarray  # (m,) leaves left (compute-heavy) to right (memory-heavy)
    groups: LeafGroups  # leaf groups along leaf_order, with their densities
    items: ScanItems  # what the dual scan walks: one representative request per leaf
    stream: np.ndarray  # (m,) item positions in dual-scan admission order (the static order)
    sides: np.ndarray  # (m,) side of each stream pick: 0 left, 1 right
    shards: Shards  # data-parallel cut of the stream
    sharing_tokens: int  # prompt tokens reused from the previous leaf in leaf_order
    dfs_sharing_tokens: int  # the same for the depth-first order: the most any order gets
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage

    @property
    def target_density(self) -> float:
        return self.items.target_density


def build_plan(
    batch: RequestBatch,
    cost_model: CostModel,
    output_estimates: np.ndarray | None = None,
    sampling_keys: np.ndarray | None = None,
    shards: int = 1,
    keep_sharing: float = 0.99,
    with_split: bool = True,
    max_group: int = 256,
) -> Plan:
    """Plan ``batch``: prefix tree, layer-wise sort and split, dual scan, ``shards`` data-parallel shards.

    ``output_estimates`` (per request) defaults to
    ``estimates.default_output_estimates``; ``sampling_keys`` (per request,
    e.g. a hash of the sampling parameters) decides with the tokens which
    requests are identical. ``keep_sharing`` is the split budget: the
    fraction of the depth-first order's prefix sharing to keep.
    """
    clock = _Clock()
    tree = build_prefix_tree(batch, cost_model, output_estimates, sampling_keys)
    clock.lap("prefix_tree")
    leaf_order, split_result = ordered_leaves(tree, cost_model, keep_sharing, with_split)
    clock.lap("sort_split")
    groups = leaf_groups(tree, leaf_order, cost_model, max_group)
    items = scan_items(batch, tree, leaf_order, groups, with_duplicates=False)
    stream, sides = static_dual_scan_order(items)
    clock.lap("dual_scan")
    cut = cut_shards(stream, sides, item_costs(tree, leaf_order, cost_model), cost_model, shards)
    clock.lap("shards")
    return Plan(
        tree=tree,
        split=split_result,
        leaf_order=leaf_order,
        groups=groups,
        items=items,
        stream=stream,
        sides=sides,
        shards=cut,
        sharing_tokens=order_sharing(tree, leaf_order),
        dfs_sharing_tokens=int(tree.prompt_len.sum() - tree.stats.unique_prompt_tokens[0]),
        timings=clock.laps,
    )


def item_costs(tree: PrefixTree, leaf_order: np.ndarray, cost_model: CostModel) -> tuple[np.ndarray, ...]:
    """Per item position: prompt tokens not shared with the previous item, those shared, Mem seconds."""
    p = tree.prompt_len[leaf_order].astype(np.float64)
    d = tree.output_est[leaf_order].astype(np.float64)
    shared = np.zeros(len(leaf_order), dtype=np.float64)
    if len(leaf_order) > 1:
        shared[1:] = tree.leaf_pair_lcp(leaf_order[:-1], leaf_order[1:])
    return p - shared + d, shared, cost_model.mem_time(p, d)


class _Clock:
    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = now - self._last
        self._last = now


def plan_table(plan: Plan, batch: RequestBatch, cost_model: CostModel) -> pa.Table:
    """One row per request of ``batch``, in (shard, position) order; duplicates run where their twin runs."""
    m = len(plan.stream)
    shard_of_item = plan.shards.of_item
    position = np.empty(m, dtype=np.int64)
    side = np.empty(m, dtype=np.int8)
    stream_shard = shard_of_item[plan.stream]
    by_shard = np.argsort(stream_shard, kind="stable")  # keeps stream order inside each shard
    rank = np.arange(m) - np.searchsorted(stream_shard[by_shard], stream_shard[by_shard])
    position[plan.stream[by_shard]] = rank
    side[plan.stream] = plan.sides
    tree = plan.tree
    leaf_item = np.empty(tree.n_leaves, dtype=np.int64)
    leaf_item[plan.leaf_order] = np.arange(m)
    item = leaf_item[tree.request_leaf]  # every request takes its leaf's representative's place
    p = batch.prompt_lens
    d = tree.output_est[tree.request_leaf]
    table = pa.table(
        {
            "request_id": pa.array(batch.request_ids.astype(object), pa.string()),
            "shard": pa.array(shard_of_item[item], pa.int32()),
            "position": pa.array(position[item], pa.int32()),
            "leaf_group": pa.array(plan.groups.of_position[item], pa.int32()),
            "side": pa.array(side[item], pa.int8()),
            "prompt_tokens": pa.array(p, pa.int32()),
            "est_output_tokens": pa.array(d, pa.int32()),
            "density": pa.array(cost_model.density(cost_model.comp(p, d), cost_model.mem_time(p, d)), pa.float64()),
            "answered_by": pa.array(batch.request_ids[tree.leaf_request[tree.request_leaf]].astype(object), pa.string()),
        },
        schema=PLAN_SCHEMA,
    )
    return table.take(np.lexsort((position[item], shard_of_item[item])))


def write_plan(plan: Plan, batch: RequestBatch, cost_model: CostModel, out_dir: str | Path) -> Path:
    """Write ``plan.parquet`` into ``out_dir`` and return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "plan.parquet"
    pq.write_table(plan_table(plan, batch, cost_model), path)
    return path


def read_plan(path: str | Path) -> pa.Table:
    """A plan file as written by ``write_plan`` (a directory means its ``plan.parquet``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "plan.parquet"
    return pq.read_table(path, schema=PLAN_SCHEMA)


def cost_model_for(config: RunConfig) -> CostModel:
    """The simulator engine's model and GPU; for real engines, the model's own shapes and the hardware
    ``resolve_hardware`` picks: this machine's calibrated profile under ``auto`` (else the A100, nominal:
    the order depends on density ratios, which any profile scales alike), or the named one."""
    if config.engine == "simulator":
        return simulator_setup(config)[0]
    return CostModel(model_spec_for(config), resolve_hardware(config)[0])


def model_spec_for(config: RunConfig) -> ModelSpec:
    """The model's shapes, at the dtype the engine runs it in: a float32 run holds half the KV tokens."""
    spec = from_hf_config(config.model_path() / "config.json")
    return replace(spec, dtype_bytes=DTYPE_BYTES.get(config.engine_dtype, spec.dtype_bytes))


def kv_capacity_for(config: RunConfig, cost: CostModel) -> int:
    """M of the dual scan, in tokens: what the engine that runs the plan can hold."""
    if config.engine == "simulator":
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
    return read_batch(files.parquet_dataset([config.requests_path]), SAMPLING_COLUMNS, request_ids)


def load_inputs(config: RunConfig, requests: tuple[RequestBatch, pa.Table] | None = None) -> Inputs:
    """The planner's view of ``requests`` (``read_requests``'s; default: every accepted request of the run)."""
    batch, sampling = read_requests(config) if requests is None else requests
    cost = cost_model_for(config)
    return Inputs(batch, sampling, sampling_keys(batch, sampling), cost, kv_capacity_for(config, cost))


PLAN_COLUMNS = ["request_id", "shard", "position", "est_output_tokens", "answered_by"]  # what the plan step writes


def plan_rows(config: RunConfig, inputs: Inputs) -> pa.Table:
    """One row per accepted request, in run order inside each shard: its shard, its position where
    the plan decides it, and the request whose result it takes.

    Planned on what is known before anything runs (a known length, else
    ``max_tokens``): good enough to cut balanced shards of whole subtrees.
    A policy that orders on output lengths orders each shard's requests when
    the shard runs (``pipeline.shard``), so its rows carry no position: the
    shard records the order that ran (``admitted.parquet``), and ``load_step``
    puts it in DuckDB's ``plan.position``.
    """
    batch = inputs.batch
    estimates = default_output_estimates(batch)
    policy = get_policy(config.policy)
    if policy.tree_shards:
        plan = build_plan(batch, inputs.cost, output_estimates=estimates, sampling_keys=inputs.keys,
                          shards=config.shards, keep_sharing=config.keep_sharing,
                          with_split=config.policy != "blendserve-nosplit")
        table = plan_table(plan, batch, inputs.cost).select(PLAN_COLUMNS)
    else:
        table = _ordered_rows(config, inputs, estimates)
    if policy.needs_estimates:
        table = table.set_column(table.schema.get_field_index("position"), "position",
                                 pa.nulls(table.num_rows, pa.int32()))
    return table


def _ordered_rows(config: RunConfig, inputs: Inputs, estimates: np.ndarray) -> pa.Table:
    """Baselines (fcfs, dfs, balance, density): the policy's order cut into equal contiguous shards."""
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
