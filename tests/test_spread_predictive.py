"""The stratified blend (scheduling.blend) and blendserve's predictive choice (scheduling.choice)."""

from __future__ import annotations

import numpy as np
import pytest

from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.planner.estimates import default_output_estimates
from blendserve.planner.groups import leaf_groups
from blendserve.planner.items import ScanItems, ordered_leaves, scan_items
from blendserve.planner.prefix_tree import PrefixTree, build_prefix_tree
from blendserve.scheduling.admission import StaticOrder
from blendserve.scheduling.blend import HOT_PIECE, cap_units, hot_depth, piece_cost, spread_keys, unit_cuts
from blendserve.scheduling.choice import BASELINES, CLEAR_GAIN, Predictor, pick, pick_replan, subsample
from synthetic import batch_from_prompts, synthetic_batch
from blendserve.scheduling.registry import PolicyContext, make_controller

COST = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))


def spread_order(tree: PrefixTree, items: ScanItems, lead: float = 0.05) -> np.ndarray:
    """Item positions in stratified-blend order, with the blend's default cuts."""
    return np.argsort(spread_keys(items, unit_cuts(tree, items), lead=lead), kind="stable")


def _job(n: int, seed: int, memory_heavy: float = 0.3):  # type: ignore[no-untyped-def]
    batch = synthetic_batch(n, mean_prompt=120, family_size=40, memory_heavy_fraction=memory_heavy, seed=seed)
    estimates = default_output_estimates(batch)
    tree = build_prefix_tree(batch, COST, estimates)
    leaf_order, _ = ordered_leaves(tree, COST)
    items = scan_items(batch, tree, leaf_order, leaf_groups(tree, leaf_order, COST), with_duplicates=True)
    return batch, estimates, tree, items


def _lost_tokens(tree: PrefixTree, items: ScanItems, cuts: np.ndarray, hot_fraction: float) -> float:
    hot = hot_depth(tree, hot_fraction)[tree.request_leaf[items.requests]]
    cost = np.maximum(items.shared_prompt - np.minimum(hot, np.roll(hot, 1)), 0.0)
    return float(cost[1:][cuts[1:]].sum())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_spread_is_a_permutation_with_whole_units_and_strata_in_leaf_order(seed: int) -> None:
    _, _, tree, items = _job(1500, seed)
    cuts = unit_cuts(tree, items)
    order = spread_order(tree, items)
    assert np.array_equal(np.sort(order), np.arange(len(items.requests)))
    unit = np.cumsum(cuts) - 1
    in_order = unit[order]
    # every unit is contiguous in the spread order: its items follow one another
    starts = np.flatnonzero(np.diff(in_order) != 0) + 1
    assert len(np.unique(in_order)) == len(starts) + 1
    # inside a unit, the leaf order is kept (so the prefix its items share is computed once)
    assert np.all(np.diff(order)[np.diff(in_order) == 0] == 1)


@pytest.mark.parametrize("keep", [0.99, 0.995, 1.0])
def test_cuts_stay_within_the_sharing_budget(keep: float) -> None:
    _, _, tree, items = _job(1500, 3)
    cuts = unit_cuts(tree, items, keep_sharing=keep, hot_fraction=0.01)
    assert _lost_tokens(tree, items, cuts, 0.01) <= (1.0 - keep) * float(items.shared_prompt.sum()) + 1e-6
    assert cuts[0]


def _subject_job(subject: int = 100, others: int = 900) -> tuple[PrefixTree, ScanItems, np.ndarray]:
    """A job under one chat template (every leaf: always hot) where ``subject`` requests also share a
    300-token few-shot prefix (10% of the leaves: hot, not always hot); and which items are the subject's."""
    rng = np.random.default_rng(8)
    template, few_shot = [7] * 40, list(range(2000, 2300))
    prompts = [template + (few_shot if i < subject else []) + [3000 + i] + rng.integers(5000, 30000, 19).tolist()
               for i in range(subject + others)]
    batch = batch_from_prompts(prompts, max_tokens=1000)
    tree = build_prefix_tree(batch, COST, default_output_estimates(batch))
    leaf_order, _ = ordered_leaves(tree, COST)
    items = scan_items(batch, tree, leaf_order, leaf_groups(tree, leaf_order, COST), with_duplicates=True)
    return tree, items, items.requests < subject


