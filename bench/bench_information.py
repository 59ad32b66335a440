"""What knowing more of the lengths is worth to the plan: blendserve's choice made again on estimates that know
part of the truth, every candidate simulated on the truth.

    .venv/bin/python bench/bench_information.py --setup 8b --requests 40000 --mixes rare-1 d0.9-s5 [--seeds 0]

Lengths hidden, as ``bench_choice`` runs them: the warm-up runs in the
simulator until ``blendserve`` plans, and stops there. The choice is then
made again over the requests left to plan, once per column, on the means of
estimates that know more (no draws), and every candidate is simulated on
the rest's true lengths from an empty engine:

- ``estimates``: the warm-up's means, as the plan had them;
- ``long-level``: the long answers (over ``warmup.LONG_ENOUGH`` tokens)
  known to be long, all at their true mean; the others as estimated;
- ``long``: the long answers at their own true lengths;
- ``truth``: every length known.

From one column to the next is what that knowledge is worth to the plan
(the warm-up's own cost is not in it). Writes nothing.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

from blendserve.scheduling import choice
from blendserve.scheduling.warmup import LONG_ENOUGH
from blendserve.sim.compare import true_outputs
from blendserve.sim.simulator import SimConfig
from blendserve.workload import MIXES, RARE_MIXES
from bench_choice import PlanPoint, run_to_plan, times_on
from common import SETUPS, hide_lengths, load_mix

KNOWS = ("estimates", "long-level", "long", "truth")


def informed(means: np.ndarray, truth: np.ndarray, knows: str) -> np.ndarray:
    """The lengths a plan that ``knows`` (one of ``KNOWS``) would be made on."""
    long = truth > LONG_ENOUGH
    if knows == "estimates":
        return means
    if knows == "long-level":
        return np.where(long, int(round(float(truth[long].mean()))) if long.any() else 1, means)
    if knows == "long":
        return np.where(long, truth, means)
    if knows == "truth":
        return truth
    raise ValueError(f"unknown knowledge {knows!r}: one of {', '.join(KNOWS)}")


def informed_times(point: PlanPoint, truth: np.ndarray, knows: str) -> tuple[str, dict[str, float]]:
    """The choice made on what ``knows`` gives, and every candidate's seconds on the rest's ``truth``."""
    ctx = replace(point.context, output_estimates=informed(point.context.output_estimates, truth, knows),
                  output_draws=())
    made = choice.choose(ctx)
    times = made.choice.scenario_s
    if knows != "truth":  # simulated on what it knew: now on the truth, the same subsample and candidates
        times = times_on(ctx, made, (truth,))
    return made.choice.name, {name: float(t[0]) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--setup", choices=sorted(SETUPS), default="8b")
    ap.add_argument("--requests", type=int, default=40_000)
    ap.add_argument("--mixes", nargs="+", required=True, choices=[*MIXES, *RARE_MIXES])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    args = ap.parse_args()
    setup = SETUPS[args.setup]
    for mix in args.mixes:
        hidden, _ = hide_lengths(load_mix(mix, args.requests, setup)[0])
        outputs = true_outputs(hidden)
        for seed in args.seeds:
            started = time.perf_counter()
            point, when = run_to_plan(hidden, outputs, setup.cost(), SimConfig(), seed)
            truth = np.maximum(outputs[point.rest], 1)
            columns = {knows: informed_times(point, truth, knows) for knows in KNOWS}
            print(f"\n{mix} (seed {seed}): plan at {when['clock_s']:,.1f} s, {len(point.rest):,} requests left; "
                  f"seconds on the truth (* the pick)")
            print(f"  {'candidate':14s}" + "".join(f"{k:>13s}" for k in KNOWS))
            for name in columns["estimates"][1]:
                print(f"  {name:14s}" + "".join(f"{t[name]:12.1f}{'*' if pick == name else ' '}"
                                              for pick, t in columns.values()))
            print(f"  ({time.perf_counter() - started:.0f} s wall)", flush=True)


if __name__ == "__main__":
    main()
