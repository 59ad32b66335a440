"""``blendserve workload``: write a paper-style request file from the data in ``../shared/data``."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.workload import MIXES, RARE_MIXES, WorkloadSpec, build_workload, mix_spec
from blendserve.workload_sources import data_root


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("workload", help="build a workload file (API trace, MMLU, video) as Parquet")
    p.add_argument("--output", required=True, help="Parquet file to write (REQUEST_SCHEMA)")
    p.add_argument("--mix", default=None, choices=[*MIXES, *RARE_MIXES],
                   help="a paper mix (d1.4-s35, d1.4-s5, d0.9-s35, d0.9-s5) or a rare-heavy one (rare-0.3, "
                   "rare-1, shared-sys: a few outputs over 8k tokens among short answers)")
    p.add_argument("--density", type=float, default=None, help="target density (instead of --mix)")
    p.add_argument("--sharing", type=float, default=None, help="target sharing ratio (instead of --mix)")
    p.add_argument("--only", choices=["api", "mmlu", "video"], default=None, help="one source, no mixing")
    p.add_argument("--num-requests", type=int, default=40_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api-trace", default="azure-code", choices=["azure-code", "azure-conv"])
    p.add_argument("--system-prompt-tokens", type=int, default=64, help="the API trace's shared system prompt")
    p.add_argument("--video-mean-tokens", type=float, default=16_000)
    p.add_argument("--model", default="llama-3.1-8b", help="model the density is computed for")
    p.add_argument("--hardware", default="a100-80g")
    p.add_argument("--data", default=None, help="data folder (default: ../shared/data or $BLENDSERVE_DATA)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    base = (mix_spec(args.mix, args.num_requests, args.seed) if args.mix else
            WorkloadSpec(args.num_requests, args.density, args.sharing, seed=args.seed, name=args.only or "mix"))
    spec = replace(base, only=args.only, api_trace=args.api_trace, system_prompt_tokens=args.system_prompt_tokens,
                   video_mean_tokens=args.video_mean_tokens)
    cost = CostModel(get_model(args.model), get_hardware(args.hardware))
    report = build_workload(spec, Path(args.output), cost, Path(args.data) if args.data else data_root())
    print(report.to_json())
    print(f"wrote {args.output}: {spec.num_requests} requests; {report.tokenizer}")
    return 0
