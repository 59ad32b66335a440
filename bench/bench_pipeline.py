"""The whole run at scale: `blendserve run --engine simulator` on 100k, 300k and 1M requests of a paper mix.

    .venv/bin/python bench/bench_pipeline.py [--sizes 100000 300000 1000000] [--mix d1.4-s35] [--out]

Each size runs in a fresh process (its peak memory is its own) on the file
`blendserve workload --mix <mix> --num-requests N` writes (cached under
.cache/bench/). The steps are ``run_pipeline``'s, timed one by one: wall
seconds and the peak resident memory inside each step, side by side, with the
accepted prompt tokens as int32 bytes for scale. The machine is shared: the
load average at the start and end of each size is recorded beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import SETUPS, cache_root, in_fresh_process, write_mix, write_result

TARGETS = {200_000: (240.0, 4.0), 1_000_000: (1200.0, 12.0)}  # requests: (run seconds, peak GB), from issue 19


class PeakSampler:
    """Resident memory of this process, sampled every 0.1 s: the peak since the last ``lap``."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.wait(0.1):
            with open("/proc/self/statm") as f:
                self.peak = max(self.peak, int(f.read().split()[1]) * page)

    def lap(self) -> float:
        """Peak GB since the previous lap."""
        peak, self.peak = self.peak, 0
        return peak / 1e9


def workload(mix: str, n: int) -> Path:
    """The `blendserve workload` file of ``n`` requests (density solved on its default Llama-3.1-8B / A100)."""
    from blendserve.workload import MIXES, WorkloadSpec

    path = cache_root() / "bench" / f"pipeline-{mix}-{n}.parquet"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        density, sharing = MIXES[mix]
        write_mix(WorkloadSpec(n, density, sharing, name=mix), path, SETUPS["8b"].cost())
    return path


def one(mix: str, n: int) -> dict:
    from blendserve.pipeline import steps
    from blendserve.config import RunConfig

    path = workload(mix, n)
    timed = [("ingest", steps.ingest_step), ("validate input", steps.validate_input_step),
             ("plan", steps.plan_step), ("infer", lambda c: steps.infer_shard(c, 0)),
             ("load", steps.load_step), ("explain", steps.explain_step),
             ("validate outputs", steps.validate_outputs_step), ("report", steps.report_step)]
    load_before = os.getloadavg()[0]
    sampler, figures = PeakSampler(), {}
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as folder:
        config = RunConfig(run_id=f"bench-{n}", input=str(path), db=f"{folder}/out.duckdb", engine="simulator")
        sampler.lap()
        for name, step in timed:  # run_pipeline's steps, in its order
            started = time.perf_counter()
            step(config)
            figures[name] = {"wall_s": time.perf_counter() - started, "peak_gb": sampler.lap()}
        summary = steps.summary(config)
    metrics = {k: summary[k] for k in ("rejected", "input_tokens", "output_tokens")}
    return {"requests": n, "answered": summary["requests"], **metrics, "token_gb": summary["input_tokens"] * 4 / 1e9,
            "steps": figures,
            "wall_s": sum(f["wall_s"] for f in figures.values()),
            "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,  # Linux: KiB
            "load_avg": [load_before, os.getloadavg()[0]]}


def show(row: dict) -> str:
    steps = "  ".join(f"{name} {f['wall_s']:.0f} s / {f['peak_gb']:.1f} GB" for name, f in row["steps"].items())
    return (f"{row['requests']:>9,} requests ({row['token_gb']:.2f} GB of accepted token ids): "
            f"{row['wall_s']:.0f} s, peak {row['peak_gb']:.2f} GB, load {row['load_avg'][0]:.1f}->{row['load_avg'][1]:.1f}"
            f"\n    {steps}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000, 1_000_000])
    parser.add_argument("--mix", default="d1.4-s35")
    parser.add_argument("--out", action="store_true", help="write bench/results/steps.json")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a size, in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.mix, args.one)))
        return
    rows = []
    for n in args.sizes:
        workload(args.mix, n)  # here: the source pools it loads would count in the run's memory
        rows.append(in_fresh_process(__file__, ["--mix", args.mix, "--one", str(n)]))
        print(show(rows[-1]), flush=True)
        if args.out:  # after every size: a larger one that fails keeps the smaller ones' figures
            write_result("pipeline", {"mix": args.mix, "engine": "simulator", "rows": rows,
                                      "targets": {str(k): v for k, v in TARGETS.items()}})


if __name__ == "__main__":
    sys.exit(main())
