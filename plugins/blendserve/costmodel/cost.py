"""BlendServe's per-request and per-group cost: Comp, Mem, density, T = f(Comp, Mem).

Every function takes numpy arrays (or scalars) so the planner can cost a
million requests at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from blendserve.costmodel.hardware import HardwareSpec
from blendserve.costmodel.model_spec import ModelSpec

ArrayLike = np.ndarray | float | int


@dataclass(frozen=True)
class CostModel:
    model: ModelSpec
    hardware: HardwareSpec

    def comp_time(self, tokens: ArrayLike) -> ArrayLike:
        """Seconds of compute for ``tokens`` tokens through the model: 2 * tokens * P / F."""
        return 2.0 * np.asarray(tokens, dtype=np.float64) * self.model.num_params / self.hardware.flops

    def mem_time(self, prompt_tokens: ArrayLike, output_tokens: ArrayLike) -> ArrayLike:
        """Seconds of KV reads while decoding: step i reads p + i tokens of KV."""
        p = np.asarray(prompt_tokens, dtype=np.float64)
        d = np.asarray(output_tokens, dtype=np.float64)
        kv_tokens_read = p * d + d * (d + 1.0) / 2.0
        return kv_tokens_read * self.model.kv_bytes_per_token / self.hardware.bandwidth

    def comp(self, prompt_tokens: ArrayLike, output_tokens: ArrayLike) -> ArrayLike:
        """Comp(r) of a request with no prefix sharing."""
        return self.comp_time(np.asarray(prompt_tokens) + np.asarray(output_tokens))

    def density(self, comp: ArrayLike, mem: ArrayLike) -> ArrayLike:
        """rho = Comp / Mem; above 1 compute-heavy, below 1 memory-heavy (inf when Mem = 0)."""
        comp = np.asarray(comp, dtype=np.float64)
        mem = np.asarray(mem, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(mem > 0, comp / np.where(mem > 0, mem, 1.0), np.inf)


def combine(t_comp: float, t_mem: float, overlap: str = "max") -> float:
    """Time of a set of work: f = max (perfect overlap) or f = sum (none)."""
    f: Callable[[float, float], float] = max if overlap == "max" else (lambda a, b: a + b)
    return float(f(t_comp, t_mem))
