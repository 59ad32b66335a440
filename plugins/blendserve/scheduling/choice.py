"""BlendServe's choice: simulate each candidate admission on the *estimated* lengths, keep the fastest blend.

No one admission wins every job: the projected dual scan avoids preemptions
and feeds the compute side where compute decides the end, while a stratified
blend admitted blindly keeps the KV fuller where memory decides it. The
planner cannot see true lengths, but it has the cost model, the simulator
and its own estimates, so ``blendserve`` builds every candidate
(``first_candidates``, then ``deadline_candidates``) over the same scan items, simulates each on the estimates
(known lengths exact, the rest the warm-up sampler's draws) and runs the one
predicted fastest: on drawn lengths a stratified blend unless another
candidate is faster on every draw, and the input or a random order only if it
is clearly faster (``pick``). A re-plan (``warmup.REPLAN_AT``) also offers the
plan running now (``KEEP``) and keeps it unless another is predicted clearly
faster (``pick_replan``). Jobs larger than ``SAMPLE_SIZE`` requests are simulated on
a random subsample (the same for every candidate); why the sample must be
that large, and what the choice costs, is measured in docs/PLANNER_NOTES.md
("model-predictive choice and the stratified blend").

One candidate alone is a policy of its own for benchmarks: ``blendserve[spread]``
(``single_candidate``); the registry lists which.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Collection

import numpy as np

from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel
from blendserve.planner.groups import leaf_groups
from blendserve.planner.items import ScanItems, ordered_leaves, scan_items
from blendserve.planner.prefix_tree import PrefixTree
from blendserve.scheduling.admission import AdmissionController, Delegating, StaticOrder
from blendserve.scheduling.baselines import prefix_tree
from blendserve.scheduling.blend import spread_keys, unit_cuts
from blendserve.scheduling.dual_scan import static_dual_scan_order
from blendserve.scheduling.dual_scan_projected import ProjectedDualScan
from blendserve.scheduling.registry import PolicyContext
from blendserve.sim.simulator import SimConfig, simulate

# A candidate builds a fresh controller for a set of scan items (the job's, or a subsample's) given their
# positions in the job's items (so a list computed once for the job can be restricted to the subsample).
Candidate = Callable[[ScanItems, np.ndarray], AdmissionController]

# Requests simulated per candidate at most: the paper's job size, so most jobs (and every shard of up to
# 400k requests) are simulated whole; a smaller sample misjudges the ramp and the long-decode tail.
SAMPLE_SIZE = 400_000


@dataclass
class Choice:
    name: str  # the candidate chosen (``pick``)
    sample: int  # requests simulated per candidate
    steps: dict[str, int]  # engine steps of every candidate's simulation (mean over the scenarios)
    scenario_s: dict[str, tuple[float, ...]]  # every candidate's simulated seconds per scenario (subsample's)

    @property
    def predicted_s(self) -> dict[str, float]:
        """Every candidate's mean time over the scenarios."""
        return {name: float(np.mean(t)) for name, t in self.scenario_s.items()}

    @property
    def simulated_steps(self) -> int:
        """Engine steps simulated for the choice, every candidate on every scenario (with the requests, its cost)."""
        return sum(self.steps[name] * len(t) for name, t in self.scenario_s.items())

    @property
    def simulated_requests(self) -> int:
        """Requests simulated for the choice: the sample once per candidate and scenario."""
        return self.sample * sum(len(t) for t in self.scenario_s.values())

    @property
    def worst_s(self) -> dict[str, float]:
        """Every candidate's slowest scenario."""
        return {name: max(t) for name, t in self.scenario_s.items()}

    @property
    def scenarios(self) -> int:
        """Length vectors each candidate was simulated on: the means, or the estimates' draws."""
        return max((len(t) for t in self.scenario_s.values()), default=1)

    def merged(self, other: Choice, prefer: Collection[str] = ()) -> Choice:
        """Both rounds' candidates, one chosen from all of them (``pick``)."""
        times = {**self.scenario_s, **other.scenario_s}
        return Choice(pick(times, prefer), self.sample, {**self.steps, **other.steps}, times)


