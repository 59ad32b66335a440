"""blendserve against fcfs and balance over several shard seeds, lengths hidden: the spread one seed hides.

    .venv/bin/python bench/bench_seeds.py --setup 8b --requests 20000 --mixes rare-1 d1.4-s5 --seeds 0 1 2 [--out]

The benchmark tables run seed 0. A seed is the shard's: its warm-up sample,
its fillers' order, the choice's subsample and random candidate, and
``balance``'s permutation; ``fcfs`` (the file's order) has none. Each run is
a whole shard (``as_shard.simulate_as_shard``), warm-up included, the
simulator on the true lengths. Prints every seed's seconds per mix and
blendserve's speed-up over each baseline (its time / blendserve's), then
the median and the worst over the seeds: a miss by under the seeds' spread
is a draw, not a rank. ``--out`` adds the runs to
bench/results/seeds-<setup>-<size>.json.

A trial changes one of the warm-up's knobs: ``--filler-piece N``, the
fillers in pieces of N requests (``warmup.FILLER_PIECE``); ``--replan-at X
[X ...]``, the shares of the shard started at which the rest is planned
again (``warmup.REPLAN_AT``; none: planned once). A trial runs
blendserve only, sets it beside the baselines stored for the same seeds (no
warm-up runs under them), and writes nothing.

``--worlds K`` asks how much of a miss is the job's luck: each seed runs
again in K other *worlds*, the same job with its long answers' true
lengths (over ``LONG_ENOUGH`` tokens) shuffled among the long requests
(``shuffled_long``). Nothing known before running tells such a world from
the real one when the long answers' lengths do not follow their prompts
(on rare-1 at 20k, the Spearman correlation of prompt and output length
among the 200 over 4,096 tokens is -0.03). Printed per world, then each
policy's mean over the worlds; writes nothing.

``--orders K`` asks how lucky the file's order is: beside each seed's run,
K more random orders (``balance`` at seeds ``ORDER_SEEDS`` and up) run on
the same job, and each policy is placed among them (how many it is faster
than, its speed-up over their median). The mixes' files are a random
permutation of their sources, so ``fcfs`` is one draw of the same kind; a
miss against it by less than the orders' spread is the draw's luck, and
one against their median is the planner's. Writes nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel
from blendserve.sim.compare import true_outputs
from blendserve.sim.simulator import SimConfig
from blendserve.scheduling import warmup as warmup_module
from blendserve.scheduling.warmup import LONG_ENOUGH
from blendserve.workload import MIXES, RARE_MIXES
from as_shard import Warmup, plan_choices, shard_warmup, simulate_as_shard
from common import RESULTS, SETUPS, hide_lengths, load_mix, provenance, size_suffix
from tables import SEED_BASELINES, seed_ratios, seed_speedups

POLICIES = (*SEED_BASELINES, "blendserve")
# Seed of the first of ``--orders``' random orders: clear of the shard seeds the tables run (0-2).
ORDER_SEEDS = 1000


def run_seed(batch: RequestBatch, cost: CostModel, config: SimConfig, seed: int,
             policies: tuple[str, ...] = POLICIES) -> dict[str, dict]:
    """Each of ``policies`` as a shard of ``batch`` (lengths hidden) with ``seed``: seconds and pick."""
    return run_policies(*seed_job(batch, cost, seed), cost, config, seed, policies)


def seed_job(batch: RequestBatch, cost: CostModel, seed: int) -> tuple[RequestBatch, np.ndarray, Warmup]:
    """The job a shard with ``seed`` runs: ``batch`` with its lengths hidden, the true lengths the engine
    generates, and the shard's warm-up sample (drawn from the prompts alone)."""
    hidden, _ = hide_lengths(batch)
    return hidden, true_outputs(hidden), shard_warmup(hidden, cost, seed)


def run_policies(hidden: RequestBatch, outputs: np.ndarray, warmup: Warmup, cost: CostModel, config: SimConfig,
                 seed: int, policies: tuple[str, ...] = POLICIES) -> dict[str, dict]:
    """Each of ``policies`` as a shard of ``hidden`` with ``warmup`` and ``seed``, the engine generating
    ``outputs``: seconds and pick."""
    runs = {}
    for policy in policies:
        result, controller = simulate_as_shard(hidden, outputs, cost, config, policy, warmup, seed)
        runs[policy] = {"time_s": result.total_time, "chosen": plan_choices(controller)}
    return runs


