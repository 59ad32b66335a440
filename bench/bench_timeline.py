"""Compute and memory utilization over time for dfs and blendserve on one mix (the paper's Figure 10).

    .venv/bin/python bench/bench_timeline.py [--mix d1.4-s35] [--requests 40000] [--setup 8b] [--bins 200] [--out]

Same estimates and engine settings as bench_policies.py. The simulator's
timeline has one segment per engine step (or run of identical decode steps)
with its compute-bound and memory-bound seconds; utilization in a time bin is
the busy seconds of each resource falling in it over the bin's width.
"""

from __future__ import annotations

import argparse

import numpy as np

from blendserve.scheduling.registry import PolicyContext, make_controller
from blendserve.sim import SimConfig, simulate
from blendserve.sim.compare import true_outputs, warmup_estimates
from blendserve.sim.simulator import kv_capacity_tokens
from blendserve.sim.timeline import Timeline
from blendserve.workload import MIXES
from common import SETUPS, img_path, load_mix, size_suffix, write_result
from plots import utilization_timeline

POLICIES = ["dfs", "blendserve"]


def binned(timeline: Timeline, bins: int) -> dict[str, np.ndarray]:
    """Bin centres and the compute / memory utilization of each bin (cumulative busy time, interpolated)."""
    a = timeline.arrays()
    ends = np.concatenate([[0.0], a["start"] + a["duration"]])
    edges = np.linspace(0.0, ends[-1], bins + 1)
    width = np.diff(edges)
    out = {"t": (edges[:-1] + edges[1:]) / 2}
    for key in ("comp", "mem"):
        busy = np.interp(edges, ends, np.concatenate([[0.0], np.cumsum(a[key])]))
        out[key] = np.diff(busy) / width
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mix", default="d1.4-s35", choices=sorted(MIXES))
    ap.add_argument("--requests", type=int, default=40_000)
    ap.add_argument("--setup", choices=sorted(SETUPS), default="8b")
    ap.add_argument("--bins", type=int, default=200)
    ap.add_argument("--out", action="store_true",
                    help="write bench/results/timeline.json (timeline-400k.json at 400k requests) and the PNG")
    args = ap.parse_args()
    setup, config = SETUPS[args.setup], SimConfig()
    cost, (batch, _) = setup.cost(), load_mix(args.mix, args.requests, setup)
    outputs = true_outputs(batch)
    context = PolicyContext(batch, warmup_estimates(batch, cost, outputs), cost, kv_capacity_tokens(cost, config))
    series, rows = {}, []
    for name in POLICIES:
        result = simulate(batch, outputs, cost, make_controller(name, context), config)
        series[name] = binned(result.timeline, args.bins)
        rows.append({"policy": name, "time_s": result.total_time, "mean_compute_util": result.comp_time / result.total_time,
                     "mean_memory_util": result.mem_time / result.total_time, "segments": len(result.timeline.duration)})
        print(f"{name:<12} {result.total_time:>9,.1f} s  compute {rows[-1]['mean_compute_util']:.1%}  "
              f"memory {rows[-1]['mean_memory_util']:.1%}")
    if args.out:
        title = f"Utilization over time, {args.mix}, {args.requests:,} requests ({setup.label})"
        size = size_suffix(args.requests)
        png = utilization_timeline(series, title, img_path(f"timeline-{setup.key}-{args.mix}{size}.png"))
        write_result(f"timeline{size}", {"setup": setup.label, "mix": args.mix, "requests": args.requests, "rows": rows,
                                  "png": png.name})


if __name__ == "__main__":
    main()