# The input order and a random one: what blendserve must never lose to, offered among its candidates.
BASELINES = frozenset({"fcfs", "balance"})
# A lead the prediction can be trusted with. A re-plan switches from ``KEEP``, and a pick takes a baseline,
# only if that candidate is predicted this much faster; a smaller lead is within what the
# prediction misses. At 40k (8B, rare-1 seed 1) a re-plan's lead of 0.85% (faster on all three draws) ran 0.2%
# slower; leads of 1.5-5.7% ran 1.1-2.1% faster (docs/PLANNER_NOTES.md, twenty-second).
CLEAR_GAIN = 0.01


def pick(scenario_s: dict[str, tuple[float, ...]], prefer: Collection[str] = ()) -> str:
    """blendserve's own pick (``rank``) among its candidates; a baseline (``BASELINES``) instead only if
    ``rank`` takes it among them all and it is predicted ``CLEAR_GAIN`` faster on the scenarios' mean.

    The baselines are a safety net, taken when clearly faster: by less, a lead is within what the prediction
    misses, and they give up the prefix sharing. On known lengths the 70B 400k d0.9-s5 job's input order,
    predicted 0.13% ahead of deadline-1, ran 0.05% ahead with a third less sharing (docs/PLANNER_NOTES.md,
    twenty-ninth). Over draws a baseline must also be faster on every draw than the preferred blend (``rank``).
    """
    own = {name: t for name, t in scenario_s.items() if name not in BASELINES} or scenario_s
    chosen, overall = rank(own, prefer), rank(scenario_s, prefer)
    clearly_faster = np.mean(scenario_s[overall]) < (1.0 - CLEAR_GAIN) * np.mean(scenario_s[chosen])
    return overall if clearly_faster else chosen


def rank(scenario_s: dict[str, tuple[float, ...]], prefer: Collection[str] = ()) -> str:
    """The candidate with the shortest mean time; over several scenarios, the fastest of ``prefer`` unless
    another candidate is faster on every scenario (the first one on ties).

    Over draws of uncertain lengths, candidates whose means differ by less than the draws' spread are a
    coin toss: on the 8B d1.4-s5 mix (20k, lengths hidden) a random order was predicted 0.2% ahead of
    the blends and ran 5.5% behind them on the rest's true lengths (docs/PLANNER_NOTES.md).
    """
    mean = {name: float(np.mean(t)) for name, t in scenario_s.items()}
    fastest = min(mean, key=mean.get)
    favoured = [name for name in mean if name in prefer]
    if not favoured or max(len(t) for t in scenario_s.values()) < 2:
        return fastest
    best = min(favoured, key=mean.get)
    beats = [name for name in mean if name not in prefer
             and all(a < b for a, b in zip(scenario_s[name], scenario_s[best]))]
    return min(beats, key=mean.get) if beats else best


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

    With ``draws`` (``PolicyContext.output_draws``) each candidate is
    simulated on every draw instead of the means and scored by its mean time:
    means make every request of a subtree alike, which flatters an order that
    blends them, while a draw keeps the long and the short answers the samples
    saw. The subsample is drawn once, so candidates chosen in several rounds
    (``Choice.merged``) are simulated on the same requests.
    """

    def __init__(self, batch: RequestBatch, items: ScanItems, estimates: np.ndarray, cost_model: CostModel,
                 kv_capacity_tokens: int, sample_size: int = SAMPLE_SIZE, seed: int = 0,
                 draws: tuple[np.ndarray, ...] = ()) -> None:
        scenarios = np.stack([np.asarray(v, dtype=np.int64) for v in (draws or (estimates,))], axis=1)
        self.batch, self.items, sub, self.kept = subsample(batch, items, scenarios, sample_size, seed)
        self.lengths = np.maximum(sub, 1)  # (sample, scenarios): what the simulated engine generates
        self.cost_model = cost_model
        self.config = SimConfig(kv_capacity_tokens=kv_capacity_tokens)

    def choose(self, candidates: dict[str, Candidate], prefer: Collection[str] = ()) -> Choice:
        """Every candidate simulated on every scenario, one chosen (``pick``)."""
        times: dict[str, tuple[float, ...]] = {}
        steps: dict[str, int] = {}
        for name, make in candidates.items():
            runs = [simulate(self.batch, self.lengths[:, j], self.cost_model, make(self.items, self.kept), self.config)
                    for j in range(self.lengths.shape[1])]
            times[name] = tuple(run.total_time for run in runs)
            steps[name] = int(np.mean([run.steps for run in runs]))
        return Choice(pick(times, prefer), len(self.batch), steps, times)


class ChosenAdmission(Delegating):
    """The chosen candidate's controller for the whole job, with what the choice saw."""

    def __init__(self, controller: AdmissionController, items: ScanItems, choice: Choice) -> None:
        self.controller = controller  # the chosen candidate (``pick``), built for the whole job
        self.items = items  # the job's scan items the candidates were built from
        self.choice = choice  # every candidate's predicted time