def shuffled_long(outputs: np.ndarray, world: int, long_at: int = LONG_ENOUGH) -> np.ndarray:
    """``outputs`` with the lengths over ``long_at`` shuffled among the requests that have them (world 0: as
    they are); every other length, and which requests are long, stay."""
    if world == 0:
        return outputs
    long = np.flatnonzero(outputs > long_at)
    shuffled = outputs.copy()
    shuffled[long] = np.random.default_rng(world).permutation(outputs[long])
    return shuffled


def run_worlds(batch: RequestBatch, cost: CostModel, seed: int, worlds: int) -> dict[int, dict[str, dict]]:
    """``run_seed`` in the real world and ``worlds`` others (``shuffled_long``), by world. The warm-up sample is
    drawn from the prompts alone, so every world shares it."""
    hidden, outputs, warmup = seed_job(batch, cost, seed)
    return {world: run_policies(hidden, shuffled_long(outputs, world), warmup, cost, SimConfig(), seed)
            for world in range(worlds + 1)}


def print_worlds(mix: str, seed: int, runs: dict[int, dict[str, dict]]) -> None:
    print(f"\n{mix}, seed {seed}: the real world (0) and {len(runs) - 1} with the long answers' lengths shuffled")
    print(f"  {'world':>5s}" + "".join(f"{p:>12s}" for p in POLICIES)
          + "".join(f"{'x ' + b:>10s}" for b in SEED_BASELINES))
    for world, run in runs.items():
        print(f"  {world:>5d}" + "".join(f"{run[p]['time_s']:12.1f}" for p in POLICIES)
              + "".join(f"{r:10.3f}" for r in seed_ratios(run).values()))
    mean = {p: float(np.mean([run[p]["time_s"] for run in runs.values()])) for p in POLICIES}
    ahead = sum(all(r >= 1 for r in seed_ratios(run).values()) for run in runs.values())
    print(f"  {'mean':>5s}" + "".join(f"{mean[p]:12.1f}" for p in POLICIES)
          + "".join(f"{mean[b] / mean['blendserve']:10.3f}" for b in SEED_BASELINES)
          + f"   blendserve at or ahead of both in {ahead} of {len(runs)} worlds")


def run_orders(batch: RequestBatch, cost: CostModel, seed: int, orders: int) -> tuple[dict[str, dict], list[float]]:
    """``run_seed``'s runs, and the seconds of ``orders`` random orders of the same job (``balance`` at seeds
    ``ORDER_SEEDS``, ``ORDER_SEEDS + 1``, ...)."""
    hidden, outputs, warmup = seed_job(batch, cost, seed)
    config = SimConfig()
    runs = run_policies(hidden, outputs, warmup, cost, config, seed)
    times = [simulate_as_shard(hidden, outputs, cost, config, "balance", warmup, ORDER_SEEDS + k)[0].total_time
             for k in range(orders)]
    return runs, times


def print_orders(mix: str, seed: int, runs: dict[str, dict], orders: list[float]) -> None:
    median = float(np.median(orders))
    print(f"\n{mix}, seed {seed}: {len(orders)} more random orders (balance at seeds {ORDER_SEEDS}-"
          f"{ORDER_SEEDS + len(orders) - 1}): median {median:.1f} s, fastest {min(orders):.1f}, slowest "
          f"{max(orders):.1f} ({max(orders) / min(orders) - 1:.1%} apart)")
    print(f"  {'policy':>12s}{'time s':>12s}{'x median':>10s}  faster than")
    for policy in POLICIES:
        time_s = runs[policy]["time_s"]
        faster = sum(time_s < other for other in orders)
        print(f"  {policy:>12s}{time_s:12.1f}{median / time_s:10.3f}  {faster} of {len(orders)}")


def stored_baselines(path: Path, mix: str, seed: int) -> dict[str, dict]:
    """The baselines' runs of ``mix`` at ``seed`` in the results file ``path``: they run bare, no fillers."""
    stored = json.loads(path.read_text())["mixes"] if path.exists() else {}
    run = stored.get(mix, {}).get(str(seed), {})
    missing = [b for b in SEED_BASELINES if b not in run]
    if missing:
        raise SystemExit(f"{path.name} has no {', '.join(missing)} run of {mix} at seed {seed}: run it first")
    return {b: run[b] for b in SEED_BASELINES}


