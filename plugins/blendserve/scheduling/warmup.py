"""One engine run with the warm-up inside it: samples first, fillers while they run, then the plan.

Running the sample as a separate phase leaves the engine mostly idle: a 1%
sample is too small to fill a batch, and the phase lasts as long as its
longest answer. Here the sampled requests are admitted first and the
engine's spare room is filled with other requests in a seeded random order
(a blend, like the ``balance`` policy); as soon as every sampled request has
finished, ``plan`` turns their observed lengths into a controller for the
requests not admitted yet, and admission continues from it. Each request is
admitted exactly once, so nothing runs twice.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel
from blendserve.planner.prefix_tree import PrefixTree
from blendserve.sampling.estimator import estimate_outputs
from blendserve.scheduling.admission import AdmissionController, EngineState, StaticOrder
from blendserve.scheduling.registry import PolicyContext, make_controller

# (requests still to run, sampled requests, their observed lengths) -> a controller whose
# indices are positions in the first array.
RestPlanner = Callable[[np.ndarray, np.ndarray, np.ndarray], AdmissionController]


class WarmupController:
    """Implements ``blendserve.scheduling.admission.AdmissionController`` over the whole batch."""

    def __init__(self, sampled: np.ndarray, others: np.ndarray, plan: RestPlanner, seed: int = 0) -> None:
        self.sampled = np.asarray(sampled, dtype=np.int64)
        self.fillers = np.random.default_rng(seed).permutation(np.asarray(others, dtype=np.int64))
        self.plan = plan
        self.observed: dict[int, int] = {}  # sampled index -> output tokens, filled by on_finish
        self._is_sample = set(self.sampled.tolist())
        self._next_sample = 0  # samples admitted so far
        self._next_filler = 0  # fillers admitted so far (they run unplanned, before the plan exists)
        self.inner: AdmissionController | None = None  # the plan's controller, once every sample is back
        self._rest = np.zeros(0, dtype=np.int64)  # batch index of each inner position
        self._inner_of: dict[int, int] = {}  # batch index -> inner position, for reports back

    def next_request(self, state: EngineState) -> int | None:
        if self._next_sample < len(self.sampled):
            self._next_sample += 1
            return int(self.sampled[self._next_sample - 1])
        if self.inner is None and len(self.observed) == len(self.sampled):
            self._make_plan()
        if self.inner is None:
            if self._next_filler >= len(self.fillers):
                return None
            self._next_filler += 1
            return int(self.fillers[self._next_filler - 1])
        picked = self.inner.next_request(state)
        return None if picked is None else int(self._rest[picked])

    def _make_plan(self) -> None:
        self._rest = np.sort(self.fillers[self._next_filler :])
        observed = np.array([self.observed[int(i)] for i in self.sampled], dtype=np.int64)
        # Everything may have run already (a 100% sample, or fillers took the rest): nothing to plan.
        self.inner = self.plan(self._rest, self.sampled, observed) if len(self._rest) else StaticOrder([])
        self._inner_of = {int(b): k for k, b in enumerate(self._rest)}

    def on_progress(self, index: int, output_tokens: int) -> None:
        if self.inner is not None and index in self._inner_of:
            self.inner.on_progress(self._inner_of[index], output_tokens)

    def on_finish(self, index: int, output_tokens: int) -> None:
        if index in self._is_sample:
            self.observed[index] = int(output_tokens)
        elif self.inner is not None and index in self._inner_of:
            self.inner.on_finish(self._inner_of[index], output_tokens)

    def remaining(self) -> int:
        left = len(self.sampled) - self._next_sample
        if self.inner is None:
            return left + len(self.fillers) - self._next_filler
        return left + self.inner.remaining()

    @property
    def unplanned(self) -> int:
        """Requests admitted as fillers, before the plan existed."""
        return self._next_filler


def warmup_controller(
    batch: RequestBatch,
    tree: PrefixTree,
    sampled: np.ndarray,
    cost_model: CostModel,
    kv_capacity_tokens: int,
    policy: str = "blendserve",
    seed: int = 0,
) -> WarmupController:
    """A ``WarmupController`` over ``batch`` whose plan is ``policy`` with estimates from the sample.

    ``tree`` is the batch's prefix tree, ``sampled`` its warm-up sample.
    Duplicates of sampled inferences must already be out of ``batch``
    (``split_warmup(...).fanned``): their answer is the sample's.
    """

    others = np.setdiff1d(np.arange(len(batch)), sampled)

    def plan(rest: np.ndarray, sampled_idx: np.ndarray, observed: np.ndarray) -> AdmissionController:
        estimates = estimate_outputs(batch, tree, sampled_idx, observed)
        context = PolicyContext(batch.take(rest), estimates.mean[rest], cost_model, kv_capacity_tokens, seed)
        return make_controller(policy, context)

    return WarmupController(sampled, others, plan, seed)
