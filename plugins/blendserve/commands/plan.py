"""``blendserve plan``: build the BlendServe plan of a request file, write it as Parquet, compare policies."""

from __future__ import annotations

import argparse

from blendserve.batch import RequestBatch
from blendserve.config import check_run_id
from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.pipeline import database
from blendserve.pipeline.plan import build_plan, write_plan
from blendserve.planner.estimates import default_output_estimates
from blendserve.progress import phase
from blendserve.report.explain import OrderFigures, explain, format_explanation, prediction_metrics
from blendserve.scheduling.registry import PUBLIC_POLICIES
from blendserve.sim import SimConfig
from blendserve.sim.compare import compare_policies


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="plan a request file (tree, split, dual scan, shards) into Parquet")
    p.add_argument("--input", required=True, help="normalized request Parquet (REQUEST_SCHEMA columns)")
    p.add_argument("--out", required=True, help="directory for plan.parquet")
    p.add_argument("--shards", type=int, default=1, help="data-parallel shards K")
    p.add_argument("--model", default="llama-3.1-8b", help="model in the cost model's catalog")
    p.add_argument("--hardware", default="a100-80g", help="accelerator in the cost model's catalog")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree of each shard's engine")
    p.add_argument("--keep-sharing", type=float, default=0.99, help="split budget: share of DFS prefix sharing kept")
    p.add_argument("--no-split", action="store_true", help="skip conditional node splitting")
    p.add_argument("--no-simulate", action="store_true", help="write the plan without comparing policies")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--explain", action="store_true",
                   help="print each policy's predicted time, GPU-hours and throughput, the expected prefix"
                        " sharing, the root density and the shard balance")
    p.add_argument("--db", default=None, help="with --explain and --run-id: store the prediction in this DuckDB")
    p.add_argument("--run-id", default=None, help="run the stored prediction belongs to (metrics predicted_*)")
    p.add_argument("--policy", default="blendserve", help="with --explain: the policy the prediction is stored for")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.run_id is not None:
        check_run_id(args.run_id)
    with phase(f"plan: reading {args.input}"):
        batch = RequestBatch.from_parquet(args.input)
    cost_model = CostModel(get_model(args.model), get_hardware(args.hardware, tp=args.tp))
    estimates = default_output_estimates(batch)
    with phase(f"plan: tree, split, dual scan and {args.shards} shard(s) over {len(batch):,} requests"):
        plan = build_plan(
            batch, cost_model, estimates, shards=args.shards,
            keep_sharing=args.keep_sharing, with_split=not args.no_split,
        )
    path = write_plan(plan, batch, cost_model, args.out)
    print(_summary(plan, path))
    if args.explain:
        print(_explain(args, batch, plan, cost_model, estimates))
    elif not args.no_simulate:
        # The simulator runs the file's true lengths (sim_output_tokens, else known, else max_tokens).
        print(_policy_table(batch, cost_model, SimConfig(), args.seed))
    return 0


def _explain(args: argparse.Namespace, batch, plan, cost_model, estimates) -> str:  # type: ignore[no-untyped-def]
    with phase("plan: simulating every policy"):
        explanation = explain(batch, OrderFigures.of_plan(plan), cost_model, SimConfig(), estimates=estimates, seed=args.seed)
    if args.db and args.run_id:
        with database.connect(args.db) as con:
            database.put_metrics(con, args.run_id, prediction_metrics(explanation, args.policy))
    return format_explanation(explanation, args.policy)


def _summary(plan, path) -> str:  # type: ignore[no-untyped-def]
    tree, shards = plan.tree, plan.shards
    stages = ", ".join(f"{k} {v:.2f} s" for k, v in plan.timings.items())
    sharing = plan.sharing_tokens / plan.dfs_sharing_tokens if plan.dfs_sharing_tokens else 1.0
    moved = len(plan.split.moved) if plan.split is not None else 0
    return "\n".join(
        [
            f"plan {path}: {len(tree.request_leaf)} requests, {tree.n_leaves} inferences, {len(plan.groups)} leaf groups",
            f"  stages           {stages}",
            f"  target density   {plan.target_density:.3f}",
            f"  split            {moved} subtrees moved, prefix sharing kept {100 * sharing:.2f}% of DFS",
            f"  shards           {len(shards.time)}, estimated seconds {[round(float(t), 1) for t in shards.time]},"
            f" imbalance {shards.imbalance:.3f}",
        ]
    )


def _policy_table(batch, cost_model, config, seed) -> str:  # type: ignore[no-untyped-def]
    report = compare_policies(batch, cost_model, config, sorted(PUBLIC_POLICIES), seed)
    lines = [f"  {'policy':<20}{'predicted s':>12}{'tokens/s':>12}{'of optimum':>12}{'prefix hits':>12}"]
    for row in report["policies"]:
        lines.append(
            f"  {row['policy']:<20}{row['time_s']:>12.1f}{row['throughput']:>12,.0f}"
            f"{row['fraction_of_optimum']:>12.1%}{row['prefix_hit_ratio']:>12.1%}"
        )
    return "\n".join(lines)
