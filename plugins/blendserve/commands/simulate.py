"""``blendserve simulate``: compare scheduling policies on a request file with the step simulator."""

from __future__ import annotations

import argparse
import json

from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.sim import SimConfig
from blendserve.sim.compare import compare_policies


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("simulate", help="simulate policies on a request file at GPU scale")
    p.add_argument("--input", required=True, help="request Parquet (REQUEST_SCHEMA), e.g. from `blendserve workload`")
    p.add_argument("--model", default="llama-3.1-8b", help="catalog name, config.json folder or .gguf path")
    p.add_argument("--hardware", default="a100-80g")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    p.add_argument("--policy", default="fcfs,dfs,balance", help="comma-separated policy names")
    p.add_argument("--token-budget", type=int, default=None, help="tokens per engine step (default: resource-aware)")
    p.add_argument("--max-running", type=int, default=256, help="sequences running at once")
    p.add_argument("--overlap", choices=["max", "sum"], default=None,
                   help="step time f(compute, memory); default: the hardware's own (max for the catalog GPUs)")
    p.add_argument("--seed", type=int, default=0, help="seed of random policies (balance)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    batch = RequestBatch.from_parquet(args.input)
    cost = CostModel(get_model(args.model), get_hardware(args.hardware, args.tp))
    config = SimConfig(token_budget=args.token_budget, max_running=args.max_running, overlap=args.overlap)
    policies = [name.strip() for name in args.policy.split(",") if name.strip()]
    report = compare_policies(batch, cost, config, policies, seed=args.seed)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


def format_table(report: dict) -> str:
    lines = [
        f"{report['requests']:,} requests, {report['input_tokens']:,} in / {report['output_tokens']:,} out tokens; "
        f"{report['model']} on {report['hardware']}; KV {report['kv_capacity_tokens']:,} tokens; "
        f"T_opt {report['t_opt_s']:.1f} s (C* {report['c_star_s']:.1f} s, M* {report['m_star_s']:.1f} s)",
        f"{'policy':<20}{'time s':>10}{'tok/s':>12}{'of opt':>9}{'prefix hit':>12}{'vs dfs':>9}{'preempt':>9}",
    ]
    for row in report["policies"]:
        vs = "n/a" if row["sharing_vs_dfs"] is None else f"{100 * row['sharing_vs_dfs']:.1f}%"
        lines.append(
            f"{row['policy']:<20}{row['time_s']:>10.1f}{row['throughput']:>12,.0f}{100 * row['fraction_of_optimum']:>8.1f}%"
            f"{100 * row['prefix_hit_ratio']:>11.1f}%{vs:>9}{row['preemptions']:>9}"
        )
    return "\n".join(lines)
