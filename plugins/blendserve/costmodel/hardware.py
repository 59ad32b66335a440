"""Accelerator specs as data: peak compute, bandwidth, memory, measured efficiency."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    peak_flops: float  # dense bf16 FLOP/s of one device
    mem_bandwidth: float  # HBM bytes/s of one device
    mem_bytes: float  # device memory in bytes
    flops_efficiency: float = 1.0  # achieved / peak for large GEMMs (measured)
    bandwidth_efficiency: float = 1.0  # achieved / peak for KV reads (measured)
    tp: int = 1  # tensor-parallel degree: F, B and memory scale with it

    @property
    def flops(self) -> float:
        """Effective FLOP/s of the whole tensor-parallel group."""
        return self.peak_flops * self.flops_efficiency * self.tp

    @property
    def bandwidth(self) -> float:
        """Effective bytes/s of the whole tensor-parallel group."""
        return self.mem_bandwidth * self.bandwidth_efficiency * self.tp

    @property
    def total_mem_bytes(self) -> float:
        return self.mem_bytes * self.tp

    def with_tp(self, tp: int) -> "HardwareSpec":
        return replace(self, tp=tp)


HARDWARE: dict[str, HardwareSpec] = {
    "a100-80g": HardwareSpec("a100-80g", 312e12, 2.039e12, 80e9),
}


def get_hardware(name: str, tp: int = 1) -> HardwareSpec:
    key = name.lower()
    if key not in HARDWARE:
        raise KeyError(f"unknown hardware {name!r}; known: {sorted(HARDWARE)}")
    return HARDWARE[key].with_tp(tp)
