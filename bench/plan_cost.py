"""What blendserve's plan costs on this host, and the model the simulator charges for it.

A shard's plan is made beside its engine (``scheduling.plan_worker``); the
simulator holds it back for ``plan_latency``: ``PLAN_S_PER_REQUEST`` per
request planned (a plan without a choice, dfs's, costs about that), and
``PLAN_S_PER_SIM_REQUEST`` and ``PLAN_S_PER_SIM_STEP`` per request and per
engine step the choice simulated. This bench runs ``blendserve`` as a shard
on paper mixes (lengths hidden), times each plan on this host, and fits the
choice's two constants by non-negative least squares, printing every plan's
measured, modelled (the constants in use) and fitted seconds side by side.
The fit weighs the large plans most, which is where the plan's time matters.

usage: PYTHONPATH=plugins:bench python bench/plan_cost.py --requests 5000 20000 --mixes d1.4-s5 d0.9-s35
"""

from __future__ import annotations

import argparse

import numpy as np

from as_shard import shard_warmup, simulate_as_shard
from common import SETUPS, hide_lengths, load_mix, write_result
from blendserve.scheduling import plan_worker, warmup
from blendserve.scheduling.plan_worker import plan_latency
from blendserve.sim.compare import true_outputs
from blendserve.sim.simulator import SimConfig


def measure(mix: str, requests: int, setup: str) -> dict:
    """One shard run of ``blendserve``: its plan's host seconds, size and simulated steps."""
    batch, _ = load_mix(mix, requests, SETUPS[setup])
    hidden, _ = hide_lengths(batch)
    cost = SETUPS[setup].cost()
    # One plan per row: a re-plan would add its seconds to ``plan_seconds``, while ``inner`` is the last plan's.
    replan_at, warmup.REPLAN_AT = warmup.REPLAN_AT, ()
    try:
        _, controller = simulate_as_shard(hidden, true_outputs(hidden), cost, SimConfig(), "blendserve",
                                          shard_warmup(hidden, cost, 0), 0)
    finally:
        warmup.REPLAN_AT = replan_at
    planned = len(controller._rest)
    return {"mix": mix, "requests": requests, "planned": planned, "plan_s": controller.plan_seconds,
            "simulated_requests": controller.inner.choice.simulated_requests,
            "simulated_steps": controller.inner.choice.simulated_steps,
            "modelled_s": plan_latency(controller.inner, planned)}


FEATURES = ("simulated_requests", "simulated_steps")  # what plan_latency charges the choice, in its order
IN_USE = ("PLAN_S_PER_SIM_REQUEST", "PLAN_S_PER_SIM_STEP")


def fit(rows: list[dict]) -> tuple[float, ...]:
    """The choice's seconds per simulated request and step (the rest of the plan at ``PLAN_S_PER_REQUEST``):
    least squares, neither below zero."""
    from scipy.optimize import nnls

    a = np.array([[r[f] for f in FEATURES] for r in rows], dtype=float)
    b = np.array([r["plan_s"] - plan_worker.PLAN_S_PER_REQUEST * r["planned"] for r in rows])
    scale = a.max(axis=0)  # columns of like size, for a well-conditioned solve
    coefficients, _ = nnls(a / scale, b)
    return tuple(float(c) for c in coefficients / scale)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, nargs="+", default=[5000, 20000])
    parser.add_argument("--mixes", nargs="+", default=["d1.4-s5", "d0.9-s35"])
    parser.add_argument("--setup", default="8b", choices=sorted(SETUPS))
    parser.add_argument("--out", action="store_true", help="write bench/results/plan-cost.json")
    args = parser.parse_args()
    rows = []
    for n in args.requests:
        for mix in args.mixes:
            rows.append(measure(mix, n, args.setup))
            r = rows[-1]
            print(f"{mix:>10} {n:>7,}: planned {r['planned']:>7,}, simulated {r['simulated_requests']:>9,} requests "
                  f"and {r['simulated_steps']:>11,} steps, plan {r['plan_s']:7.1f} s here, modelled "
                  f"{r['modelled_s']:7.1f} s", flush=True)
    fitted = fit(rows)
    in_use = [getattr(plan_worker, name) for name in IN_USE]
    print("fit (us): " + ", ".join(f"{name} {c * 1e6:.3f} (in use {u * 1e6:.3f})"
                                    for name, c, u in zip(IN_USE, fitted, in_use)))
    for r in rows:
        model = plan_worker.PLAN_S_PER_REQUEST * r["planned"] + sum(c * r[f] for c, f in zip(fitted, FEATURES))
        print(f"{r['mix']:>10} {r['requests']:>7,}: measured {r['plan_s']:7.1f} s, modelled {r['modelled_s']:7.1f} s, "
              f"fitted {model:7.1f} s")
    if args.out:
        write_result("plan-cost", {"setup": args.setup, "rows": rows, "fit": dict(zip(IN_USE, fitted))})


if __name__ == "__main__":
    main()
