"""Run several policies through the simulator on one batch and compare them with ``T_opt``."""

from __future__ import annotations

import time

import numpy as np

from blendserve.batch import UNKNOWN, RequestBatch
from blendserve.costmodel import CostModel, Optimum, batch_t_opt
from blendserve.planner.estimates import default_output_estimates
from blendserve.planner.prefix_tree import build_prefix_tree
from blendserve.sampling import estimate_outputs, select_samples
from blendserve.scheduling.choice import Choice
from blendserve.scheduling.registry import PolicyContext, make_controller
from blendserve.sim.simulator import SimConfig, SimResult, kv_capacity_tokens, simulate, step_overlap

# What a report's sharing_vs_dfs counts: the prompt tokens each request found cached at its first start
# (vLLM's num_cached_tokens). Reports without the key (before 2026-12-03) also counted a preempted request
# finding its own prompt again at restart, which credits dfs with the recomputation its preemptions cause.
SHARING_COUNTS = "first start"


def true_outputs(batch: RequestBatch) -> np.ndarray:
    """What the simulated model generates: sim_output_tokens, else the known length, else max_tokens."""
    out = np.where(batch.sim_output_tokens != UNKNOWN, batch.sim_output_tokens, batch.expected_output_tokens)
    return np.maximum(np.where(out != UNKNOWN, out, batch.max_tokens), 1).astype(np.int64)


def warmup_estimates(batch: RequestBatch, cost: CostModel, outputs: np.ndarray, seed: int = 0) -> np.ndarray:
    """Estimates as the pipeline makes them: the warm-up sampler's 1% (its defaults) observed, the rest inferred.

    The sampled requests' observed lengths are their true ones (what the warm-up
    run would return); every other estimate comes from its subtree's samples.
    """
    tree = build_prefix_tree(batch, cost)
    sampled = select_samples(batch, tree, seed=seed)
    return estimate_outputs(batch, tree, sampled, outputs[sampled]).mean


def compare_policies(
    batch: RequestBatch, cost: CostModel, config: SimConfig, policies: list[str], seed: int = 0,
    estimates: np.ndarray | None = None,
) -> dict:
    """Simulate each policy (and dfs, for the sharing reference, when registered).

    ``estimates`` are the output lengths the policies plan with (never the true
    ones); None takes the planner's defaults (known length, else max_tokens).
    """
    outputs = true_outputs(batch)
    estimates = default_output_estimates(batch) if estimates is None else np.asarray(estimates, dtype=np.int64)
    context = PolicyContext(batch, estimates, cost, kv_capacity_tokens(cost, config), seed)
    optimum = batch_t_opt(cost, batch, outputs, step_overlap(cost, config), context.kv_capacity_tokens)
    results: dict[str, tuple[SimResult, float]] = {}
    chosen: dict[str, dict] = {}  # policy -> what it chose by prediction (blendserve), when it says
    for name in policies + (["dfs"] if "dfs" not in policies else []):
        started = time.monotonic()
        controller = make_controller(name, context)
        if getattr(controller, "choice", None) is not None:
            chosen[name] = _chosen(controller.choice, len(batch), optimum.time)
        result = simulate(batch, outputs, cost, controller, config)
        results[name] = (result, time.monotonic() - started)
    extra = {name: {"chosen": None, **chosen.get(name, {})} for name in policies}
    return report(batch, outputs, cost, config, context.kv_capacity_tokens, optimum, results, extra)


def report(batch: RequestBatch, outputs: np.ndarray, cost: CostModel, config: SimConfig, kv: int, optimum: Optimum,
           results: dict[str, tuple[SimResult, float]], extra: dict[str, dict]) -> dict:
    """A comparison's dict: the batch, the setup, ``T_opt`` and a row per policy of ``extra`` (in its order,
    with its fields added); both modes (this module's and bench/as_shard.py's) write it, so they read alike."""
    dfs_shared = results["dfs"][0].shared_tokens if "dfs" in results else None
    policies = list(extra)
    return {
        "sharing_counts": SHARING_COUNTS,
        "requests": len(batch), "input_tokens": int(batch.prompt_lens.sum()), "output_tokens": int(outputs.sum()),
        "model": cost.model.name, "hardware": f"{cost.hardware.name} x{cost.hardware.tp}",
        "kv_capacity_tokens": kv, "overlap": step_overlap(cost, config),
        "token_budget": results[policies[0]][0].token_budget if policies else None, "min_steps": optimum.min_steps,
        "t_opt_s": optimum.time, "c_star_s": optimum.comp, "m_star_s": optimum.mem,
        "policies": [{**_row(name, *results[name], optimum.time, dfs_shared), **extra[name]} for name in policies],
    }


def _chosen(choice: Choice, requests: int, t_opt: float) -> dict:
    """The candidate a predictive policy chose, and its predicted fraction of T_opt when the whole job was
    simulated (a subsample's time has no T_opt to compare with)."""
    predicted = choice.predicted_s[choice.name]
    whole = choice.sample == requests and predicted > 0
    return {"chosen": choice.name, "predicted_fraction": t_opt / predicted if whole else None}


def _row(name: str, result: SimResult, wall: float, t_opt: float, dfs_shared: int | None) -> dict:
    return {
        "policy": name, "time_s": result.total_time, "throughput": result.throughput,
        "fraction_of_optimum": t_opt / result.total_time if result.total_time else 0.0,
        "prefix_hit_ratio": result.prefix_hit_ratio,
        "sharing_vs_dfs": (result.shared_tokens / dfs_shared if dfs_shared else None),
        "preemptions": result.preemptions, "steps": result.steps,
        "mean_compute_util": result.comp_time / result.total_time if result.total_time else 0.0,
        "mean_memory_util": result.mem_time / result.total_time if result.total_time else 0.0,
        "simulator_wall_s": wall,
    }
