"""What blendserve's choice saw, beside what happened: every candidate on the draws, the means and the truth.

    .venv/bin/python bench/bench_choice.py --setup 8b --requests 40000 --mixes d1.4-s35 rare-1 [--seeds 0 1] [--out]

Lengths hidden, as every shard runs (``as_shard``): the warm-up runs in the
simulator until ``blendserve`` makes its plan, and stops there. Then every
candidate of the choice (``scheduling.choice``: ``first_candidates``, then
``deadline_candidates``) is simulated over the requests left to plan on the
warm-up's draws (what the choice was made on), on the estimates' means, and
on the rest's true lengths, each from an empty engine as the choice
simulates it. ``picked`` is the candidate the choice ran. Also recorded: when
the plan was made (simulated clock, steps, requests started, preemptions
so far) and what was in flight then. A pick rule can be judged offline on
these rows: its candidate's truth against the fastest candidate's
(``choice_rules.py`` scores every rule over the stored rows). The seed is
the shard's (warm-up sample, subsample, random order); the benchmark
tables run seed 0, other seeds give the same job another warm-up.

The truth column leaves out the warm-up's work in flight; on the 8B 400k
shared-sys mix, admitting that work first moved every candidate by 95-133 s
of about 62,500 and kept their order (docs/PLANNER_NOTES.md, "2026-12-02
(late)").
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import numpy as np

from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel
from blendserve.scheduling import choice
from blendserve.scheduling.registry import PolicyContext
from blendserve.sampling import Estimates
from blendserve.scheduling.admission import AdmissionController
from blendserve.scheduling.rest_planner import BatchPlanner, RunningPlan
from blendserve.scheduling.warmup import WarmupController, warmup_controller
from blendserve.sim.compare import true_outputs
from blendserve.sim.engine_core import EngineCore
from blendserve.sim.simulator import SimConfig, kv_capacity_tokens
from blendserve.workload import MIXES, RARE_MIXES
from as_shard import shard_warmup
from common import RESULTS, SETUPS, hide_lengths, load_mix, provenance, size_suffix

class _Planned(Exception):
    """Raised by ``_StopAtPlan`` once the plan's context exists: the run ends there."""


@dataclass
class PlanPoint:
    context: PolicyContext  # the policy's view of the rest, as blendserve got it
    rest: np.ndarray  # batch indices of the requests left to plan


class _StopAtPlan(BatchPlanner):
    def plan(self, rest: np.ndarray, estimates: Estimates, lists_only: bool, policy: str | None = None,
             keep: RunningPlan | None = None) -> AdmissionController:
        # the first plan (``keep`` is None): the quick plan's context is the same
        self.point = PlanPoint(self.context(rest, estimates, lists_only, keep), rest)
        raise _Planned


def run_to_plan(batch: RequestBatch, outputs: np.ndarray, cost: CostModel, config: SimConfig, seed: int = 0,
                ) -> tuple[PlanPoint, dict]:
    """The shard's warm-up simulated until blendserve plans; the plan's context and when it came."""
    kv = kv_capacity_tokens(cost, config)
    warmup = shard_warmup(batch, cost, seed)
    controller: WarmupController = warmup_controller(batch, warmup.tree, warmup.sampled, cost, kv, seed=seed)
    planner = _StopAtPlan(batch, warmup.tree, cost, kv, "blendserve", seed)
    controller.planner = planner
    core = EngineCore(batch, np.maximum(outputs, 1), cost, controller, config, kv)
    try:
        core.run()
    except _Planned:
        pass
    else:
        raise RuntimeError("the run ended without a plan")
    flight = np.fromiter(controller.running, np.int64, len(controller.running))
    when = {"clock_s": core.clock, "steps": core.step, "preemptions": core.preemptions,
            "started": len(controller.running) + len(controller.observed), "sampled": len(controller.sampled),
            "in_flight": len(flight), "in_flight_true_output": int(outputs[flight].sum())}
    return planner.point, when


