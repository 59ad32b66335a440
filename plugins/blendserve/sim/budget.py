"""The engine's per-step token budget, KV block and attention costing: configured, the calibrated engine's,
or defaults.

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


DEFAULT_BLOCK_SIZE = 16  # vLLM's KV block on GPUs


class HasTokenBudget(Protocol):
    token_budget: int | None  # tokens per step; None: resource-aware


class HasBlockSize(Protocol):
    block_size: int | None  # KV block in tokens; None: the calibrated engine's, else DEFAULT_BLOCK_SIZE


class HasAttentionFlops(Protocol):
    attention_flops: bool | None  # count attention FLOPs; None: as the hardware was fitted


def token_budget(cost_model: CostModel, config: HasTokenBudget, capacity: int) -> int:
    """The step's token budget: the configured one, else the calibrated engine's (``HardwareSpec.token_budget``),
    else the resource-aware one for this KV capacity."""
    if config.token_budget is not None:
        return int(config.token_budget)
    if cost_model.hardware.token_budget is not None:
        return int(cost_model.hardware.token_budget)
    return balanced_token_budget(cost_model, capacity)


def block_size(cost_model: CostModel, config: HasBlockSize) -> int:
    """The KV block prefix hits are counted in: the configured one, else the calibrated engine's
    (``HardwareSpec.block_size``: vLLM-CPU's 128 would hit 8x coarser than a GPU's 16), else 16."""
    if config.block_size is not None:
        return int(config.block_size)
    return int(cost_model.hardware.block_size or DEFAULT_BLOCK_SIZE)


def counts_attention(cost_model: CostModel, config: HasAttentionFlops) -> bool:
    """Whether steps count attention's FLOPs: as configured, else as the hardware was fitted."""
    return cost_model.hardware.attention_flops if config.attention_flops is None else bool(config.attention_flops)
