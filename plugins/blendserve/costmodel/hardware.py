"""Accelerator specs as data: peak compute, bandwidth, memory, measured efficiency.

Peak figures are the vendors' dense bf16 tensor-core FLOP/s and HBM/GDDR
bandwidth; memory is what the driver reports. Efficiency factors turn peaks
into what kernels achieve: for the A100 they are fitted to the per-layer
measurements the BlendServe paper published (``calibration.PAPER_A100_LLAMA3_8B``);
for the other GPUs no measurement is available here, so they borrow the A100's
fit and say so in ``efficiency_source``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

GIB = float(1 << 30)

# Least-squares fit (relative errors) of peak-time / measured-time over the
# paper's three GEMM and three decode-attention cases; see docs/COST_MODEL.md.
A100_FLOPS_EFFICIENCY = 0.69
A100_BANDWIDTH_EFFICIENCY = 0.82
A100_FIT = "fit to BlendServe's per-layer measurements (Llama-3-8B, one A100-80G)"
BORROWED = "not measured here: the A100 fit, assumed to carry over"


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    peak_flops: float  # dense bf16 FLOP/s of one device
    mem_bandwidth: float  # HBM bytes/s of one device
    mem_bytes: float  # device memory in bytes
    flops_efficiency: float = 1.0  # achieved / peak for large GEMMs (measured)
    bandwidth_efficiency: float = 1.0  # achieved / peak for KV reads (measured)
    tp: int = 1  # tensor-parallel degree: F, B and memory scale with it
    tp_efficiency: float = 1.0  # share of linear speed-up kept per doubling of tp (all-reduce cost)
    efficiency_source: str = "peak"  # where the efficiency factors come from
    # seconds every engine step pays beyond its compute and memory (scheduling, sampling, Python):
    # measured on CPUs by ``blendserve calibrate``; 0 for the catalog GPUs, whose kernels dominate
    step_overhead: float = 0.0
    overlap: str = "max"  # how a step combines compute and memory time on this device: "max" or "sum"
    # tokens per step of the engine a calibrated profile was measured on (vLLM's max_num_batched_tokens):
    # its steps are only costed right at that budget; None (the catalog GPUs): resource-aware (sim.budget)
    token_budget: int | None = None
    # KV block in tokens of the engine a calibrated profile was measured on (vLLM-CPU: 128): prefix hits
    # are whole blocks; None (the catalog GPUs): the simulator's default, vLLM's 16 on GPUs
    block_size: int | None = None
    # whether steps count attention's FLOPs (QK^T, AV): a calibrated profile does (on a CPU they are a
    # tenth or more of a long prompt's prefill); the catalog GPUs do not, as the paper's model
    attention_flops: bool = False

    @property
    def tp_scale(self) -> float:
        """Speed-up of the tensor-parallel group over one device: tp * tp_efficiency ** log2(tp)."""
        return self.tp * self.tp_efficiency ** math.log2(self.tp)

    @property
    def flops(self) -> float:
        """Effective FLOP/s of the whole tensor-parallel group."""
        return self.peak_flops * self.flops_efficiency * self.tp_scale

    @property
    def bandwidth(self) -> float:
        """Effective bytes/s of the whole tensor-parallel group."""
        return self.mem_bandwidth * self.bandwidth_efficiency * self.tp_scale

    @property
    def total_mem_bytes(self) -> float:
        return self.mem_bytes * self.tp

    def with_tp(self, tp: int) -> "HardwareSpec":
        if tp < 1 or tp & (tp - 1):
            raise ValueError(f"tensor-parallel degree must be a power of two, got {tp}")
        return replace(self, tp=tp)


def _gpu(name: str, tflops: float, tbps: float, gib: float, tp_eff: float, source: str = BORROWED) -> HardwareSpec:
    return HardwareSpec(
        name, tflops * 1e12, tbps * 1e12, gib * GIB,
        A100_FLOPS_EFFICIENCY, A100_BANDWIDTH_EFFICIENCY, 1, tp_eff, source,
    )


# tp_efficiency: NVLink parts lose little to all-reduce; the PCIe-only L40S more
# (assumed values, not measured here).
HARDWARE: dict[str, HardwareSpec] = {
    "a100-80g": _gpu("a100-80g", 312.0, 2.039, 80.0, 0.95, A100_FIT),  # A100 SXM4 80 GB
    "h100-sxm": _gpu("h100-sxm", 989.4, 3.35, 80.0, 0.95),
    "h200": _gpu("h200", 989.4, 4.8, 140.4, 0.95),  # 141 GB HBM3e, 143,771 MiB usable
    "l40s": _gpu("l40s", 362.05, 0.864, 45.0, 0.85),  # 48 GB GDDR6, 46,068 MiB usable
}
ALIASES = {"a100": "a100-80g", "a100-80g-sxm": "a100-80g", "h100": "h100-sxm"}


def get_hardware(name: str, tp: int = 1) -> HardwareSpec:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in HARDWARE:
        raise KeyError(f"unknown hardware {name!r}; known: {sorted(HARDWARE)}")
    return HARDWARE[key].with_tp(tp)
