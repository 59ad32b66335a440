"""What a plan is expected to cost: ``blendserve plan --explain``, and the report task's log for a run.

Every policy is simulated on the chosen hardware (``sim.compare``) with the
lengths the simulator treats as true; the plan itself gives the root density,
the prefix sharing kept against the depth-first order, and the shard balance.
For a run, those figures are of the order that ran (each shard's
admissions, loaded into ``plan.position``): nothing is planned again. A run
of more than ``EXPLAIN_ROWS`` requests simulates the policies on a seeded
uniform sample of that many (every policy is a whole simulation: at 200k
requests they took longer than the run), its times scaled by the whole job's
``T_opt`` over the sample's; the explanation says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from blendserve.batch import RequestBatch
from blendserve.config import RunConfig
from blendserve.costmodel import CostModel, batch_t_opt
from blendserve.pipeline import database
from blendserve.pipeline.plan import Plan, item_costs, load_inputs
from blendserve.planner.prefix_tree import PrefixTree, build_prefix_tree
from blendserve.scheduling.registry import PUBLIC_POLICIES
from blendserve.sim import SimConfig, step_overlap
from blendserve.sim.compare import compare_policies, true_outputs

EXPLAIN_ROWS = 20_000  # requests the policies are simulated on, at most (a seeded uniform sample above it)


@dataclass
class OrderFigures:
    """What an order does, before any simulation: the job's density, its prefix sharing, its shards' work."""

    root_density: float  # rho of the prefix-tree root
    sharing_tokens: int  # prompt tokens each inference shares with the one before it in its shard
    dfs_sharing_tokens: int  # the same for the depth-first order: the most any order gets
    shard_seconds: list[float]  # estimated seconds of each shard on one engine: max(Comp, Mem)

    @classmethod
    def of_plan(cls, plan: Plan) -> OrderFigures:
        return cls(float(plan.target_density), plan.sharing_tokens, plan.dfs_sharing_tokens,
                   [float(t) for t in plan.shards.time])

    @property
    def imbalance(self) -> float:
        mean = float(np.mean(self.shard_seconds)) if self.shard_seconds else 0.0
        return max(self.shard_seconds) / mean if mean > 0 else 1.0


def order_figures(tree: PrefixTree, cost: CostModel, shard_leaves: list[np.ndarray]) -> OrderFigures:
    """``OrderFigures`` of shards that ran ``shard_leaves`` (each shard's inferences as tree leaves, in the
    order admitted), with ``cut_shards``'s estimate of a shard's seconds."""
    seconds, sharing = [], 0
    for leaves in shard_leaves:
        fresh, shared, mem = item_costs(tree, leaves, cost)
        sharing += int(shared.sum())
        seconds.append(float(max(cost.comp_time(float(fresh.sum())), float(mem.sum()))))
    dfs = int(tree.prompt_len.sum() - tree.stats.unique_prompt_tokens[0])
    return OrderFigures(float(tree.stats.density[0]), sharing, dfs, seconds)


@dataclass
class PolicyPrediction:
    policy: str  # policy name (blendserve, dfs, fcfs, ...)
    seconds: float  # simulated time of the whole batch on one engine
    tokens_per_second: float  # (input + output tokens) / seconds
    fraction_of_optimum: float  # T_opt / seconds
    prefix_hit_ratio: float  # prompt tokens served from the prefix cache / prompt tokens
    chose: str | None = None  # the admission a choosing policy (blendserve) picked by prediction


@dataclass
class Explanation:
    requests: int  # accepted requests in the batch
    input_tokens: int  # prompt tokens
    output_tokens: int  # output tokens the simulator generates
    model: str  # cost-model model name
    hardware: str  # accelerator and tensor-parallel degree, e.g. "A100-80G x1"
    gpus_per_engine: int  # tensor-parallel degree: GPUs one engine holds
    shards: int  # data-parallel engines
    t_opt_s: float  # theoretical optimum (lower bound) for one engine
    root_density: float  # rho of the prefix-tree root: > 1 compute-heavy job, < 1 memory-heavy
    sharing_kept: float  # prefix sharing of the plan's order / that of the depth-first order
    shared_prompt_share: float  # prompt tokens the plan's order reuses from the previous group / all prompt tokens
    shard_seconds: list[float]  # the plan's estimated time per shard
    shard_imbalance: float  # largest shard / mean shard
    policies: list[PolicyPrediction] = field(default_factory=list)  # one row per simulated policy
    simulated_requests: int = 0  # requests the policies ran on: ``requests``, or a sample's size (times scaled)


def explain(batch: RequestBatch, order: OrderFigures, cost: CostModel, sim: SimConfig,
            policies: list[str] | None = None, estimates: np.ndarray | None = None, seed: int = 0) -> Explanation:
    """Simulate ``policies`` (default: the public ones) beside the figures of the order that runs."""
    report = compare_policies(batch, cost, sim, sorted(PUBLIC_POLICIES) if policies is None else policies, seed,
                              estimates=estimates)
    rows = [PolicyPrediction(r["policy"], r["time_s"], r["throughput"], r["fraction_of_optimum"],
                             r["prefix_hit_ratio"], r.get("chosen")) for r in report["policies"]]
    sharing = order.sharing_tokens / order.dfs_sharing_tokens if order.dfs_sharing_tokens else 1.0
    return Explanation(
        requests=report["requests"], input_tokens=report["input_tokens"], output_tokens=report["output_tokens"],
        model=report["model"], hardware=report["hardware"], gpus_per_engine=cost.hardware.tp,
        shards=len(order.shard_seconds), t_opt_s=report["t_opt_s"], root_density=order.root_density,
        sharing_kept=float(sharing),
        shared_prompt_share=order.sharing_tokens / report["input_tokens"] if report["input_tokens"] else 0.0,
        shard_seconds=list(order.shard_seconds),
        shard_imbalance=float(order.imbalance), policies=rows, simulated_requests=len(batch),
    )


def format_explanation(e: Explanation, chosen: str = "blendserve") -> str:
    """A table a person reads in a terminal or a task log."""
    kind = "compute-heavy" if e.root_density > 1 else "memory-heavy"
    gpus = e.gpus_per_engine * e.shards
    lines = [
        f"explain: {e.requests:,} requests, {e.input_tokens:,} tokens in, {e.output_tokens:,} out;"
        f" {e.model} on {e.hardware}, {e.shards} shard(s) = {gpus} GPU(s)",
        f"  root density     {e.root_density:.3f} ({kind}: compute time / memory time of the whole job)",
        f"  prefix sharing   {e.shared_prompt_share:.1%} of prompt tokens shared with a neighbour in plan order"
        f" ({e.sharing_kept:.1%} of what the depth-first order shares)",
        f"  shard balance    estimated seconds [{', '.join(_num(t) for t in e.shard_seconds)}],"
        f" largest / mean {e.shard_imbalance:.3f}",
        f"  optimum          {_num(e.t_opt_s)} s on one engine (T_opt, a lower bound)",
        *([f"  policies         simulated on a uniform sample of {e.simulated_requests:,} requests;"
           " times scaled by T_opt of the job over the sample's"] if e.simulated_requests < e.requests else []),
        f"  {'policy':<20}{'wall s':>10}{'GPU-hours':>11}{'tokens/s':>13}{'of optimum':>12}{'prefix hits':>12}",
    ]
    for row in e.policies:
        wall = _wall_seconds(row.seconds, e)
        mark = (f" (runs {row.chose})" if row.chose else "") + (" <- chosen" if row.policy == chosen else "")
        lines.append(f"  {row.policy:<20}{_num(wall):>10}{_num(gpu_hours(row.seconds, e)):>11}"
                     f"{_tokens_per_second(row.seconds, e):>13,.0f}{row.fraction_of_optimum:>12.1%}{row.prefix_hit_ratio:>12.1%}"
                     f"{mark}")
    lines.append("  wall s: one engine's simulated time spread over the shards at the plan's balance;"
                 " tokens/s: all shards together; GPU-hours: one engine's time x its GPUs (sharding splits the work)")
    return "\n".join(lines)


def _num(x: float) -> str:
    """Three significant digits: a CPU-sized job takes milliseconds of GPU time, a real one hours."""
    return f"{x:,.1f}" if abs(x) >= 100 else f"{x:.3g}"


def _wall_seconds(one_engine_s: float, e: Explanation) -> float:
    """K shards split the work; the slowest one (imbalance x mean) sets the wall time."""
    return one_engine_s / e.shards * max(e.shard_imbalance, 1.0)


def _tokens_per_second(one_engine_s: float, e: Explanation) -> float:
    """Input + output tokens over the wall time of all shards together (what a run's metrics report)."""
    wall = _wall_seconds(one_engine_s, e)
    return (e.input_tokens + e.output_tokens) / wall if wall else 0.0


def gpu_hours(one_engine_s: float, e: Explanation) -> float:
    return one_engine_s * e.gpus_per_engine / 3600.0


def prediction_metrics(e: Explanation, policy: str) -> dict[str, float]:
    """The chosen policy's prediction, under the names the run report reads back from ``metrics``."""
    row = next((r for r in e.policies if r.policy == policy), None)
    if row is None:
        return {}
    metrics = {
        "predicted_seconds": _wall_seconds(row.seconds, e),
        "predicted_gpu_hours": gpu_hours(row.seconds, e),
        "predicted_tokens_per_second": _tokens_per_second(row.seconds, e),
        "predicted_prefix_hit_rate": row.prefix_hit_ratio,
        "predicted_fraction_of_optimum": row.fraction_of_optimum,
        "predicted_root_density": e.root_density,
        "predicted_sharing_kept": e.sharing_kept,
        "predicted_shared_prompt_share": e.shared_prompt_share,
        "predicted_shard_imbalance": e.shard_imbalance,
        "predicted_simulated_requests": e.simulated_requests,
    }
    # every policy's time too, so the report can show the order of policies without re-simulating
    for r in e.policies:
        metrics[f"predicted_seconds_{r.policy}"] = _wall_seconds(r.seconds, e)
        metrics[f"predicted_tokens_per_second_{r.policy}"] = _tokens_per_second(r.seconds, e)
        metrics[f"predicted_prefix_hit_rate_{r.policy}"] = r.prefix_hit_ratio
    return metrics


def explain_run(config: RunConfig) -> Explanation:
    """A run's explanation: the order that ran, and every public policy simulated on the run's estimates.

    Call it after ``load_step``: the plan table then holds the order each
    shard admitted and the estimates its warm-up sample gave (before, only
    ``max_tokens`` or known lengths). ``config.db`` is read for both.
    """
    inputs = load_inputs(config)
    batch = inputs.batch
    estimates, positions = stored_plan(config, batch)
    tree = build_prefix_tree(batch, inputs.cost, estimates, inputs.keys)
    order = order_figures(tree, inputs.cost, _shard_leaves(tree, batch, positions, config.shards))
    sim = sim_config_for(config, inputs.kv_capacity)
    if len(batch) <= EXPLAIN_ROWS:
        return explain(batch, order, inputs.cost, sim, estimates=estimates)
    rows = np.sort(np.random.default_rng(0).choice(len(batch), EXPLAIN_ROWS, replace=False))
    sampled = explain(batch.take(rows), order, inputs.cost, sim, estimates=None if estimates is None else estimates[rows])
    return _scaled(sampled, batch, inputs.cost, sim)


def _shard_leaves(tree: PrefixTree, batch: RequestBatch, positions: dict[str, tuple[int, int]],
                  shards: int) -> list[np.ndarray]:
    """Each of the ``shards`` shards' inferences as tree leaves, in the order admitted."""
    rep = np.zeros(len(batch), dtype=bool)
    rep[tree.leaf_request] = True  # one request per inference: the one that ran
    by_shard: dict[int, list[tuple[int, int]]] = {k: [] for k in range(shards)}
    for b, request_id in enumerate(batch.request_ids.tolist()):
        if rep[b] and request_id in positions:
            shard, position = positions[request_id]
            by_shard.setdefault(shard, []).append((position, b))
    return [tree.request_leaf[np.array([b for _, b in sorted(rows)], dtype=np.int64)]
            for _, rows in sorted(by_shard.items())]


def _scaled(sampled: Explanation, batch: RequestBatch, cost: CostModel, sim: SimConfig) -> Explanation:
    """A sample's explanation for the whole ``batch``: its T_opt and tokens, each policy's time scaled alike."""
    outputs = true_outputs(batch)
    t_opt = batch_t_opt(cost, batch, outputs, step_overlap(cost, sim), sim.kv_capacity_tokens).time
    scale = t_opt / sampled.t_opt_s if sampled.t_opt_s else 1.0
    prompt = int(batch.prompt_lens.sum())
    tokens = prompt + int(outputs.sum())
    policies = [replace(p, seconds=p.seconds * scale, tokens_per_second=tokens / (p.seconds * scale) if p.seconds else 0.0)
                for p in sampled.policies]
    return replace(sampled, requests=len(batch), input_tokens=prompt, output_tokens=int(outputs.sum()), t_opt_s=t_opt,
                   policies=policies, shared_prompt_share=sampled.shared_prompt_share * sampled.input_tokens / prompt)


def explain_plan(config: RunConfig) -> str:
    """``explain_run`` as a table, with the run's policy's prediction stored in ``metrics`` (``predicted_*``)."""
    explanation = explain_run(config)
    with database.connect(config.db) as con:
        database.put_metrics(con, config.run_id, prediction_metrics(explanation, config.policy))
    return format_explanation(explanation, config.policy)


def sim_config_for(config: RunConfig, kv_capacity: int) -> SimConfig:
    """The simulator settings of a simulator run; for a real engine, its KV capacity in tokens (a calibrated
    profile brings the engine's tokens per step itself: ``HardwareSpec.token_budget``)."""
    settings = config.extra.get("simulator", {}) if config.engine == "simulator" else {}
    known = {k: v for k, v in settings.items() if k in SimConfig.__dataclass_fields__}
    known.setdefault("kv_capacity_tokens", int(kv_capacity))
    known.setdefault("max_running", config.max_num_seqs)
    return SimConfig(**known)


def stored_plan(config: RunConfig, batch: RequestBatch) -> tuple[np.ndarray | None, dict[str, tuple[int, int]]]:
    """The plan table's per-request estimates (the warm-up's once loaded) in batch order, None without a
    plan; and the (shard, position) of every request with a position (the order that ran, once loaded)."""
    with database.connect(config.db, read_only=True) as con:
        rows = con.execute("SELECT request_id, est_output_tokens, shard, position FROM plan WHERE run_id = ?",
                           [config.run_id]).fetchall()
    estimate = {r[0]: r[1] for r in rows}
    positions = {r[0]: (r[2], r[3]) for r in rows if r[3] is not None}
    ids = batch.request_ids.astype(object)
    if not estimate or not all(i in estimate for i in ids):
        return None, positions
    return np.array([estimate[i] for i in ids], dtype=np.int64), positions
