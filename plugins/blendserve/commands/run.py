"""``blendserve run``: the whole job in one process (ingest, plan, infer, load), then a summary."""

from __future__ import annotations

import argparse
import json
import time

from blendserve.commands.engine_options import add_engine_arguments, engine_settings
from blendserve.config import RunConfig, new_run_id
from blendserve.pipeline.steps import run_pipeline
from blendserve.scheduling.registry import PUBLIC_POLICIES


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run a dataset end to end into DuckDB")
    p.add_argument("--input", required=True, help="input file or glob (JSONL, OpenAI batch JSONL, CSV, Parquet)")
    add_engine_arguments(p)
    p.add_argument("--db", required=True, help="DuckDB file the outputs land in")
    p.add_argument("--work-dir", default="",
                   help="run folder (requests, plan, part files): a path or s3://, gs:// URL (fsspec credentials "
                        "from the environment); default <db folder>/runs/RUN_ID")
    p.add_argument("--run-id", default=None,
                   help="re-use an id to resume a run (default: a new id, the time plus a random suffix); "
                        "letters, digits, . _ - only")
    p.add_argument("--policy", default="blendserve",
                   choices=PUBLIC_POLICIES,
                   help="scheduling policy; the baselines are there to A/B against")
    p.add_argument("--sample-rate", type=float, default=0.01, help="share of each shard run first to learn output lengths (0 = none)")
    p.add_argument("--hardware", default="auto",
                   help="profile the plan is costed on: auto (this machine's, from `blendserve calibrate` with the"
                        " same engine settings; else a100-80g), or a catalog GPU (a100-80g, h100-sxm, h200, l40s)")
    p.add_argument("--shards", type=int, default=1, help="data-parallel shards, run one after another here")
    p.add_argument("--max-tokens", type=int, default=256, help="default max_tokens for requests that give none")
    p.add_argument("--part-rows", type=int, default=None,
                   help="results per committed part file: what a crash can lose, and how often progress is "
                        "saved (default: RunConfig's, 64)")
    p.add_argument("--no-explain", action="store_true", help="skip simulating every policy at plan time")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    started = time.monotonic()
    result = run_pipeline(config, overlap=True)
    result["job_seconds"] = time.monotonic() - started
    print(json.dumps(result, indent=2, default=str) if args.json else format_summary(result))
    return 0


def config_from_args(args: argparse.Namespace) -> RunConfig:
    defaults_unless_given = {"part_rows": args.part_rows}
    return RunConfig(
        run_id=args.run_id or new_run_id(),
        input=args.input, db=args.db, work_dir=args.work_dir, policy=args.policy, shards=args.shards,
        sample_rate=args.sample_rate, hardware=args.hardware, explain=not args.no_explain,
        default_max_tokens=args.max_tokens, **engine_settings(args),
        **{name: value for name, value in defaults_unless_given.items() if value is not None},
    )


def format_summary(s: dict) -> str:
    lines = [
        f"run {s['run_id']}: {s['requests']} requests answered ({s['errors']} errors), {s['rejected']} rejected at ingest",
        f"  tokens           {s['input_tokens']:,} in, {s['output_tokens']:,} out",
        f"  deduplicated     {int(s.get('dedupe_saved', 0))} identical requests answered by a twin's inference",
        f"  inference wall   {s.get('wall_seconds', 0):.1f} s (whole job {s['job_seconds']:.1f} s incl. engine start)",
        f"  throughput       {s.get('tokens_per_second', 0):,.0f} tokens/s (input + output)",
        f"  prefix cache     {100 * s.get('prefix_hit_rate', 0):.1f}% of prompt tokens served from cache",
        *([f"  replay           {s['replay_seconds']:.1f} s predicted for what ran on {s['hardware']}"
           f" ({100 * s['replay_error']:+.1f}% vs the {s['replay_measured_seconds']:.1f} s measured)"]
          if "replay_seconds" in s else [f"  costed on        {s.get('hardware', '-')}"]),
        f"  outputs          {s['db']}  (table outputs, run_id = '{s['run_id']}')",
        f"  report           {s['report']}",
    ]
    if s.get("stages"):
        lines.append("  stages           " + ", ".join(f"{name} {a:.0f}-{b:.0f} s" for name, (a, b) in s["stages"].items()))
    for request_id, text in s["samples"]:
        lines.append(f"  sample {request_id}: {text.strip()[:300]!r}")
    return "\n".join(lines)
