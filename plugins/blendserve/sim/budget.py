"""The engine's per-step token budget: configured, or resource-aware from the cost model.

A throughput-tuned engine (NanoFlow, Sarathi-Serve's chunk sizing) picks the
prefill chunk so that a step's compute roughly matches its memory traffic:
with a budget far above that, every step that carries a prefill chunk is
compute-bound and the decodes running beside it advance one token per long
step, so memory-heavy requests fall into a memory-bound tail; far below it,
steps are memory-bound while compute idles. The same budget applies to every
admission policy, so comparisons stay like for like.
"""

from __future__ import annotations

from typing import Protocol

from blendserve.costmodel import CostModel, balanced_token_budget


class HasTokenBudget(Protocol):
    token_budget: int | None  # tokens per step; None: resource-aware


def token_budget(cost_model: CostModel, config: HasTokenBudget, capacity: int) -> int:
    """The step's token budget: the configured one, else the calibrated engine's (``HardwareSpec.token_budget``),
    else the resource-aware one for this KV capacity."""
    if config.token_budget is not None:
        return int(config.token_budget)
    if cost_model.hardware.token_budget is not None:
        return int(cost_model.hardware.token_budget)
    return balanced_token_budget(cost_model, capacity)
