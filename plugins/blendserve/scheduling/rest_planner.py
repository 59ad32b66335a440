"""What plans the rest of a shard: the estimates learnt so far, and the policy's view of the requests left.

``WarmupController`` (``scheduling.warmup``) asks a ``RestPlanner`` for
estimates from what it has seen and for the plan of the requests not yet
admitted. ``BatchPlanner`` is the simulator's and the benches' planner over
one batch; a shard's run has its own over the engine's indices
(``pipeline.shard``). Both give the policy ``rest_context``: the estimates'
means and ``DRAWS`` resamples of the lengths they leave uncertain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel
from blendserve.planner.prefix_tree import PrefixTree
from blendserve.sampling.estimator import Estimates, draw_outputs, estimates_from
from blendserve.scheduling.admission import AdmissionController
from blendserve.scheduling.registry import PolicyContext, make_controller

# Draws of the unknown lengths (``estimator.draw_outputs``) a plan is tried under besides the estimates'
# means: ``PolicyContext.output_draws``.
DRAWS = 3


@dataclass(frozen=True)
class RunningPlan:
    """What a re-plan is measured against: the plan running now, over the rest."""

    order: np.ndarray  # positions in the rest, in the order the running plan would admit them (``choice.KEEP``)
    candidate: str | None  # the choice's candidate it was made from; None: a plan no choice made


class RestPlanner(Protocol):
    """What a ``WarmupController`` learns and plans with: it knows the lengths, the planner the requests."""

    def estimate(self, observed: dict[int, float], running: dict[int, int]) -> Estimates:
        """Estimates for every request, from the lengths observed so far (index -> tokens; expected ones for
        requests still running, whose tokens so far are in ``running``)."""
        ...

    def plan(self, rest: np.ndarray, estimates: Estimates, lists_only: bool, policy: str | None = None,
             keep: RunningPlan | None = None) -> AdmissionController:
        """The policy (``policy``, else the planner's own) over ``rest`` (request indices) on ``estimates``; its
        indices are positions in ``rest``. ``lists_only``: it must admit a fixed list (``PolicyContext.lists_only``).
        ``keep``: a re-plan's running plan over ``rest`` (``PolicyContext.keep_order`` and ``keep_candidate``)."""
        ...


def rest_context(batch: RequestBatch, estimates: Estimates, cost_model: CostModel, kv_capacity_tokens: int,
                 seed: int = 0, lists_only: bool = False, keep: RunningPlan | None = None) -> PolicyContext:
    """The policy's view of the requests left to plan (``estimates`` row by row with ``batch``): the means, and
    ``DRAWS`` resamples of the lengths they leave uncertain; for a re-plan, the running plan (``keep``)."""
    return PolicyContext(batch, estimates.mean, cost_model, kv_capacity_tokens, seed, lists_only,
                         output_draws=tuple(draw_outputs(estimates, DRAWS, seed)),
                         keep_order=None if keep is None else keep.order,
                         keep_candidate=None if keep is None else keep.candidate)


class BatchPlanner:
    """``RestPlanner`` over a whole batch: estimates from its prefix tree, ``policy`` over the rest."""

    def __init__(self, batch: RequestBatch, tree: PrefixTree, cost_model: CostModel, kv_capacity_tokens: int,
                 policy: str, seed: int = 0) -> None:
        self.batch, self.tree, self.cost_model = batch, tree, cost_model
        self.kv_capacity_tokens, self.policy, self.seed = kv_capacity_tokens, policy, seed

    def estimate(self, observed: dict[int, float], running: dict[int, int]) -> Estimates:
        return estimates_from(self.batch, self.tree, observed, running)

    def context(self, rest: np.ndarray, estimates: Estimates, lists_only: bool, keep: RunningPlan | None = None,
                ) -> PolicyContext:
        """What ``policy`` plans ``rest`` on (``rest_context``)."""
        return rest_context(self.batch.take(rest), estimates.take(rest), self.cost_model, self.kv_capacity_tokens,
                            self.seed, lists_only, keep)

    def plan(self, rest: np.ndarray, estimates: Estimates, lists_only: bool, policy: str | None = None,
             keep: RunningPlan | None = None) -> AdmissionController:
        return make_controller(policy or self.policy, self.context(rest, estimates, lists_only, keep))
