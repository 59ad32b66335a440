"""The paper's sensitivity grid: speed-up of blendserve over dfs (and over fcfs) on 65 mixes of density x sharing.

    .venv/bin/python bench/bench_grid.py [--requests 40000] [--setup 8b] [--out]

Density 0.80 .. 1.40 in steps of 0.05 times sharing 0.05 .. 0.45 in steps of
0.10, each mix built from ../shared/data (pools loaded once, files written to
a temporary folder and dropped: at 40k requests the 65 files would take 8 GB),
planned with the warm-up estimates as bench_policies.py does. The table and
heatmap use the target density and sharing; the achieved ones (which drift at
small request counts) are in the JSON.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel
from blendserve.sim import SimConfig
from blendserve.sim.compare import compare_policies, true_outputs, warmup_estimates
from blendserve.workload import WorkloadSpec
from common import SETUPS, img_path, write_mix, write_result
from plots import heatmap

DENSITIES = [round(0.80 + 0.05 * i, 2) for i in range(13)]
SHARINGS = [round(0.05 + 0.10 * i, 2) for i in range(5)]


def cell(density: float, sharing: float, n: int, cost: CostModel, folder: Path) -> dict:
    """Build one mix, run dfs, fcfs and blendserve on it, and return the comparison."""
    path = folder / "cell.parquet"
    achieved = write_mix(WorkloadSpec(n, density, sharing, name=f"g{density}-{sharing}"), path, cost)
    batch = RequestBatch.from_parquet(path)
    estimates = warmup_estimates(batch, cost, true_outputs(batch))
    report = compare_policies(batch, cost, SimConfig(), ["dfs", "fcfs", "blendserve"], estimates=estimates)
    dfs, fcfs, blend = report["policies"]
    return {"density": density, "sharing": sharing, "achieved_density": achieved.density,
            "achieved_sharing": achieved.sharing, "dfs_s": dfs["time_s"], "blendserve_s": blend["time_s"],
            "speedup": dfs["time_s"] / blend["time_s"], "sharing_vs_dfs": blend["sharing_vs_dfs"],
            "fcfs_s": fcfs["time_s"], "vs_fcfs": fcfs["time_s"] / blend["time_s"], "chose": blend.get("chosen"),
            "dfs_opt": dfs["fraction_of_optimum"], "blendserve_opt": blend["fraction_of_optimum"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=40_000)
    ap.add_argument("--setup", choices=sorted(SETUPS), default="8b")
    ap.add_argument("--out", action="store_true", help="write bench/results/grid.json and the heatmap")
    args = ap.parse_args()
    setup = SETUPS[args.setup]
    cost = setup.cost()
    cells, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for density in DENSITIES:
            for sharing in SHARINGS:
                c = cell(density, sharing, args.requests, cost, Path(tmp))
                cells.append(c)
                print(f"density {density:.2f} sharing {sharing:.0%}: achieved {c['achieved_density']:.2f} / "
                      f"{c['achieved_sharing']:.0%}, speed-up {c['speedup']:.3f}x (over fcfs {c['vs_fcfs']:.3f}x, "
                      f"chose {c['chose']}), sharing {c['sharing_vs_dfs']:.1%} "
                      f"of dfs ({time.perf_counter() - started:.0f} s)", flush=True)
    speedups = np.array([c["speedup"] for c in cells]).reshape(len(DENSITIES), len(SHARINGS))
    print(f"speed-up over dfs: mean {speedups.mean():.3f}x, min {speedups.min():.3f}x, max {speedups.max():.3f}x")
    over_fcfs = np.array([c["vs_fcfs"] for c in cells])
    print(f"over fcfs: mean {over_fcfs.mean():.3f}x, min {over_fcfs.min():.3f}x, cells below fcfs {(over_fcfs < 1).sum()}")
    if args.out:
        title = f"blendserve over dfs, {len(cells)} mixes of {args.requests:,} requests ({setup.label})"
        png = heatmap(speedups, DENSITIES, SHARINGS, title, img_path(f"grid-{setup.key}.png"))
        write_result("grid", {"setup": setup.label, "requests": args.requests, "cells": cells, "png": png.name})


if __name__ == "__main__":
    main()
