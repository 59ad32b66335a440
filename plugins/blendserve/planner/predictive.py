"""Model-predictive choice: simulate candidate admissions on the *estimated* output lengths, keep the fastest.

No one admission wins every job: the projected dual scan avoids preemptions
and feeds the compute side where compute decides the end (8B, density 1.4,
35% sharing), while a list admitted blindly keeps the KV fuller where memory
decides it. The planner cannot see true lengths, but it has the cost model,
the simulator and its own estimates, so it runs each candidate on the
estimates (known lengths exact, the rest the warm-up sampler's means) and
keeps the one predicted fastest. On jobs larger than ``sample_size``
requests a random subsample (the same for every candidate, so they compare
like for like) stands for the job.

The subsample must keep the job's *time structure*, not only its mix: a
long decode lasts as many steps whatever the job's size, so in a small
sample the ramp at the start and the long-decode tail at the end weigh far
more than in the job. Measured on the paper's 400k-request d1.4-s35 mix
(8B): a 40k subsample picked the dual scan (81.2% of T_opt in truth) over
the stratified blend (95.5%); the whole job, simulated on its estimates,
predicts both within 1.7 points (82.9% and 95.7%). So the default sample is
the paper's job size, 400k requests, and most jobs (and every shard of up to
400k requests) are simulated whole; the cost is about 0.5-1 s per 10k
requests for a list candidate and 2.5 s for the dual-scan controller, on
one core.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from blendserve.admission import AdmissionController, EngineState
from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel
from blendserve.planner.dual_scan import ScanItems

# A candidate builds a fresh controller for a set of scan items (the job's, or a subsample's) given their
# positions in the job's items (so a list computed once for the job can be restricted to the subsample).
Candidate = Callable[[ScanItems, np.ndarray], AdmissionController]


@dataclass
class Choice:
    name: str  # the candidate predicted fastest
    predicted_s: dict[str, float]  # simulated seconds of every candidate on the estimates (subsample's)
    sample: int  # requests simulated per candidate
    steps: dict[str, int]  # engine steps of every candidate's simulation

    def merged(self, other: Choice) -> Choice:
        """Both rounds' candidates, the fastest of all chosen (this round's on ties)."""
        predicted = {**self.predicted_s, **other.predicted_s}
        return Choice(min(predicted, key=predicted.get), predicted, self.sample, {**self.steps, **other.steps})


def subsample(batch: RequestBatch, items: ScanItems, estimates: np.ndarray, size: int, seed: int = 0,
              ) -> tuple[RequestBatch, ScanItems, np.ndarray, np.ndarray]:
    """A random ``size`` of the items, in their order, with their batch rows renumbered 0..size-1; and the
    kept positions."""
    if len(items.requests) <= size:
        return batch, items, estimates, np.arange(len(items.requests))
    keep = np.sort(np.random.default_rng(seed).choice(len(items.requests), size=size, replace=False))
    rows = items.requests[keep]
    renumbered = np.empty(len(rows), dtype=np.int64)
    renumbered[np.argsort(rows, kind="stable")] = np.arange(len(rows))
    sub_rows = np.sort(rows)
    sub = replace(
        items,
        requests=renumbered,
        group=items.group[keep],
        kv_charge=items.kv_charge[keep],
        output_est=None if items.output_est is None else items.output_est[keep],
        shared_prompt=None if items.shared_prompt is None else items.shared_prompt[keep],
    )
    return batch.take(sub_rows), sub, estimates[sub_rows], keep


class Predictor:
    """One job's (or its subsample's) simulations on the estimated lengths, candidate by candidate.

    The subsample is drawn once, so candidates chosen in several rounds
    (``Choice.merged``) are simulated on the same requests.
    """

    def __init__(self, batch: RequestBatch, items: ScanItems, estimates: np.ndarray, cost_model: CostModel,
                 kv_capacity_tokens: int, sample_size: int = 400_000, seed: int = 0) -> None:
        from blendserve.sim.simulator import SimConfig  # the simulator imports the planner's packages

        self.batch, self.items, sub_est, self.kept = subsample(batch, items, estimates, sample_size, seed)
        self.lengths = np.maximum(np.asarray(sub_est, dtype=np.int64), 1)  # what the simulated engine generates
        self.cost_model = cost_model
        self.config = SimConfig(kv_capacity_tokens=kv_capacity_tokens)

    def choose(self, candidates: dict[str, Candidate]) -> Choice:
        """The candidate whose simulated time is shortest (the first one on ties)."""
        from blendserve.sim.simulator import simulate

        runs = {name: simulate(self.batch, self.lengths, self.cost_model, make(self.items, self.kept), self.config)
                for name, make in candidates.items()}
        predicted = {name: run.total_time for name, run in runs.items()}
        return Choice(min(predicted, key=predicted.get), predicted, len(self.batch),
                      {name: run.steps for name, run in runs.items()})


def choose(
    batch: RequestBatch, items: ScanItems, estimates: np.ndarray, cost_model: CostModel, kv_capacity_tokens: int,
    candidates: dict[str, Candidate], sample_size: int = 400_000, seed: int = 0,
) -> Choice:
    """The candidate whose simulated time on the estimated lengths is shortest (the first one on ties)."""
    return Predictor(batch, items, estimates, cost_model, kv_capacity_tokens, sample_size, seed).choose(candidates)


class ChosenAdmission:
    """The chosen candidate's controller for the whole job, with what the choice saw.

    Delegates ``AdmissionController``; keeps the job's scan items (as the
    dual scan does) and the ``Choice`` for reports.
    """

    def __init__(self, controller: AdmissionController, items: ScanItems, choice: Choice) -> None:
        self.controller = controller  # the candidate predicted fastest, built for the whole job
        self.items = items  # the job's scan items the candidates were built from
        self.choice = choice  # every candidate's predicted time

    def next_request(self, state: EngineState) -> int | None:
        return self.controller.next_request(state)

    def on_progress(self, index: int, output_tokens: int) -> None:
        self.controller.on_progress(index, output_tokens)

    def on_finish(self, index: int, output_tokens: int) -> None:
        self.controller.on_finish(index, output_tokens)

    def remaining(self) -> int:
        return self.controller.remaining()
