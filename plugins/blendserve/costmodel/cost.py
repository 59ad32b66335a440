"""BlendServe's per-request and per-group cost: Comp, Mem, density, T = f(Comp, Mem).

Every function takes numpy arrays (or scalars) so the planner can cost a
million requests at once. F and B are the hardware's *effective* FLOP/s and
bytes/s (peak times the measured efficiency factors), so the same numbers
drive the planner's densities and the simulator's step times.

What density counts (see docs/COST_MODEL.md): Comp is the GEMM time of every
token the request puts through the model (2 P FLOPs a token); Mem is the time
to read the KV cache during generation (output step i reads p + i tokens).
Weight reads are a fixed cost of every engine step, shared by all requests in
it, so they are not part of a request's density (they are part of the
simulator's step time and of ``T_opt``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from blendserve.costmodel.hardware import HardwareSpec
from blendserve.costmodel.model_spec import ModelSpec

ArrayLike = np.ndarray | float | int


def kv_tokens_read(prompt_tokens: ArrayLike, output_tokens: ArrayLike) -> ArrayLike:
    """KV tokens read while decoding ``output_tokens`` after a prompt: step i reads p + i tokens."""
    p = np.asarray(prompt_tokens, dtype=np.float64)
    d = np.asarray(output_tokens, dtype=np.float64)
    return p * d + d * (d + 1.0) / 2.0


@dataclass(frozen=True)
class GroupCost:
    comp: float  # Comp_eff seconds: each distinct prompt token computed once, plus all outputs
    mem: float  # sum of Mem(r) seconds over the group
    density: float  # comp / mem


@dataclass(frozen=True)
class CostModel:
    model: ModelSpec
    hardware: HardwareSpec

    def comp_time(self, tokens: ArrayLike) -> ArrayLike:
        """Seconds of compute for ``tokens`` tokens through the model: 2 * tokens * P / F."""
        return 2.0 * np.asarray(tokens, dtype=np.float64) * self.model.num_params / self.hardware.flops

    def mem_time(self, prompt_tokens: ArrayLike, output_tokens: ArrayLike) -> ArrayLike:
        """Seconds of KV reads while decoding: step i reads p + i tokens of KV."""
        return kv_tokens_read(prompt_tokens, output_tokens) * self.model.kv_bytes_per_token / self.hardware.bandwidth

    def comp(self, prompt_tokens: ArrayLike, output_tokens: ArrayLike) -> ArrayLike:
        """Comp(r) of a request with no prefix sharing."""
        return self.comp_time(np.asarray(prompt_tokens) + np.asarray(output_tokens))

    def density(self, comp: ArrayLike, mem: ArrayLike) -> ArrayLike:
        """rho = Comp / Mem; above 1 compute-heavy, below 1 memory-heavy (inf when Mem = 0)."""
        comp = np.asarray(comp, dtype=np.float64)
        mem = np.asarray(mem, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(mem > 0, comp / np.where(mem > 0, mem, 1.0), np.inf)

    def request_density(self, prompt_tokens: ArrayLike, output_tokens: ArrayLike) -> ArrayLike:
        """rho(r) of each request on its own (no sharing)."""
        return self.density(self.comp(prompt_tokens, output_tokens), self.mem_time(prompt_tokens, output_tokens))

    def group_cost(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray, unique_prompt_tokens: int) -> GroupCost:
        """Cost of a group whose distinct prompt tokens (shared prefixes once) number ``unique_prompt_tokens``."""
        comp = float(self.comp_time(unique_prompt_tokens + np.sum(output_tokens, dtype=np.float64)))
        mem = float(np.sum(self.mem_time(prompt_tokens, output_tokens)))
        return GroupCost(comp, mem, float(self.density(comp, mem)))

    def kv_read_time(self, kv_tokens: ArrayLike) -> ArrayLike:
        """Seconds to read ``kv_tokens`` tokens of KV cache."""
        return np.asarray(kv_tokens, dtype=np.float64) * self.model.kv_bytes_per_token / self.hardware.bandwidth

    @property
    def weight_read_time(self) -> float:
        """Seconds to stream all weights once: the memory floor of every engine step."""
        return self.model.weight_bytes / self.hardware.bandwidth

    def attention_comp_time(self, query_tokens: ArrayLike, context_end: ArrayLike) -> ArrayLike:
        """Attention FLOP time (QK^T and AV) of ``query_tokens`` new tokens ending at ``context_end``.

        Causal: the new tokens attend on average to ``context_end - (query_tokens - 1) / 2``
        positions; 4 FLOPs per position per head dimension per layer.
        """
        q = np.asarray(query_tokens, dtype=np.float64)
        mean_ctx = np.asarray(context_end, dtype=np.float64) - (q - 1.0) / 2.0
        width = self.model.num_heads * self.model.head_dim * self.model.num_layers
        return 4.0 * q * mean_ctx * width / self.hardware.flops


def combine(t_comp: ArrayLike, t_mem: ArrayLike, overlap: str = "max") -> ArrayLike:
    """Time of a set of work: f = max (perfect overlap) or f = sum (none); vectorized."""
    f: Callable[[ArrayLike, ArrayLike], ArrayLike] = OVERLAPS[overlap]
    out = f(np.asarray(t_comp, dtype=np.float64), np.asarray(t_mem, dtype=np.float64))
    return float(out) if np.ndim(out) == 0 else out


OVERLAPS: dict[str, Callable[[ArrayLike, ArrayLike], ArrayLike]] = {"max": np.maximum, "sum": np.add}


def balanced_token_budget(cost_model: CostModel, kv_capacity_tokens: float) -> int:
    """Tokens per step whose compute equals the step's memory floor with a full KV cache.

    A step streams the weights once and reads the KV of every running
    sequence; with the cache full that is ``weight_read + K * kv_read``.
    Putting as many tokens through the model as that time computes makes a
    full step balanced (compute = memory), the point where a NanoFlow-style
    engine overlaps both. Never below 1 token.
    """
    memory = cost_model.weight_read_time + float(cost_model.kv_read_time(max(kv_capacity_tokens, 0.0)))
    return max(int(round(memory / float(cost_model.comp_time(1)))), 1)
