"""Time the step simulator on a 100,000-request workload (median of a few runs).

    .venv/bin/python bench/bench_simulator.py [--requests 100000] [--mix d1.4-s35] [--runs 3]

Builds the workload from ../shared/data once (cached in .cache/bench/), then
simulates it with the fcfs policy on Llama-3.1-8B / A100-80G.
"""

from __future__ import annotations

import argparse
import statistics
import time

from blendserve.admission import StaticOrder
from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.model_prep import cache_root
from blendserve.sim import SimConfig, simulate
from blendserve.sim.compare import true_outputs
from blendserve.workload import MIXES, WorkloadSpec, build_workload
from blendserve.workload_sources import data_root


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--mix", default="d1.4-s35", choices=sorted(MIXES))
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    cost = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
    path = cache_root() / "bench" / f"{args.mix}-{args.requests}.parquet"
    if not path.exists():
        density, sharing = MIXES[args.mix]
        build_workload(WorkloadSpec(args.requests, density, sharing, name=args.mix), path, cost, data_root())
    batch = RequestBatch.from_parquet(path)
    outputs = true_outputs(batch)
    walls, result = [], None
    for _ in range(args.runs):
        started = time.perf_counter()
        result = simulate(batch, outputs, cost, StaticOrder(range(len(batch))), SimConfig())
        walls.append(time.perf_counter() - started)
    print(f"workload   {path} ({len(batch):,} requests, {result.input_tokens:,} in / {result.output_tokens:,} out)")
    print(f"simulated  {result.total_time:,.1f} s in {result.steps:,} engine steps, "
          f"{len(result.timeline.duration):,} timeline segments, {result.preemptions} preemptions")
    print(f"wall       median {statistics.median(walls):.1f} s over {args.runs} runs: "
          + ", ".join(f"{w:.1f}" for w in walls))


if __name__ == "__main__":
    main()