# Lead of the memory-heavy strata in the fixed-lead stratified blend; its simulated steps time the
# deadline candidates.
SPREAD_LEAD = 0.05
SPREAD = f"spread-{SPREAD_LEAD:g}"  # its candidate's name
# Deadline factors of the deadline candidates (``blend.spread_keys``: a stratum leads by factor x its
# longest decode / the run's steps).
DEADLINES = (0.5, 0.8, 1.0)


def deadline_name(factor: float) -> str:
    """The deadline candidate's name for ``factor``."""
    return f"deadline-{factor:g}"


# The stratified blends: what ``pick`` keeps unless another candidate is faster on every draw.
BLENDS = frozenset({SPREAD, *map(deadline_name, DEADLINES)})
# A re-plan's candidate: the plan running now, over the rest (``PolicyContext.keep_order``).
KEEP = "keep"


def pick_replan(scenario_s: dict[str, tuple[float, ...]], gain: float = CLEAR_GAIN, running: str | None = None) -> str:
    """A re-plan's pick: ``KEEP`` unless the candidate ``pick`` prefers among the others is faster by ``gain``
    on the scenarios' mean and is not ``running``, the candidate the running plan was made from.

    Re-made on the new estimates, the running candidate is judged on draws of the estimates its own keys were
    cut from, which ``KEEP`` was not: of ten 8B seed runs that switched to it, eight ran slower (+0.60% on
    average), while eleven that switched to another candidate ran 1.32% faster (docs/PLANNER_NOTES.md,
    twenty-third)."""
    others = {name: t for name, t in scenario_s.items() if name != KEEP}
    best = pick(others, BLENDS)
    if best == running:
        return KEEP
    return best if np.mean(others[best]) < (1.0 - gain) * np.mean(scenario_s[KEEP]) else KEEP


# Largest estimated peak KV of a memory-heavy unit of the stratified blend, as a share of the KV capacity:
# about one long video on the paper setups, so repeated long-decode prompts are spread one by one.
UNIT_KV_SHARE = 0.05


def blend_items(context: PolicyContext, with_split: bool = True, tree: PrefixTree | None = None) -> ScanItems:
    """Every request of the batch as scan items, in BlendServe's leaf order (duplicates after their twin)."""
    tree = prefix_tree(context) if tree is None else tree
    leaf_order, _ = ordered_leaves(tree, context.cost_model, with_split=with_split)
    groups = leaf_groups(tree, leaf_order, context.cost_model)
    return scan_items(context.batch, tree, leaf_order, groups, with_duplicates=True)


def blend_cuts(context: PolicyContext, tree: PrefixTree, items: ScanItems) -> np.ndarray:
    """Where the stratified blend's units start (prefixes kept whole, memory-heavy units capped)."""
    return unit_cuts(tree, items, max_unit_kv=UNIT_KV_SHARE * context.kv_capacity_tokens)


def _spread_candidate(keys: np.ndarray) -> Candidate:
    return lambda sub, kept: StaticOrder(sub.requests[np.argsort(keys[kept], kind="stable")])


