"""Every scheduling policy by name: one table read by the DAG form, the CLI, ``RunConfig`` and the benches.

A row names the function that builds the policy's admission controller as
``"module:function"``, imported on first use, so the table itself imports
nothing: the DAG file reads ``PUBLIC_POLICIES`` and still parses in milliseconds.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import numpy as np

    from blendserve.batch import RequestBatch
    from blendserve.costmodel import CostModel
    from blendserve.scheduling.admission import AdmissionController


@dataclass(frozen=True)
class PolicyContext:
    batch: RequestBatch
    output_estimates: np.ndarray  # (n,) estimated output tokens per request (never sim_output_tokens)
    cost_model: CostModel
    kv_capacity_tokens: int  # the engine's KV memory M, in tokens
    seed: int = 0
    lists_only: bool = False  # work already in flight that a run-time controller would not see: lists only
    # Resampled output lengths (each (n,), ``sampling.estimator.draw_outputs``) that say how uncertain the
    # estimates are; empty when they are all there is (known lengths, or no warm-up).
    output_draws: tuple[np.ndarray, ...] = ()
    # A re-plan's batch rows in the order the plan running now would admit them: the candidate to beat
    # (``choice.KEEP``). None: a first plan.
    keep_order: np.ndarray | None = None
    # The choice's candidate the running plan was made from (``choice.pick_replan`` keeps rather than re-make
    # it); None: a first plan, or a running plan no choice made.
    keep_candidate: str | None = None


@dataclass(frozen=True)
class Policy:
    name: str  # what a user types: --policy, the DAG's `policy` Param, bench tables
    factory: str  # "module:function" taking a PolicyContext and returning an AdmissionController
    public: bool  # offered in the DAG form and the CLI; the others exist for benchmarks
    needs_estimates: bool  # orders on output lengths: shards learn them (warm-up) and order their own requests
    tree_shards: bool  # shards are whole prefix subtrees cut from the plan; else equal slices of the policy's order
    summary: str  # one line for help texts


_CHOICE = "blendserve.scheduling.choice"
_BASELINES = "blendserve.scheduling.baselines"
POLICIES: dict[str, Policy] = {p.name: p for p in (
    # What users A/B, the default first.
    Policy("blendserve", f"{_CHOICE}:blendserve", True, True, True,
           "prefix tree, sort and split, then the admission the simulator predicts fastest"),
    Policy("blendserve-nosplit", f"{_CHOICE}:blendserve_nosplit", True, True, True,
           "prefix tree and density sort without splitting, the projected dual scan"),
    Policy("dfs", f"{_BASELINES}:dfs", True, True, False, "depth-first prefix order: the most prefix sharing"),
    Policy("density", f"{_BASELINES}:density", True, True, False, "each request by its own density"),
    Policy("fcfs", f"{_BASELINES}:fcfs", True, False, False, "the input file's order"),
    Policy("balance", f"{_BASELINES}:balance", True, False, False, "a seeded random order"),
    # One candidate of blendserve's choice alone, for benchmarks (``choice.single_candidate``). Its fcfs and
    # balance run the warm-up first, so against the bare baselines they measure what the warm-up costs.
    *(Policy(f"blendserve[{c}]", f"{_CHOICE}:single_candidate:{c}", False, True, True,
             f"blendserve's {c} admission alone, no choice")
      for c in ("dual-scan", "static", "spread", "fcfs", "balance")),
)}
PUBLIC_POLICIES = tuple(name for name, p in POLICIES.items() if p.public)


def get_policy(name: str) -> Policy:
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return POLICIES[name]


def make_controller(name: str, context: PolicyContext) -> AdmissionController:
    """The admission controller of policy ``name`` over ``context.batch``."""
    return _factory(get_policy(name))(context)


def _factory(policy: Policy) -> Callable[[PolicyContext], AdmissionController]:
    module, function, *argument = policy.factory.split(":")
    build = getattr(importlib.import_module(module), function)
    return build(*argument) if argument else build
