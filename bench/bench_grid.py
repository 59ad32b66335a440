"""The paper's sensitivity grid: speed-up of blendserve over dfs (and over fcfs) on 65 mixes of density x sharing.

    .venv/bin/python bench/bench_grid.py [--requests 40000] [--setup 8b] [--lengths hidden|known] [--jobs 2] [--out]

Density 0.80 .. 1.40 in steps of 0.05 times sharing 0.05 .. 0.45 in steps of
0.10, each mix built from ../shared/data (pools loaded once, files written to
a temporary folder and dropped: at 40k requests the 65 files would take 8 GB),
planned as bench_policies.py plans in the same ``--lengths`` mode (hidden, the
default: one round max_tokens, run as a shard with its warm-up; known: the
upper bound). The table and heatmap use the target density and sharing; the
achieved ones (which drift at small request counts) are in the JSON.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from as_shard import run_policies
from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel
from blendserve.sim import SimConfig
from blendserve.workload import WorkloadSpec
from common import LENGTHS, SETUPS, img_path, lengths_suffix, write_mix, write_result
from plots import heatmap

DENSITIES = [round(0.80 + 0.05 * i, 2) for i in range(13)]
SHARINGS = [round(0.05 + 0.10 * i, 2) for i in range(5)]


def cell(density: float, sharing: float, n: int, cost: CostModel, folder: Path, lengths: str) -> dict:
    """Build one mix, run dfs, fcfs, balance and blendserve on it in ``lengths`` mode; return the comparison."""
    path = folder / "cell.parquet"
    achieved = write_mix(WorkloadSpec(n, density, sharing, name=f"g{density}-{sharing}"), path, cost)
    batch = RequestBatch.from_parquet(path)
    report, cap = run_policies(batch, cost, SimConfig(), ["dfs", "fcfs", "balance", "blendserve"], lengths)
    dfs, fcfs, balance, blend = report["policies"]
    return {"density": density, "sharing": sharing, "achieved_density": achieved.density,
            "achieved_sharing": achieved.sharing, "dfs_s": dfs["time_s"], "blendserve_s": blend["time_s"],
            "speedup": dfs["time_s"] / blend["time_s"], "sharing_vs_dfs": blend["sharing_vs_dfs"],
            "fcfs_s": fcfs["time_s"], "vs_fcfs": fcfs["time_s"] / blend["time_s"],
            "balance_s": balance["time_s"], "vs_balance": balance["time_s"] / blend["time_s"],
            "chose": blend.get("chosen"),
            "before_plan": (blend.get("sampled", 0) + blend.get("unplanned", 0)) / n,  # share started before it
            "dfs_opt": dfs["fraction_of_optimum"], "blendserve_opt": blend["fraction_of_optimum"], "max_tokens": cap}


def _cell_in_tmp(args: tuple[float, float, int, str, str]) -> dict:
    """``cell`` in a folder of its own, for a worker process."""
    density, sharing, n, setup_key, lengths = args
    with tempfile.TemporaryDirectory() as tmp:
        return cell(density, sharing, n, SETUPS[setup_key].cost(), Path(tmp), lengths)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=40_000)
    ap.add_argument("--setup", choices=sorted(SETUPS), default="8b")
    ap.add_argument("--lengths", choices=LENGTHS, default="hidden",
                    help="hidden: one round max_tokens, run as a shard (default); known: plan on true lengths")
    ap.add_argument("--jobs", type=int, default=1, help="cells simulated at once, one process each")
    ap.add_argument("--out", action="store_true", help="write bench/results/grid[-known].json and the heatmap")
    args = ap.parse_args()
    setup = SETUPS[args.setup]
    cells, started = [], time.perf_counter()
    grid = [(density, sharing, args.requests, args.setup, args.lengths) for density in DENSITIES for sharing in SHARINGS]
    # Cells are independent and the simulator is deterministic: --jobs changes the wall time only.
    with ProcessPoolExecutor(args.jobs) as pool:
        for c in pool.map(_cell_in_tmp, grid):
            cells.append(c)
            print(f"density {c['density']:.2f} sharing {c['sharing']:.0%}: achieved {c['achieved_density']:.2f} / "
                  f"{c['achieved_sharing']:.0%}, speed-up {c['speedup']:.3f}x (over fcfs {c['vs_fcfs']:.3f}x, "
                  f"over balance {c['vs_balance']:.3f}x, chose {c['chose']}), "
                  f"sharing {c['sharing_vs_dfs']:.1%} of dfs, {c['before_plan']:.0%} before the plan, "
                  f"max_tokens {c['max_tokens'] or 'per request (known)'} "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    speedups = np.array([c["speedup"] for c in cells]).reshape(len(DENSITIES), len(SHARINGS))
    print(f"speed-up over dfs: mean {speedups.mean():.3f}x, min {speedups.min():.3f}x, max {speedups.max():.3f}x")
    over_fcfs = np.array([c["vs_fcfs"] for c in cells])
    print(f"over fcfs: mean {over_fcfs.mean():.3f}x, min {over_fcfs.min():.3f}x, cells below fcfs {(over_fcfs < 1).sum()}")
    over_balance = np.array([c["vs_balance"] for c in cells])
    print(f"over balance: mean {over_balance.mean():.3f}x, min {over_balance.min():.3f}x, "
          f"cells below balance {(over_balance < 1).sum()}")
    if args.out:
        suffix = lengths_suffix(args.lengths)
        title = (f"blendserve over dfs, {len(cells)} mixes of {args.requests:,} requests ({setup.label}, "
                 f"lengths {args.lengths})")
        png = heatmap(speedups, DENSITIES, SHARINGS, title, img_path(f"grid-{setup.key}{suffix}.png"))
        write_result(f"grid{suffix}", {"setup": setup.label, "requests": args.requests, "lengths": args.lengths,
                                       "cells": cells, "png": png.name})


if __name__ == "__main__":
    main()
