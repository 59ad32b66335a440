"""The BlendServe plan: tree, sort and split, dual scan, shards; and its Parquet file.

``build_plan`` runs the stages in order and times each; ``write_plan`` and
``read_plan`` keep one row per request (duplicates included, pointing at the
request whose inference answers them), which is what the shard tasks run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel
from blendserve.planner.dual_scan import ScanItems, static_dual_scan_order
from blendserve.planner.groups import LeafGroups, leaf_groups
from blendserve.planner.prefix_tree import PrefixTree, build_prefix_tree
from blendserve.planner.shards import Shards, cut_shards
from blendserve.planner.sort_split import SplitResult, dfs_order, order_sharing, split

PLAN_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("shard", pa.int32(), nullable=False),  # data-parallel rank that runs it
        pa.field("position", pa.int32(), nullable=False),  # admission order inside the shard
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


def ordered_leaves(
    tree: PrefixTree, cost_model: CostModel, keep_sharing: float = 0.99, with_split: bool = True
) -> tuple[np.ndarray, SplitResult | None]:
    """Leaves in BlendServe order: layer-wise sorted by density, then (optionally) split."""
    if not with_split:
        return dfs_order(tree, tree.stats.density)[0], None
    result = split(tree, cost_model, keep_sharing=keep_sharing)
    return result.leaf_order, result


def requests_along(tree: PrefixTree, leaf_order: np.ndarray, with_duplicates: bool) -> np.ndarray:
    """Request indices along ``leaf_order``: each leaf's representative, then (optionally) its duplicates."""
    if not with_duplicates:
        return tree.leaf_request[leaf_order]
    leaf_position = np.empty(tree.n_leaves, dtype=np.int64)
    leaf_position[leaf_order] = np.arange(len(leaf_order))
    n = len(tree.request_leaf)
    is_rep = np.zeros(n, dtype=bool)
    is_rep[tree.leaf_request] = True
    return np.lexsort((np.arange(n), ~is_rep, leaf_position[tree.request_leaf]))


def scan_items(
    batch: RequestBatch, tree: PrefixTree, leaf_order: np.ndarray, groups: LeafGroups, with_duplicates: bool
) -> ScanItems:
    """Dual-scan items along ``leaf_order``: each leaf's representative, then (optionally) its duplicates.

    An engine that fans results out runs only representatives; one that
    takes every request (the policy registry) gets duplicates right after
    their twin, where the prefix cache serves their prompt.
    """
    leaf_position = np.empty(tree.n_leaves, dtype=np.int64)
    leaf_position[leaf_order] = np.arange(len(leaf_order))
    requests = requests_along(tree, leaf_order, with_duplicates)
    leaf = tree.request_leaf[requests]
    charge = (tree.prompt_len[leaf] + tree.output_est[leaf]).astype(np.float64)
    shared = np.zeros(len(leaf), dtype=np.float64)
    if len(leaf) > 1:  # a duplicate shares its twin's whole prompt (same leaf: LCP is the prompt)
        shared[1:] = tree.leaf_pair_lcp(leaf[:-1], leaf[1:])
    return ScanItems(
        requests=requests.astype(np.int64),
        group=groups.of_position[leaf_position[leaf]],
        group_density=groups.density,
        kv_charge=charge,
        target_density=float(tree.stats.density[0]),
        output_est=tree.output_est[leaf].astype(np.float64),
        shared_prompt=shared,
    )


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
    cut = cut_shards(stream, sides, _item_costs(tree, leaf_order, cost_model), cost_model, shards)
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


def _item_costs(tree: PrefixTree, leaf_order: np.ndarray, cost_model: CostModel) -> tuple[np.ndarray, ...]:
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


def fan_out(plan_rows: pa.Table, results: pa.Table) -> pa.Table:
    """Results for every planned request: each duplicate gets a copy of its twin's row, under its own id.

    ``results`` has one row per inference run (keyed by ``request_id``);
    rows of requests that were not run are built from their answering one.
    """
    ran = results.column("request_id").to_pylist()
    row_of = {rid: i for i, rid in enumerate(ran)}
    wanted = plan_rows.column("request_id").to_pylist()
    source = plan_rows.column("answered_by").to_pylist()
    missing = [s for s in source if s not in row_of]
    if missing:
        raise KeyError(f"{len(missing)} planned requests have no result for their answering request, e.g. {missing[0]!r}")
    out = results.take(pa.array([row_of[s] for s in source], pa.int64()))
    return out.set_column(out.schema.get_field_index("request_id"), "request_id", pa.array(wanted, pa.string()))
