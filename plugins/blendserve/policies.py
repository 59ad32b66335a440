"""Scheduling policies by name: each builds an admission controller for a batch.

One registry for the simulator, the planner and the real engines, so a policy
name means the same order everywhere. The planner registers ``dfs``,
``density``, ``blendserve-nosplit`` and ``blendserve`` here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from blendserve.admission import AdmissionController, StaticOrder
from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel


@dataclass(frozen=True)
class PolicyContext:
    batch: RequestBatch
    output_estimates: np.ndarray  # (n,) estimated output tokens per request (never sim_output_tokens)
    cost_model: CostModel
    kv_capacity_tokens: int  # the engine's KV memory M, in tokens
    seed: int = 0


PolicyFactory = Callable[[PolicyContext], AdmissionController]
POLICIES: dict[str, PolicyFactory] = {}


def register(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    def wrap(factory: PolicyFactory) -> PolicyFactory:
        POLICIES[name] = factory
        return factory

    return wrap


def make_controller(name: str, context: PolicyContext) -> AdmissionController:
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; known: {sorted(POLICIES)}")
    return POLICIES[name](context)


@register("fcfs")
def fcfs(context: PolicyContext) -> AdmissionController:
    """Input order: what running vLLM on the file as it is does."""
    return StaticOrder(np.arange(len(context.batch)))


@register("balance")
def balance(context: PolicyContext) -> AdmissionController:
    """Random order: blends compute- and memory-heavy work but loses prefix sharing."""
    rng = np.random.default_rng(context.seed)
    return StaticOrder(rng.permutation(len(context.batch)))