def times_on(ctx: PolicyContext, made: choice.Choosing, lengths: tuple[np.ndarray, ...]) -> dict[str, tuple[float, ...]]:
    """Every candidate ``made`` built, simulated on each of ``lengths`` (the rest's); the same seed, so the same
    subsample as the choice's."""
    return choice.Predictor(ctx.batch, made.items, ctx.output_estimates, ctx.cost_model, ctx.kv_capacity_tokens,
                            seed=ctx.seed, draws=lengths).choose(made.candidates).scenario_s


def candidate_times(point: PlanPoint, outputs: np.ndarray) -> tuple[str, dict[str, dict]]:
    """The choice's pick, and every candidate's simulated seconds on the draws, the means and the truth."""
    ctx = point.context
    made = choice.choose(ctx)
    other = times_on(ctx, made, (ctx.output_estimates, outputs[point.rest]))
    times = {name: {"draws": list(made.choice.scenario_s[name]), "means": other[name][0],
                    "truth": other[name][1]} for name in made.choice.scenario_s}
    return made.choice.name, times


def diagnose(batch: RequestBatch, cost: CostModel, config: SimConfig, seed: int = 0) -> dict:
    """``batch`` with its lengths hidden (``common.hide_lengths``): the plan point and every candidate's times."""
    hidden, cap = hide_lengths(batch)
    outputs = true_outputs(hidden)
    point, when = run_to_plan(hidden, outputs, cost, config, seed)
    picked, times = candidate_times(point, outputs)
    return {"max_tokens": cap, "requests": len(batch), "rest": len(point.rest), "plan": when, "picked": picked,
            "fastest_on_truth": min(times, key=lambda n: times[n]["truth"]), "candidates": times}


def print_mix(mix: str, result: dict) -> None:
    plan = result["plan"]
    print(f"\n{mix}: {result['requests']:,} requests, plan at {plan['clock_s']:,.1f} s (step {plan['steps']:,}, "
          f"{plan['started']:,} started, {plan['preemptions']} preemptions, {plan['in_flight']} in flight), "
          f"picked {result['picked']}, fastest on the truth {result['fastest_on_truth']}")
    draws = len(next(iter(result["candidates"].values()))["draws"])
    print(f"  {'candidate':14s}" + "".join(f"{'draw ' + str(j):>11s}" for j in range(draws))
          + f"{'means':>11s}{'truth':>11s}")
    for name, t in result["candidates"].items():
        print(f"  {name:14s}" + "".join(f"{x:11.1f}" for x in t["draws"]) + f"{t['means']:11.1f}{t['truth']:11.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--setup", choices=sorted(SETUPS), default="8b")
    ap.add_argument("--requests", type=int, default=40_000)
    ap.add_argument("--mixes", nargs="+", required=True, choices=[*MIXES, *RARE_MIXES])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0], help="the shard's seeds, one run each")
    ap.add_argument("--out", action="store_true", help="add the runs to bench/results/choice-<setup>-<size>.json")
    args = ap.parse_args()
    setup = SETUPS[args.setup]
    path = RESULTS / f"choice-{setup.key}{size_suffix(args.requests)}.json"
    for mix in args.mixes:
        batch, _ = load_mix(mix, args.requests, setup)
        for seed in args.seeds:
            started = time.perf_counter()
            result = diagnose(batch, setup.cost(), SimConfig(), seed)
            print_mix(f"{mix} (seed {seed})", result)
            print(f"  ({time.perf_counter() - started:.0f} s wall)")
            if args.out:  # read again: runs side by side add to the same file
                stored = json.loads(path.read_text()) if path.exists() else {"setup": setup.label, "mixes": {}}
                stored["mixes"].setdefault(mix, {})[str(seed)] = {**result, "provenance": provenance()}
                path.write_text(json.dumps(stored, indent=1) + "\n")


if __name__ == "__main__":
    main()