def start_trial(filler_piece: int | None = None, replan_at: list[float] | None = None) -> bool:
    """Set the warm-up knobs a trial asks for; whether any was asked for (then only blendserve runs)."""
    if filler_piece:
        warmup_module.FILLER_PIECE = filler_piece
    if replan_at is not None:
        if any(not 0 < share < 1 for share in replan_at):
            raise SystemExit(f"--replan-at takes shares between 0 and 1, got {replan_at}")
        warmup_module.REPLAN_AT = tuple(sorted(replan_at))
    return bool(filler_piece) or replan_at is not None


def print_mix(mix: str, seeds: dict[str, dict[str, dict]]) -> None:
    print(f"\n{mix}")
    print(f"  {'seed':>4s}" + "".join(f"{p:>12s}" for p in POLICIES) + f"  {'pick':14s}"
          + "".join(f"{'x ' + b:>10s}" for b in SEED_BASELINES))
    for seed, run in sorted(seeds.items(), key=lambda kv: int(kv[0])):
        print(f"  {seed:>4s}" + "".join(f"{run[p]['time_s']:12.1f}" for p in POLICIES)
              + f"  {run['blendserve']['chosen'] or '-':14s}"
              + "".join(f"{r:10.3f}" for r in seed_ratios(run).values()))
    summary = seed_speedups(seeds)
    print("  median / worst over the seeds: " + ", ".join(
        f"x {b} {s['median']:.3f} / {s['worst']:.3f}" for b, s in summary.items()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--setup", choices=sorted(SETUPS), default="8b")
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--mixes", nargs="+", required=True, choices=[*MIXES, *RARE_MIXES])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--out", action="store_true", help="add the runs to bench/results/seeds-<setup>-<size>.json")
    ap.add_argument("--filler-piece", type=int, help="trial: fillers in pieces of N, beside the stored baselines")
    ap.add_argument("--replan-at", nargs="*", type=float,
                    help="trial: shares of the shard started at which the rest is planned again (none: once)")
    ap.add_argument("--worlds", type=int, default=0,
                    help="also run each seed in N worlds with the long answers' lengths shuffled among them")
    ap.add_argument("--orders", type=int, default=0,
                    help="also run N more random orders of each seed's job and place every policy among them")
    args = ap.parse_args()
    setup = SETUPS[args.setup]
    path = RESULTS / f"seeds-{setup.key}{size_suffix(args.requests)}.json"
    trial = start_trial(args.filler_piece, args.replan_at)
    if (trial or args.worlds or args.orders) and args.out:
        ap.error("a trial (--filler-piece, --replan-at), --worlds or --orders writes nothing")
    if sum(map(bool, (trial, args.worlds, args.orders))) > 1:
        ap.error("one of a trial, --worlds and --orders at a time")
    for mix in args.mixes:
        batch, _ = load_mix(mix, args.requests, setup)
        if args.worlds:
            for seed in args.seeds:
                print_worlds(mix, seed, run_worlds(batch, setup.cost(), seed, args.worlds))
            continue
        if args.orders:
            for seed in args.seeds:
                print_orders(mix, seed, *run_orders(batch, setup.cost(), seed, args.orders))
            continue
        seeds = {}
        for seed in args.seeds:
            started = time.perf_counter()
            if trial:
                runs = {**stored_baselines(path, mix, seed), **run_seed(batch, setup.cost(), SimConfig(), seed,
                                                                        ("blendserve",))}
            else:
                runs = run_seed(batch, setup.cost(), SimConfig(), seed)
            seeds[str(seed)] = {**runs, "provenance": provenance()}
            print(f"  {mix} seed {seed}: {time.perf_counter() - started:.0f} s wall", flush=True)
        print_mix(mix, seeds)
        if args.out:  # read again: runs side by side add to the same file
            stored = json.loads(path.read_text()) if path.exists() else {
                "setup": setup.label, "requests": args.requests, "lengths": "hidden", "mixes": {}}
            stored["mixes"].setdefault(mix, {}).update(seeds)
            path.write_text(json.dumps(stored, indent=1) + "\n")


if __name__ == "__main__":
    main()
