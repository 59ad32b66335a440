"""What the benches share: the simulated setups, cached mix files, and the provenance every result carries.

Each bench prints its table and, with ``--out``, writes a JSON result under
bench/results/ (``write_result`` adds the machine, versions and command);
bench/render.py turns those files into docs/BENCHMARKS.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from blendserve.batch import UNKNOWN, RequestBatch
from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.model_prep import cache_root
from blendserve.scheduling import PLANNER_REVISION
from blendserve.sim.compare import true_outputs
from blendserve.workload import (
    MixReport, WorkloadSpec, load_pools, mix_report, mix_spec, plan_requests, spec_pools, write_workload,
)
from blendserve.workload_sources import Pool, data_root

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
IMG = REPO / "docs" / "img"
# The code whose uncommitted changes move simulated numbers; provenance lists those files.
NUMBERS_CODE = ["plugins/blendserve/" + p for p in ("planner", "scheduling", "sim", "costmodel", "sampling", "batch.py",
                                                    "workload.py", "workload_solve.py", "workload_sources.py")]


@dataclass(frozen=True)
class Setup:
    """A model on a hardware group, as the cost model and the simulator see it."""

    key: str  # short name in file names and tables
    model: str  # catalog model name (costmodel.get_model)
    hardware: str  # catalog accelerator name (costmodel.get_hardware)
    tp: int  # tensor-parallel degree: F, B and memory scale with it (costmodel.HardwareSpec.tp_scale)
    label: str  # how tables name it

    def cost(self) -> CostModel:
        return CostModel(get_model(self.model), get_hardware(self.hardware, tp=self.tp))


SETUPS: dict[str, Setup] = {
    "8b": Setup("8b", "llama-3.1-8b", "a100-80g", 1, "Llama-3.1-8B on 1x A100-80G"),
    "70b": Setup("70b", "llama-3.1-70b", "a100-80g", 8, "Llama-3.1-70B on 8x A100-80G (TP 8)"),
}


def size_suffix(requests: int) -> str:
    """Result-file suffix of a bench size: none for the quick mode's 40k requests, "-400k" for the paper's."""
    return "" if requests == 40_000 else f"-{requests // 1000}k"


# --lengths: "hidden" (the default, what a user's batch job looks like) or "known" (planning on true lengths:
# the upper bound). Known-mode result files carry "-known" after the setup.
LENGTHS = ("hidden", "known")


def lengths_suffix(lengths: str) -> str:
    """Result-file part of a --lengths mode: none for the headline's hidden mode, "-known" for the upper bound."""
    return "" if lengths == "hidden" else f"-{lengths}"


def hide_lengths(batch: RequestBatch) -> tuple[RequestBatch, int]:
    """``batch`` as a user would submit it when no output length is known in advance, and its ``max_tokens``.

    Every request gets the same ``max_tokens``: the smallest power of two at
    least the longest true output of the batch (the generous round cap a user
    sets for a whole job, not a per-request cap taken from the truth), and no
    request has a known length. The simulator's truth is kept: the model still
    generates each request's true length (``sim_output_tokens``; where a batch
    had none there, the length it would have generated is written in, so
    hiding never changes what runs).
    """
    truth = true_outputs(batch)
    cap = 1 << int(max(int(truth.max(initial=1)), 1) - 1).bit_length()
    sim = np.where(batch.sim_output_tokens != UNKNOWN, batch.sim_output_tokens, truth).astype(np.int32)
    hidden = dataclasses.replace(
        batch, max_tokens=np.full(len(batch), cap, dtype=np.int32),
        expected_output_tokens=np.full(len(batch), UNKNOWN, dtype=np.int32), sim_output_tokens=sim)
    return hidden, cap


def mix_path(name: str, requests: int, setup: Setup) -> Path:
    # the 8B files keep the name the earlier benches cached them under
    prefix = "" if setup.key == "8b" else f"{setup.key}-"
    return cache_root() / "bench" / f"{prefix}{name}-{requests}.parquet"


@functools.cache
def pools() -> dict[str, Pool]:
    """The three source pools, loaded once per process (10-30 s each time on 2 cores)."""
    return load_pools(WorkloadSpec(1, 1.0, 0.1), data_root())


def write_mix(spec: WorkloadSpec, path: Path, cost: CostModel) -> MixReport:
    """build_workload on the pools already loaded."""
    drawn = spec_pools(spec, pools())
    plan = plan_requests(spec, drawn, cost)
    write_workload(plan, drawn, spec, path)
    return mix_report(plan, drawn, spec, cost)


def load_mix(name: str, requests: int, setup: Setup) -> tuple[RequestBatch, dict]:
    """A paper mix built for ``setup`` (density solved on that model and hardware), or a rare-heavy one
    (``workload.RARE_MIXES``), cached with its achieved density and sharing (the MixReport, beside the file)."""
    path = mix_path(name, requests, setup)
    report = path.with_suffix(".mix.json")
    if not path.exists() or not report.exists():
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(write_mix(mix_spec(name, requests), path, setup.cost()).to_json())
    return RequestBatch.from_parquet(path), json.loads(report.read_text())


def _git(*args: str) -> str:
    try:
        # rstrip only: porcelain lines start with a status column that may be a space
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.rstrip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def provenance() -> dict:
    """Machine, versions and command of this process; uncommitted changes to NUMBERS_CODE are listed, not hidden."""
    dirty = [line[3:] for line in _git("status", "--porcelain", "--", *NUMBERS_CODE).splitlines() if line]
    return {
        "cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)), "python": platform.python_version(),
        "numpy": np.__version__, "commit": _git("rev-parse", "--short", "HEAD"), "uncommitted": dirty,
        "planner": PLANNER_REVISION,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([".venv/bin/python", *sys.argv]),
    }


def write_result(name: str, data: dict) -> Path:
    """bench/results/<name>.json with the provenance block added."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"provenance": provenance(), **data}, indent=1, default=_plain) + "\n")
    print(f"wrote {path.relative_to(REPO)}")
    return path


def earlier_result(name: str, data: dict, settings: tuple[str, ...]) -> dict | None:
    """The stored result ``name`` when it was measured with the same ``settings`` as ``data``, else None: the
    benches whose parts take hours (a 400k mix, a full-size peer batch) keep the parts a run did not measure."""
    path = RESULTS / f"{name}.json"
    earlier = json.loads(path.read_text()) if path.exists() else None
    if earlier is None:
        return None
    differ = [k for k in settings if earlier.get(k) != data[k]]
    if differ:  # say so: a partial run then replaces a table whose other parts took hours
        print(f"{path.name} was measured with other {', '.join(differ)}: its parts this run does not measure "
              "are dropped", file=sys.stderr)
        return None
    return earlier


def _plain(value: object) -> object:
    """numpy scalars and arrays as JSON."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON: {type(value).__name__}")


def img_path(name: str) -> Path:
    IMG.mkdir(parents=True, exist_ok=True)
    return IMG / name


def in_fresh_process(script: str, args: list[str]) -> dict:
    """Run ``script`` with ``args`` in its own interpreter (so its peak memory is its own); its last line is JSON."""
    out = subprocess.run([sys.executable, script, *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def peak_rss_gb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux reports KiB
