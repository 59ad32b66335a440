"""Simulate policies the way a pipeline shard runs them, and compare them: the benches' hidden-length mode.

A shard knows no output length in advance. For a policy that orders on
lengths (``Policy.needs_estimates``) it runs a warm-up sample first, with
random fillers keeping the engine busy, and plans the rest on the estimates
the sample's observed lengths give (``pipeline.shard.ShardScheduler``); the
sample's own time is part of the run. fcfs and balance run bare, on
``default_output_estimates``. This module builds the same controller from the
library's own functions (the shard's sample, estimator, warm-up controller,
policies), so changes to any of them show up here unchanged.

``compare_as_shard`` returns ``blendserve.sim.compare.compare_policies``' dict
(built by its ``report``), so tables.py and render.py
read both modes alike. ``run_policies`` picks the mode from ``--lengths``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel, batch_t_opt
from blendserve.planner.estimates import default_output_estimates
from blendserve.planner.prefix_tree import PrefixTree, build_prefix_tree
from blendserve.sampling import shard_sample
from blendserve.scheduling.admission import AdmissionController
from blendserve.scheduling.registry import PolicyContext, get_policy, make_controller
from blendserve.scheduling.warmup import WarmupController, warmup_controller
# The report is compare_policies' own, so a row means the same in both modes.
from blendserve.sim.compare import _chosen, compare_policies, report, true_outputs, warmup_estimates
from blendserve.sim.simulator import SimConfig, SimResult, kv_capacity_tokens, simulate, step_overlap
from common import hide_lengths

SAMPLE_RATE = 0.01  # RunConfig.sample_rate's default: the warm-up sample a shard draws


@dataclass(frozen=True)
class Warmup:
    """A shard's prefix tree and warm-up sample over its batch (drawn once; every policy runs the same sample)."""

    tree: PrefixTree
    sampled: np.ndarray  # batch indices of the sample


def shard_warmup(batch: RequestBatch, cost: CostModel, seed: int = 0) -> Warmup:
    """The sample a ``ShardScheduler`` draws (``sampling.shard_sample``)."""
    tree = build_prefix_tree(batch, cost)
    return Warmup(tree, shard_sample(batch, tree, rate=SAMPLE_RATE, seed=seed))


def shard_controller(
    batch: RequestBatch, cost: CostModel, kv_capacity: int, policy: str, warmup: Warmup, seed: int = 0,
) -> AdmissionController:
    """The admission a shard runs for ``policy``: warm-up then plan when it orders on lengths, else bare."""
    if not get_policy(policy).needs_estimates:
        return make_controller(policy, PolicyContext(batch, default_output_estimates(batch), cost, kv_capacity, seed))
    return warmup_controller(batch, warmup.tree, warmup.sampled, cost, kv_capacity, policy=policy, seed=seed)


def simulate_as_shard(
    batch: RequestBatch, outputs: np.ndarray, cost: CostModel, config: SimConfig, policy: str,
    warmup: Warmup | None = None, seed: int = 0,
) -> tuple[SimResult, AdmissionController]:
    """One policy simulated as a shard runs it (the sample's time included), and its controller after the run."""
    warmup = shard_warmup(batch, cost, seed) if warmup is None else warmup
    controller = shard_controller(batch, cost, kv_capacity_tokens(cost, config), policy, warmup, seed)
    return simulate(batch, outputs, cost, controller, config), controller


def planned(controller: AdmissionController) -> AdmissionController | None:
    """The controller that planned on estimates: a warm-up's inner one (set once the sample is back), else itself."""
    return controller.inner if isinstance(controller, WarmupController) else controller


def compare_as_shard(
    batch: RequestBatch, cost: CostModel, config: SimConfig, policies: list[str], seed: int = 0,
) -> dict:
    """compare_policies' report with every policy run as a shard runs it; rows add the sample size and the
    requests admitted as unplanned fillers while it ran."""
    outputs = true_outputs(batch)
    kv = kv_capacity_tokens(cost, config)
    optimum = batch_t_opt(cost, batch, outputs, step_overlap(cost, config), kv)
    warmup = shard_warmup(batch, cost, seed)
    rows, results = {}, {}
    for name in policies + (["dfs"] if "dfs" not in policies else []):
        started = time.monotonic()
        result, controller = simulate_as_shard(batch, outputs, cost, config, name, warmup, seed)
        results[name] = (result, time.monotonic() - started)
        rows[name] = {"chosen": None, **_choice(controller, len(batch), optimum.time),
                      **_warmup_counts(controller)}
    return report(batch, outputs, cost, config, kv, optimum, results, {name: rows[name] for name in policies})


def _choice(controller: AdmissionController, requests: int, t_opt: float) -> dict:
    # The plan covers only the requests left after the sample, so its predicted time has no T_opt to
    # compare with: _chosen leaves predicted_fraction None when its sample is not the whole batch.
    choice = getattr(planned(controller), "choice", None)
    return {} if choice is None else {**_chosen(choice, requests, t_opt), "chosen": plan_choices(controller)}


def plan_choices(controller: AdmissionController) -> str | None:
    """What a predictive policy chose, each plan's choice in turn ("spread-0.05 → keep": a re-plan kept the first
    plan's order); None for a policy without a choice."""
    if isinstance(controller, WarmupController) and controller.choices:
        return " → ".join(controller.choices)
    choice = getattr(planned(controller), "choice", None)
    return None if choice is None else choice.name


def _warmup_counts(controller: AdmissionController) -> dict:
    if not isinstance(controller, WarmupController):
        return {"sampled": 0, "unplanned": 0}
    # plan_s: this machine's seconds for the plan. plan_latency_s: the simulated seconds the engine ran on (the
    # quick list, or fillers) while it was made (plan_worker.SimulatedPlan), which the simulated time includes.
    latency = getattr(controller.worker, "latency_s", None)
    return {"sampled": len(controller.sampled), "unplanned": controller.unplanned,
            "plan_s": controller.plan_seconds, "plan_latency_s": latency,
            "admitted_while_planning": controller.admitted_while_planning}


def run_policies(
    batch: RequestBatch, cost: CostModel, config: SimConfig, policies: list[str], lengths: str,
    estimates: str = "warmup",
) -> tuple[dict, int | None]:
    """The bench's comparison in ``--lengths`` mode, and the uniform max_tokens of hidden mode (None: known).

    hidden: lengths hidden (``common.hide_lengths``), every policy run as a shard.
    known: today's upper bound, planning on the batch as built (known video lengths,
    per-request caps) with the warm-up sampler's estimates (``estimates="warmup"``)
    or the planner's defaults (``"default"``), no warm-up time counted.
    """
    if lengths == "hidden":
        hidden, cap = hide_lengths(batch)
        return compare_as_shard(hidden, cost, config, policies), cap
    planned_on = warmup_estimates(batch, cost, true_outputs(batch)) if estimates == "warmup" else None
    return compare_policies(batch, cost, config, policies, estimates=planned_on), None