def test_a_hot_prefix_is_cut_in_pieces_an_always_hot_one_anywhere() -> None:
    """Questions under a few-shot prefix on 10% of the leaves stay together ``HOT_PIECE`` at a time (spread
    one by one, the KV of long decodes evicts the prefix between two of them), while the template every
    request shares binds nothing."""
    tree, items, in_subject = _subject_job()
    unit = np.cumsum(unit_cuts(tree, items, keep_sharing=1.0)) - 1  # zero-cost cuts only
    assert len(np.unique(unit[in_subject])) == -(-in_subject.sum() // HOT_PIECE)
    assert len(np.unique(unit[~in_subject])) == (~in_subject).sum()
    assert not np.isin(unit[in_subject], unit[~in_subject]).any()


def test_piece_cost_frees_every_pieceth_cut_of_a_hot_run() -> None:
    hot_kept = np.array([0, 0, 0, 0, 0, 0, 0, 5, 0, 0], dtype=float)  # beyond the hot prefix
    always_kept = np.array([0, 9, 9, 9, 9, 0, 9, 14, 9, 9], dtype=float)  # beyond the always-hot one
    cost = piece_cost(hot_kept, always_kept, piece=2)
    # runs under the hot prefix: pairs 1-4, then 6-9; each run's 2nd, 4th, ... pair keeps the prefix
    assert cost.tolist() == [0, 9, 0, 9, 0, 0, 9, 5, 9, 0]
    assert np.array_equal(piece_cost(hot_kept, always_kept, piece=1), hot_kept)


def test_spread_blends_memory_heavy_work_across_the_run() -> None:
    """In the leaf order memory-heavy items sit at the right end; the spread puts them all along the run."""
    _, _, tree, items = _job(2000, 4)
    heavy = items.group_density[items.group] < items.target_density
    assert heavy.any() and (~heavy).any()
    rank = np.empty(len(items.requests), dtype=np.float64)
    rank[spread_order(tree, items, lead=0.0)] = np.arange(len(items.requests)) / len(items.requests)
    assert np.mean(np.flatnonzero(heavy) / len(heavy)) > 0.6  # leaf order: at the end
    assert abs(np.mean(rank[heavy]) - 0.5) < 0.1  # spread: around the middle
    first_fifth = rank < 0.2
    assert heavy[first_fifth].mean() == pytest.approx(heavy.mean(), abs=0.1)


def test_cap_splits_memory_heavy_units_only() -> None:
    """A run of long decodes sharing one prompt (one unit by sharing) is cut into units of about the cap."""
    light, heavy = 50, 40
    kv = np.concatenate([np.full(light, 800.0), np.random.default_rng(0).integers(9_000, 24_000, heavy).astype(float)])
    items = ScanItems(
        requests=np.arange(light + heavy), group=np.repeat([0, 1], [light, heavy]), group_density=np.array([30.0, 0.1]),
        kv_charge=kv, target_density=1.4, output_est=kv - 30.0, shared_prompt=np.full(light + heavy, 30.0),
    )
    cuts = np.zeros(light + heavy, dtype=bool)
    cuts[[0, light]] = True  # two units: the light run, the heavy run
    capped = cap_units(items, cuts, max_unit_kv=50_000.0)
    assert np.all(capped[cuts]) and not capped[1:light].any()  # old cuts kept, the light unit untouched
    unit = np.cumsum(capped) - 1
    unit_kv = np.bincount(unit, weights=kv)[unit[light]:]
    assert len(unit_kv) > 6 and np.all(unit_kv <= 50_000.0 + kv[light:].max())
    assert np.all(unit_kv[:-1] > 50_000.0 - kv[light:].max())  # cut only where the cap is reached


def test_lead_compresses_memory_heavy_strata() -> None:
    _, _, tree, items = _job(1500, 5)
    cuts = unit_cuts(tree, items)
    heavy = items.group_density[items.group] < items.target_density
    led, even = spread_keys(items, cuts, lead=0.2), spread_keys(items, cuts, lead=0.0)
    assert np.allclose(led[heavy], 0.8 * even[heavy]) and np.array_equal(led[~heavy], even[~heavy])


def test_deadline_ends_long_decode_strata_in_time() -> None:
    """With the run's steps known, a stratum of long decodes stops starting them ``deadline x longest`` before the end."""
    _, _, tree, items = _job(1500, 5)
    cuts = unit_cuts(tree, items)
    heavy = items.group_density[items.group] < items.target_density
    longest = float(items.output_est[heavy].max())
    run_steps = 4.0 * longest
    keys = spread_keys(items, cuts, lead=0.0, run_steps=run_steps, deadline=0.8)
    even = spread_keys(items, cuts, lead=0.0)
    assert keys[heavy].max() <= 1.0 - 0.8 * longest / run_steps + 1e-9
    assert keys[heavy].max() < even[heavy].max() and np.array_equal(keys[~heavy], even[~heavy])
    # a longer run leaves the same strata less lead: the deadline is in steps, not in shares of the run
    assert spread_keys(items, cuts, lead=0.0, run_steps=40 * longest, deadline=0.8)[heavy].max() > keys[heavy].max()


def test_subsample_keeps_rows_and_order() -> None:
    batch, estimates, _, items = _job(1200, 6)
    sub_batch, sub_items, sub_est, kept = subsample(batch, items, estimates, 300, seed=1)
    assert len(sub_batch) == len(sub_items.requests) == 300 and np.all(np.diff(kept) > 0)
    original = items.requests[kept]
    assert np.array_equal(sub_batch.request_ids[sub_items.requests], batch.request_ids[original])
    assert np.array_equal(sub_est[sub_items.requests], estimates[original])
    assert np.array_equal(sub_batch.prompt(int(sub_items.requests[0])), batch.prompt(int(original[0])))


def test_choose_keeps_the_candidate_simulated_fastest() -> None:
    """A list that runs the job one request at a time must lose to one that batches it."""
    from blendserve.sim.simulator import SimConfig, simulate

    batch, estimates, _, items = _job(400, 7)

    class OneAtATime(StaticOrder):
        def next_request(self, state):  # type: ignore[no-untyped-def]
            return super().next_request(state) if state.running == 0 and state.waiting == 0 else None

    candidates = {
        "serial": lambda sub, kept: OneAtATime(sub.requests),
        "batched": lambda sub, kept: StaticOrder(sub.requests),
    }
    choice = Predictor(batch, items, estimates, COST, 200_000).choose(candidates)
    assert choice.name == "batched" and choice.predicted_s["serial"] > choice.predicted_s["batched"]
    lengths = np.maximum(estimates.astype(np.int64), 1)
    direct = simulate(batch, lengths, COST, StaticOrder(items.requests), SimConfig(kv_capacity_tokens=200_000))
    assert choice.predicted_s["batched"] == pytest.approx(direct.total_time)


def test_with_draws_each_candidate_is_scored_by_its_mean_over_them() -> None:
    from blendserve.sim.simulator import SimConfig, simulate

    batch, estimates, _, items = _job(400, 7)
    rng = np.random.default_rng(3)
    draws = tuple(rng.integers(1, 2 * int(estimates.max()) + 2, size=len(batch)) for _ in range(2))
    candidates = {"input": lambda sub, kept: StaticOrder(np.sort(sub.requests)),
                  "items": lambda sub, kept: StaticOrder(sub.requests)}
    choice = Predictor(batch, items, estimates, COST, 200_000, draws=draws).choose(candidates)
    config = SimConfig(kv_capacity_tokens=200_000)
    runs = [simulate(batch, d, COST, StaticOrder(items.requests), config).total_time for d in draws]
    assert choice.scenarios == 2 and runs[0] != runs[1]
    assert choice.predicted_s["items"] == pytest.approx(np.mean(runs))
    assert choice.worst_s["items"] == pytest.approx(max(runs))
    assert choice.name == min(choice.predicted_s, key=choice.predicted_s.get)


def test_over_draws_a_blend_is_kept_unless_another_is_faster_on_every_draw() -> None:
    times = {"deadline-1": (100.0, 110.0, 120.0), "balance": (90.0, 112.0, 115.0), "fcfs": (97.0, 107.0, 117.0),
             "static": (99.0, 109.5, 121.0)}
    assert pick(times) == "balance"  # the best mean, though it loses one draw to the blend
    assert pick(times, prefer={"deadline-1"}) == "fcfs"  # faster than the blend on every draw
    del times["fcfs"]
    assert pick(times, prefer={"deadline-1"}) == "deadline-1"
    # One scenario (lengths known): the fastest, whatever is preferred.
    assert pick({"deadline-1": (100.0,), "balance": (90.0,)}, prefer={"deadline-1"}) == "balance"


def test_a_baseline_is_picked_only_when_clearly_faster() -> None:
    assert BASELINES == {"fcfs", "balance"}
    close = 100.0 * (1.0 - CLEAR_GAIN / 2)  # ahead, but within what the prediction misses
    clear = 100.0 * (1.0 - 2 * CLEAR_GAIN)
    own = {"deadline-1": (100.0,), "static": (100.5,), "dual-scan": (101.0,)}
    assert pick({**own, "fcfs": (close,), "balance": (close + 0.1,)}) == "deadline-1"
    assert pick({**own, "fcfs": (clear,), "balance": (close,)}) == "fcfs"
    # The rule guards the baselines only: blendserve's own fastest candidate is taken by any lead.
    assert pick({**own, "static": (close,), "fcfs": (100.2,)}) == "static"
    # Over draws too: a baseline faster on every draw, by less than the margin, leaves the blend running ...
    draws = {"deadline-1": (100.0, 110.0), "static": (101.0, 111.0)}
    assert pick({**draws, "fcfs": (99.9, 109.9)}, prefer={"deadline-1"}) == "deadline-1"
    # ... and a candidate of blendserve's own that is faster on every draw is taken by any lead, as before.
    assert pick({**draws, "static": (99.9, 109.9), "fcfs": (99.8, 109.8)}, prefer={"deadline-1"}) == "static"


def test_blendserve_keeps_the_blends_on_drawn_lengths_unless_beaten_on_every_draw() -> None:
    batch, estimates, _, _ = _job(600, 8)
    known = make_controller("blendserve", PolicyContext(batch, estimates, COST, 60_000)).choice  # type: ignore[attr-defined]
    rng = np.random.default_rng(4)
    draws = tuple(rng.integers(1, 2 * int(estimates.max()) + 2, size=len(batch)) for _ in range(2))
    drawn = make_controller("blendserve", PolicyContext(batch, estimates, COST, 60_000,  # type: ignore[attr-defined]
                                                        output_draws=draws)).choice
    assert known.name == min(known.predicted_s, key=known.predicted_s.get)
    assert drawn.scenarios == 2 and all(len(t) == 2 for t in drawn.scenario_s.values())
    blends = {name for name in drawn.predicted_s if name.startswith(("deadline", "spread"))}
    best_blend = min(blends, key=drawn.predicted_s.get)
    if drawn.name in blends:
        assert drawn.name == best_blend
    else:  # another candidate replaced the blends only by being faster on both draws
        assert all(a < b for a, b in zip(drawn.scenario_s[drawn.name], drawn.scenario_s[best_blend]))


def test_a_replan_switches_from_the_running_order_only_for_a_clear_gain() -> None:
    times = {"keep": (100.0, 110.0, 120.0), "deadline-1": (99.5, 109.0, 119.0), "balance": (95.0, 120.0, 130.0)}
    assert pick_replan(times) == "keep"  # the blend is faster on every draw, by 0.8% on the mean: not enough
    assert pick_replan(times, gain=0.005) == "deadline-1"
    times["deadline-1"] = (97.0, 106.0, 118.0)
    assert pick_replan(times) == "deadline-1"
    times["fcfs"] = (96.0, 105.0, 117.0)  # faster than the blend on every draw, but by under 1%: a baseline stays out
    assert pick_replan(times) == "deadline-1"
    times["fcfs"] = (94.0, 103.0, 115.0)  # clearly faster: ``pick``'s rule, then the gain
    assert pick_replan(times) == "fcfs"
    # the running plan's own candidate, re-made, is not a switch: keep it as it runs
    assert pick_replan(times, running="fcfs") == "keep"
    assert pick_replan(times, running="deadline-1") == "fcfs"


def test_a_replan_offers_the_running_order_as_it_was() -> None:
    from blendserve.scheduling.choice import BLENDS, KEEP, choose

    batch, estimates, _, _ = _job(600, 8)
    rng = np.random.default_rng(4)
    draws = tuple(rng.integers(1, 2 * int(estimates.max()) + 2, size=len(batch)) for _ in range(2))
    for keep in (np.random.default_rng(5).permutation(len(batch)), np.arange(len(batch))[::-1]):
        made = choose(PolicyContext(batch, estimates, COST, 60_000, lists_only=True, output_draws=draws,
                                    keep_order=keep))
        running = made.candidates[KEEP](made.items, np.arange(len(made.items.requests)))
        assert np.array_equal(running.order, keep)  # the running plan's order, untouched
        assert made.choice.name == pick_replan(made.choice.scenario_s)
        # made from the candidate the re-plan would pick, the running plan is kept
        others = {name: t for name, t in made.choice.scenario_s.items() if name != KEEP}
        rerun = choose(PolicyContext(batch, estimates, COST, 60_000, lists_only=True, output_draws=draws,
                                     keep_order=keep, keep_candidate=pick(others, BLENDS)))
        assert rerun.choice.name == KEEP
    first = choose(PolicyContext(batch, estimates, COST, 60_000, lists_only=True, output_draws=draws)).choice
    assert KEEP not in first.scenario_s  # a first plan has nothing running to keep


def test_blendserve_choice_never_reads_true_lengths() -> None:
    batch, estimates, _, _ = _job(600, 8)
    context = PolicyContext(batch, estimates, COST, 60_000, seed=0)
    first = make_controller("blendserve", context).choice  # type: ignore[attr-defined]
    batch.sim_output_tokens[:] = np.random.default_rng(0).integers(1, 3000, size=len(batch))
    second = make_controller("blendserve", context).choice  # type: ignore[attr-defined]
    assert first.name == second.name and first.predicted_s == second.predicted_s
    assert set(first.predicted_s) == {"dual-scan", "static", "spread-0.05", "fcfs", "balance", "deadline-0.5", "deadline-0.8",
                                      "deadline-1"}
    assert first.predicted_s[first.name] == min(first.predicted_s.values())


def test_compare_reports_the_choice_and_its_prediction() -> None:
    """The bench rows name blendserve's pick and its predicted fraction of T_opt (whole job simulated)."""
    from blendserve.sim.compare import compare_policies
    from blendserve.sim.simulator import SimConfig

    batch, estimates, _, _ = _job(500, 9)
    report = compare_policies(batch, COST, SimConfig(kv_capacity_tokens=60_000), ["fcfs", "blendserve"],
                              estimates=estimates)
    rows = {r["policy"]: r for r in report["policies"]}
    assert rows["fcfs"]["chosen"] is None and rows["fcfs"].get("predicted_fraction") is None
    context = PolicyContext(batch, estimates, COST, 60_000, seed=0)
    choice = make_controller("blendserve", context).choice  # type: ignore[attr-defined]
    assert rows["blendserve"]["chosen"] == choice.name
    assert rows["blendserve"]["predicted_fraction"] == pytest.approx(report["t_opt_s"] / choice.predicted_s[choice.name])
