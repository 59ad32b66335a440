"""Time and peak memory of the step simulator at several sizes (median of a few runs per size).

    .venv/bin/python bench/bench_simulator.py [--sizes 100000] [--workload synthetic|d1.4-s35|...] [--runs 3] [--out]

Each size runs in a fresh process (so peak memory is its own) and simulates
the workload in input order (fcfs) on Llama-3.1-8B / A100-80G. ``synthetic``
is the planner bench's generator (500-token prompts, families sharing a
prefix; cheap to make at 1M); a mix name builds that paper mix from
../shared/data once (cached in .cache/bench/; about 3 GB at 1M).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from blendserve.batch import RequestBatch
from blendserve.scheduling.admission import StaticOrder
from blendserve.sim import SimConfig, simulate
from blendserve.sim.compare import true_outputs
from blendserve.workload import MIXES
from common import SETUPS, in_fresh_process, load_mix, peak_rss_gb, write_result


def workload(name: str, n: int) -> RequestBatch:
    if name == "synthetic":
        from synthetic import synthetic_batch

        return synthetic_batch(n, mean_prompt=500)
    return load_mix(name, n, SETUPS["8b"])[0]


def one(name: str, n: int, runs: int) -> dict:
    """Simulate ``runs`` times in this process; the figures of one size."""
    batch = workload(name, n)
    outputs, cost = true_outputs(batch), SETUPS["8b"].cost()
    walls, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = simulate(batch, outputs, cost, StaticOrder(np.arange(len(batch))), SimConfig())
        walls.append(time.perf_counter() - started)
    return {"requests": n, "input_tokens": result.input_tokens, "output_tokens": result.output_tokens,
            "simulated_s": result.total_time, "steps": result.steps, "segments": len(result.timeline.duration),
            "preemptions": result.preemptions, "walls": walls, "wall_s": statistics.median(walls),
            "peak_gb": peak_rss_gb(), "batch_gb": (batch.tokens.nbytes + batch.token_offsets.nbytes) / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000])
    ap.add_argument("--workload", default="synthetic", choices=["synthetic", *sorted(MIXES)])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", action="store_true", help="write bench/results/simulator.json")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.workload, args.one, args.runs)))
        return
    print(f"{'requests':>10}{'tokens in':>14}{'out':>12}{'sim s':>10}{'steps':>10}{'segments':>10}"
          f"{'wall s':>8}{'peak GB':>9}{'batch GB':>10}")
    rows = []
    for n in args.sizes:
        r = in_fresh_process(__file__, ["--one", str(n), "--workload", args.workload, "--runs", str(args.runs)])
        rows.append(r)
        print(f"{n:>10,}{r['input_tokens']:>14,}{r['output_tokens']:>12,}{r['simulated_s']:>10,.0f}{r['steps']:>10,}"
              f"{r['segments']:>10,}{r['wall_s']:>8.1f}{r['peak_gb']:>9.2f}{r['batch_gb']:>10.2f}", flush=True)
    if args.out:
        write_result("simulator", {"workload": args.workload, "runs": args.runs, "rows": rows})


if __name__ == "__main__":
    main()
