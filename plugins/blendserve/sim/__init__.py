"""A step simulator of a continuous-batching engine, driven by the cost model."""

from blendserve.sim.simulator import SimConfig, SimResult, kv_capacity_tokens, simulate, step_overlap

__all__ = ["SimConfig", "SimResult", "kv_capacity_tokens", "simulate", "step_overlap"]