def first_candidates(context: PolicyContext, items: ScanItems, cuts: np.ndarray) -> dict[str, Candidate]:
    """What ``blendserve`` chooses from first: the projected dual scan, its static list and the fixed-lead
    blend (the lists alone when the context asks for lists)."""
    first: dict[str, Candidate] = {}
    if not context.lists_only:
        first["dual-scan"] = lambda sub, kept: ProjectedDualScan(sub, context.kv_capacity_tokens)
    # Never picked in the recorded choices, but the warm-up bench's runs do pick it (docs/PLANNER_NOTES.md).
    first["static"] = lambda sub, kept: StaticOrder(sub.requests[static_dual_scan_order(sub)[0]])
    first[SPREAD] = _spread_candidate(spread_keys(items, cuts, lead=SPREAD_LEAD))
    # The input order and a random one, as the items list them (``BASELINES``).
    first["fcfs"] = lambda sub, kept: StaticOrder(np.sort(sub.requests))
    first["balance"] = lambda sub, kept: StaticOrder(sub.requests[np.random.default_rng(context.seed).permutation(
        len(sub.requests))])
    if context.keep_order is not None:
        rank = np.empty(len(context.batch), dtype=np.int64)
        rank[np.asarray(context.keep_order, dtype=np.int64)] = np.arange(len(context.keep_order))
        first[KEEP] = _spread_candidate(rank[items.requests])
    return first


def deadline_candidates(items: ScanItems, cuts: np.ndarray, run_steps: float) -> dict[str, Candidate]:
    """Stratified blends whose memory-heavy strata end in time for a run of ``run_steps`` steps (no fixed lead)."""
    return {deadline_name(factor): _spread_candidate(spread_keys(items, cuts, lead=0.0, run_steps=run_steps,
                                                             deadline=factor))
            for factor in DEADLINES}


@dataclass
class Choosing:
    """What ``choose`` built and decided, for the run and for whoever looks into the choice (bench_choice.py)."""

    items: ScanItems  # the job's scan items every candidate orders
    candidates: dict[str, Candidate]  # both rounds' candidates by name
    choice: Choice  # every candidate's simulated times and the one chosen


def choose(context: PolicyContext) -> Choosing:
    """Layer-wise sort, conditional splitting (99% of DFS sharing kept), then the admission chosen (``pick``).

    Two rounds of simulation on the estimated lengths: ``first_candidates``,
    then the deadline blends timed by the fixed-lead blend's simulated steps
    (scaled to the job when a subsample stood for it). On estimated lengths
    (draws), the blends are chosen unless another candidate is faster on every
    draw (``pick``).
    """
    tree = prefix_tree(context)
    items = blend_items(context, tree=tree)
    cuts = blend_cuts(context, tree, items)
    candidates = first_candidates(context, items, cuts)
    predictor = Predictor(context.batch, items, context.output_estimates, context.cost_model,
                          context.kv_capacity_tokens, seed=context.seed, draws=context.output_draws)
    choice = predictor.choose(candidates)
    run_steps = choice.steps[SPREAD] * len(items.requests) / max(choice.sample, 1)
    deadline = deadline_candidates(items, cuts, run_steps)
    choice = choice.merged(predictor.choose(deadline), prefer=BLENDS)
    if KEEP in candidates:
        choice = replace(choice, name=pick_replan(choice.scenario_s, running=context.keep_candidate))
    return Choosing(items, {**candidates, **deadline}, choice)


def blendserve(context: PolicyContext) -> AdmissionController:
    """The admission ``choose`` picks, built afresh for the whole job."""
    made = choose(context)
    chosen = made.candidates[made.choice.name](made.items, np.arange(len(made.items.requests)))
    return ChosenAdmission(chosen, made.items, made.choice)


def blendserve_nosplit(context: PolicyContext) -> AdmissionController:
    """Layer-wise density sort and the projected dual scan, no node splitting and no choice."""
    return ProjectedDualScan(blend_items(context, with_split=False), context.kv_capacity_tokens)


def single_candidate(name: str) -> Callable[[PolicyContext], AdmissionController]:
    """``blendserve[name]``: one of ``first_candidates`` alone, without the choice (for benchmarks)."""
    key = SPREAD if name == "spread" else name

    def build(context: PolicyContext) -> AdmissionController:
        tree = prefix_tree(context)
        items = blend_items(context, tree=tree)
        candidates = first_candidates(context, items, blend_cuts(context, tree, items))
        if key not in candidates:
            raise KeyError(f"blendserve has no candidate {name!r}")
        return candidates[key](items, np.arange(len(items.requests)))

    return build
