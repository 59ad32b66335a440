"""Compute and memory utilization over time for dfs and blendserve on one mix (the paper's Figure 10).

    .venv/bin/python bench/bench_timeline.py [--mix d1.4-s35] [--requests 40000] [--setup 8b] [--bins 200]
        [--lengths hidden|known] [--out]

Same ``--lengths`` modes and engine settings as bench_policies.py (hidden, the
default: each policy run as a shard runs it, its warm-up sample first). The simulator's
timeline has one segment per engine step (or run of identical decode steps)
with its compute-bound and memory-bound seconds; utilization in a time bin is
the busy seconds of each resource falling in it over the bin's width.
"""

from __future__ import annotations

import argparse

import numpy as np

from as_shard import shard_warmup, simulate_as_shard
from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel
from blendserve.scheduling.registry import PolicyContext, make_controller
from blendserve.sim import SimConfig, SimResult, simulate
from blendserve.sim.compare import true_outputs, warmup_estimates
from blendserve.sim.simulator import kv_capacity_tokens
from blendserve.sim.timeline import Timeline
from blendserve.workload import MIXES
from common import LENGTHS, SETUPS, hide_lengths, img_path, lengths_suffix, load_mix, size_suffix, write_result
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


def run(
    batch: RequestBatch, cost: CostModel, config: SimConfig, lengths: str,
) -> tuple[dict[str, SimResult], int | None]:
    """Each policy's simulated run in ``lengths`` mode (bench_policies.py's two modes), and hidden mode's
    uniform max_tokens (None: known)."""
    if lengths == "hidden":
        batch, cap = hide_lengths(batch)
        print(f"lengths hidden: max_tokens {cap:,} for every request, each policy run as a shard")
        outputs, warmup = true_outputs(batch), shard_warmup(batch, cost)
        return {name: simulate_as_shard(batch, outputs, cost, config, name, warmup)[0] for name in POLICIES}, cap
    outputs = true_outputs(batch)
    context = PolicyContext(batch, warmup_estimates(batch, cost, outputs), cost, kv_capacity_tokens(cost, config))
    return {name: simulate(batch, outputs, cost, make_controller(name, context), config) for name in POLICIES}, None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mix", default="d1.4-s35", choices=sorted(MIXES))
    ap.add_argument("--requests", type=int, default=40_000)
    ap.add_argument("--setup", choices=sorted(SETUPS), default="8b")
    ap.add_argument("--bins", type=int, default=200)
    ap.add_argument("--lengths", choices=LENGTHS, default="hidden",
                    help="hidden: one round max_tokens, run as a shard (default); known: plan on true lengths")
    ap.add_argument("--out", action="store_true",
                    help="write bench/results/timeline[-known].json (timeline[-known]-400k.json at 400k) and the PNG")
    args = ap.parse_args()
    setup, config = SETUPS[args.setup], SimConfig()
    cost, (batch, _) = setup.cost(), load_mix(args.mix, args.requests, setup)
    series, rows = {}, []
    results, cap = run(batch, cost, config, args.lengths)
    for name, result in results.items():
        series[name] = binned(result.timeline, args.bins)
        rows.append({"policy": name, "time_s": result.total_time, "mean_compute_util": result.comp_time / result.total_time,
                     "mean_memory_util": result.mem_time / result.total_time, "segments": len(result.timeline.duration)})
        print(f"{name:<12} {result.total_time:>9,.1f} s  compute {rows[-1]['mean_compute_util']:.1%}  "
              f"memory {rows[-1]['mean_memory_util']:.1%}")
    if args.out:
        title = (f"Utilization over time, {args.mix}, {args.requests:,} requests ({setup.label}, "
                 f"lengths {args.lengths})")
        size, lengths = size_suffix(args.requests), lengths_suffix(args.lengths)
        png = utilization_timeline(series, title, img_path(f"timeline-{setup.key}-{args.mix}{lengths}{size}.png"))
        write_result(f"timeline{lengths}{size}", {"setup": setup.label, "mix": args.mix, "requests": args.requests,
                                                  "lengths": args.lengths, "max_tokens": cap, "rows": rows,
                                                  "png": png.name})


if __name__ == "__main__":
    main()
