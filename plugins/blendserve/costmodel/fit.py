"""Fit a HardwareSpec to measured batch times: the simulator's own step formula, end to end.

Each measured batch (prompts, the output lengths the engine really produced,
its wall seconds) is replayed through the simulator with the engine's
settings; F (FLOP/s), B (bytes/s) and the per-step overhead are chosen so the
simulated seconds match the measured ones (least squares on relative
errors), once with f = max and once with f = sum; the better fit is kept.
Fitting whole batches through the simulator fits exactly what predictions
are made of (scheduling, chunked prefill, decode runs), and works for every
engine, including those that report no per-step counters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blendserve.batch import RequestBatch
from blendserve.costmodel.cost import CostModel
from blendserve.costmodel.hardware import HardwareSpec
from blendserve.costmodel.model_spec import ModelSpec
from blendserve.scheduling.admission import StaticOrder
from blendserve.sim import simulate

GB = 1e9
# starting points in fit units (s per token of compute, s per GB read, s per step): a CPU, a fast CPU, a GPU
STARTS = ((1e-4, 0.1, 1e-2), (1e-5, 0.02, 1e-3), (1e-7, 5e-4, 1e-4))


@dataclass
class Measured:
    batch: RequestBatch  # the prompts that ran
    outputs: np.ndarray  # (n,) output tokens the engine produced
    seconds: float  # wall seconds the engine took for the batch
    label: str = ""  # e.g. "n=8 p=512 d=64", for the printout


@dataclass
class Fit:
    hardware: HardwareSpec  # the fitted device: F, B, step_overhead, overlap
    predicted: np.ndarray  # (batches,) simulated seconds on the fitted device
    measured: np.ndarray  # (batches,) measured seconds

    @property
    def errors(self) -> np.ndarray:
        return self.predicted / self.measured - 1.0

    @property
    def median_error(self) -> float:
        return float(np.median(np.abs(self.errors)))


def device(name: str, model: ModelSpec, x: np.ndarray, overlap: str, mem_bytes: float, sim) -> HardwareSpec:  # type: ignore[no-untyped-def]
    """The HardwareSpec of fit units ``x`` = (s per token, s per GB, s per step) for ``model``, keeping the
    token budget, KV block and attention costing the engine was measured and fitted with (``sim``: its SimConfig)."""
    return HardwareSpec(name, peak_flops=float(2.0 * model.num_params / x[0]), mem_bandwidth=float(GB / x[1]),
                        mem_bytes=mem_bytes, efficiency_source="calibrated on this machine (blendserve calibrate)",
                        step_overhead=float(x[2]), overlap=overlap, token_budget=sim.token_budget,
                        block_size=sim.block_size, attention_flops=bool(sim.attention_flops))


def simulated_seconds(runs: list[Measured], cost: CostModel, sim) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Seconds of each batch through the simulator (``sim``: a SimConfig), admitted in batch order."""
    return np.array([simulate(r.batch, r.outputs, cost, StaticOrder(np.arange(len(r.batch))), sim).total_time
                     for r in runs])


def fit_hardware(runs: list[Measured], model: ModelSpec, sim, name: str,  # type: ignore[no-untyped-def]
                 mem_bytes: float = 0.0) -> Fit:
    """The device whose simulated batch seconds best match ``runs`` (``sim``: the engine's SimConfig, whose
    token budget and KV block the device keeps: its steps were measured at that budget, its hits in those blocks)."""
    from scipy.optimize import least_squares  # heavy, and only calibration needs it

    measured = np.array([r.seconds for r in runs], dtype=np.float64)
    best: Fit | None = None
    for overlap in ("max", "sum"):
        def residuals(log_x: np.ndarray) -> np.ndarray:
            hw = device(name, model, np.exp(log_x), overlap, mem_bytes, sim)
            return simulated_seconds(runs, CostModel(model, hw), sim) / measured - 1.0

        for start in STARTS:
            # log units keep every constant positive and let one step size fit values 1e-7..1
            result = least_squares(residuals, np.log(start), diff_step=1e-3,
                                   max_nfev=60)
            hw = device(name, model, np.exp(result.x), overlap, mem_bytes, sim)
            fit = Fit(hw, simulated_seconds(runs, CostModel(model, hw), sim), measured)
            if best is None or _score(fit) < _score(best):
                best = fit
    assert best is not None
    return best


def _score(fit: Fit) -> float:
    """Mean squared relative error: what least squares minimized, comparable across overlaps and starts."""
    return float(np.mean(fit.errors**2))
