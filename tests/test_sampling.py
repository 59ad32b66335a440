"""Warm-up sampling: selection, the estimator's fallback order, run-time correction, the report."""

from __future__ import annotations

import numpy as np
import pytest

from blendserve.batch import UNKNOWN
from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.planner.prefix_tree import build_prefix_tree
from blendserve.scheduling.admission import EngineState
from blendserve.scheduling.dual_scan import LEFT, RIGHT, DualScanController, ScanItems
from conftest import record_admissions
from synthetic import batch_from_prompts, synthetic_batch
from blendserve.sampling import (
    draw_outputs,
    estimate_outputs,
    estimate_report,
    estimate_table,
    select_samples,
    split_warmup,
)
from blendserve.sampling.select import SHORT_CAP, eligible_leaves
from blendserve.sampling.estimator import ANCESTOR, KNOWN, NO_SAMPLE, SAMPLED, SIBLING, SUBTREE

COST = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
STATE = EngineState(running=0, waiting=0, kv_used_tokens=0, kv_total_tokens=0)


def _hand_tree():  # type: ignore[no-untyped-def]
    """Root -> A [1,1,1] (6 requests), B [2,2,2] -> B1 [5], B2 [6], B3 [7] (2 each), C [3,3,3] (2).

    Index map: A = 0..5 (5 has a known length, 4 has max_tokens 5), B1 = 6, 7, B2 = 8, 9,
    B3 = 10, 11, C = 12, 13.
    """
    prompts = [[1, 1, 1, 10 + i] for i in range(6)]
    for branch in (5, 6, 7):
        prompts += [[2, 2, 2, branch, 20 + i] for i in range(2)]
    prompts += [[3, 3, 3, 30 + i] for i in range(2)]
    expected = [UNKNOWN] * len(prompts)
    expected[5] = 7
    batch = batch_from_prompts(prompts, max_tokens=1000, expected=expected)
    batch.max_tokens[4] = 5
    return batch, build_prefix_tree(batch, COST)


def _hand_estimates():  # type: ignore[no-untyped-def]
    batch, tree = _hand_tree()
    # A: 10, 20, 30 (mean 20, 3 samples); B1: 100 and B3: 300 (B holds 2, mean 200); B2 and C: none.
    sampled = np.array([0, 1, 2, 6, 10])
    observed = np.array([10, 20, 30, 100, 300])
    return batch, tree, sampled, observed, estimate_outputs(batch, tree, sampled, observed, min_samples=2)


def test_fallback_order_subtree_then_sibling_then_parent() -> None:
    _, _, _, _, est = _hand_estimates()
    assert est.mean[3] == 20 and est.kind[3] == SUBTREE  # A's own mean
    # C has no samples; its siblings A (3 samples) and B (2): the best-sampled sibling, A, not the root (92).
    assert est.mean[12] == est.mean[13] == 20 and est.kind[12] == SIBLING
    # B2 has no samples, its siblings B1 and B3 one each (< 2): the parent B's mean of both.
    assert est.mean[8] == est.mean[9] == 200 and est.kind[8] == ANCESTOR
    # B1's unsampled request: B1 holds 1 sample, its sibling B3 too, so again B.
    assert est.mean[7] == 200


def test_sampled_requests_keep_observed_and_known_lengths_win() -> None:
    batch, _, sampled, observed, est = _hand_estimates()
    assert est.mean[sampled].tolist() == observed.tolist()
    assert (est.kind[sampled] == SAMPLED).all()
    assert est.mean[5] == est.high[5] == 7 and est.kind[5] == KNOWN
    assert est.mean[4] == 5  # A's mean 20, capped by the request's max_tokens
    # A known length wins even over an observed one.
    both = estimate_outputs(batch, _hand_tree()[1], np.array([5, 0, 1]), np.array([999, 10, 10]), min_samples=2)
    assert both.mean[5] == 7


def test_every_unsampled_request_has_an_estimate_with_spread() -> None:
    batch = synthetic_batch(3000, family_size=150, memory_heavy_fraction=0.3, seed=3)
    tree = build_prefix_tree(batch, COST)
    sampled = select_samples(batch, tree, rate=0.01, min_subtree=100, seed=1)
    est = estimate_outputs(batch, tree, sampled, batch.sim_output_tokens[sampled], quantile=0.9)
    assert len(sampled) > 0
    assert (est.kind != NO_SAMPLE).all()
    assert (est.mean >= 1).all() and (est.mean <= batch.max_tokens).all()
    estimated = (est.kind != SAMPLED) & (est.kind != KNOWN)
    assert (est.high[estimated] >= est.mean[estimated]).all()
    assert (est.std[estimated] > 0).any()


def test_draws_resample_the_samples_behind_each_estimate() -> None:
    batch, _, sampled, observed, est = _hand_estimates()
    draws = np.stack(draw_outputs(est, 200, seed=1))
    assert draws.shape == (200, len(batch))
    # A's unsampled request 3 draws from A's samples only (10, 20, 30), each of them at some point.
    assert set(draws[:, 3].tolist()) == {10, 20, 30}
    # B2 (estimated by its parent B) draws B's samples, 100 and 300: never their mean, 200.
    assert set(draws[:, 8].tolist()) == {100, 300}
    # C, estimated by its sibling A, draws A's samples.
    assert set(draws[:, 12].tolist()) <= {10, 20, 30}
    # Sampled and known lengths are not guesses; a draw stays within the request's max_tokens (5).
    assert (draws[:, sampled] == observed).all() and (draws[:, 5] == 7).all()
    assert set(draws[:, 4].tolist()) == {5}
    # The same seed draws the same lengths; estimates of a subset draw from the same samples.
    assert (np.stack(draw_outputs(est, 200, seed=1)) == draws).all()
    assert set(np.concatenate(draw_outputs(est.take(np.array([8, 9])), 50)).tolist()) == {100, 300}


def test_a_running_sample_is_drawn_between_its_progress_and_its_cap() -> None:
    batch, tree, sampled, observed, _ = _hand_estimates()
    # B1's sample (request 6) still runs at 50 tokens; 400 is what it is expected to reach (cap 1000).
    running = np.where(sampled == 6, 50, 0)
    est = estimate_outputs(batch, tree, sampled, np.where(sampled == 6, 400, observed), min_samples=2,
                           running=running)
    assert est.mean[6] == 400
    draws = np.stack(draw_outputs(est, 300, seed=2))
    assert draws[:, 6].min() >= 50 and draws[:, 6].max() <= 1000 and len(np.unique(draws[:, 6])) > 100
    # B2, estimated by B (samples 6 and 10), draws either B3's 300 or a length B1's sample may still reach.
    other = draws[:, 8][draws[:, 8] != 300]
    assert len(other) > 50 and other.min() >= 50 and other.max() <= 1000
    # One unknown length per running sample: every request drawing from it gets the sample's draw, and the
    # draws climb from its progress towards its cap (independent draws would average out in each draw).
    from_b1 = draws[:, 8] != 300
    assert (draws[from_b1, 8] == draws[from_b1, 6]).all()
    assert (np.diff(draws[:, 6]) >= 0).all() and draws[0, 6] < 60 and draws[-1, 6] > 950


def test_no_samples_falls_back_to_max_tokens() -> None:
    batch, tree = _hand_tree()
    est = estimate_outputs(batch, tree, np.zeros(0, np.int64), np.zeros(0))
    unknown = batch.expected_output_tokens == UNKNOWN
    assert (est.mean[unknown] == batch.max_tokens[unknown]).all() and (est.kind[unknown] == NO_SAMPLE).all()


def test_selection_covers_big_subtrees_respects_rate_cap_and_seed() -> None:
    batch = synthetic_batch(4000, family_size=300, memory_heavy_fraction=0.3, seed=5)
    tree = build_prefix_tree(batch, COST)
    sampled = select_samples(batch, tree, rate=0.01, min_subtree=50, seed=7)
    assert len(np.unique(sampled)) == len(sampled)
    assert (batch.expected_output_tokens[sampled] == UNKNOWN).all()
    eligible = eligible_leaves(batch, tree)
    assert len(sampled) >= np.ceil(0.01 * eligible.sum())
    leaf_hit = np.zeros(tree.n_leaves, dtype=bool)
    leaf_hit[tree.request_leaf[sampled]] = True
    for v in range(tree.n_internal):
        if eligible[tree.lo[v] : tree.hi[v]].sum() >= 50:
            assert leaf_hit[tree.lo[v] : tree.hi[v]].any(), f"subtree {v} has no sample"
    assert np.array_equal(sampled, select_samples(batch, tree, rate=0.01, min_subtree=50, seed=7))
    assert not np.array_equal(sampled, select_samples(batch, tree, rate=0.01, min_subtree=50, seed=8))
    assert len(select_samples(batch, tree, rate=0.5, cap=17, seed=7)) == 17


def test_requests_capped_at_a_few_tokens_are_never_sampled() -> None:
    """One-token answers under many few-shot prefixes: a sample would only run out of the plan's order."""
    rng = np.random.default_rng(3)
    prefixes = [rng.integers(5, 30_000, size=300).tolist() for _ in range(8)]
    prompts = [prefixes[i % 8] + rng.integers(5, 30_000, size=20).tolist() for i in range(400)]
    short = batch_from_prompts(prompts, max_tokens=SHORT_CAP)
    assert len(select_samples(short, build_prefix_tree(short, COST), rate=0.05, min_subtree=10)) == 0
    longer = batch_from_prompts(prompts, max_tokens=SHORT_CAP + 1)
    assert len(select_samples(longer, build_prefix_tree(longer, COST), rate=0.05, min_subtree=10)) >= 20


def test_sampled_requests_never_run_twice_duplicates_included() -> None:
    batch = synthetic_batch(2000, family_size=100, duplicate_fraction=0.3, seed=2)
    tree = build_prefix_tree(batch, COST)
    sampled = select_samples(batch, tree, rate=0.05, min_subtree=20, seed=0)
    parts = split_warmup(tree, sampled)
    together = np.concatenate([parts.run, parts.fanned, parts.rest])
    assert np.array_equal(np.sort(together), np.arange(len(batch)))  # each request in exactly one part
    assert np.array_equal(parts.run, sampled)
    assert len(parts.fanned) > 0  # the batch has duplicates of sampled prompts: answered, not rerun
    run_leaves = set(tree.request_leaf[parts.run].tolist())
    assert run_leaves.isdisjoint(tree.request_leaf[parts.rest].tolist())
    assert set(tree.request_leaf[parts.fanned].tolist()) <= run_leaves


def _two_items() -> ScanItems:
    # Item 0 (left, compute-heavy) and item 1 (right): prompt 100, estimated outputs 20 and 50.
    return ScanItems(
        requests=np.array([0, 1, 2, 3]),
        group=np.array([0, 0, 1, 1]),
        group_density=np.array([10.0, 0.1]),
        kv_charge=np.array([120.0, 120.0, 150.0, 150.0]),
        target_density=1.0,
        output_est=np.array([20.0, 20.0, 50.0, 50.0]),
    )


def test_overrun_is_charged_to_the_right_budget() -> None:
    controller = DualScanController(_two_items(), capacity_tokens=1000)
    index = controller.next_request(STATE)
    side, _ = controller.inflight[index]
    assert side == LEFT and index == 0
    controller.on_progress(index, 16)  # within the estimate of 20: nothing changes
    assert controller.inflight[index] == (LEFT, 120.0)
    before_right = controller.used[RIGHT]
    controller.on_progress(index, 64)  # past it: now memory-heavy, holding 100 + 64 tokens
    assert controller.inflight[index] == (RIGHT, 164.0)
    assert controller.used[LEFT] == 0.0 and controller.used[RIGHT] == before_right + 164.0
    controller.on_finish(index, 80)
    assert controller.used == [0.0, before_right]


def test_early_finish_frees_its_budget_at_once() -> None:
    items = _two_items()
    controller = DualScanController(items, capacity_tokens=300)
    first = [controller.next_request(STATE) for _ in range(2)]
    assert None not in first
    blocked = controller.next_request(STATE)
    assert blocked is None  # both sides full under their shares
    side, cost = controller.inflight[first[0]]
    used = controller.used[side]
    controller.on_finish(first[0], 2)  # far shorter than its estimate
    assert controller.used[side] == pytest.approx(used - cost)
    assert controller.next_request(STATE) is not None


def test_report_errors_overall_and_per_subtree() -> None:
    batch, tree, sampled, observed, est = _hand_estimates()
    actual = np.array([10, 20, 30, 40, 5, 7, 100, 100, 200, 200, 300, 300, 40, 40])
    rows = estimate_report(tree, est, actual)
    overall = rows[0]
    scored = (est.kind != SAMPLED) & (est.kind != KNOWN)
    assert overall.requests == scored.sum()
    e, a = est.mean[scored].astype(float), actual[scored].astype(float)
    assert overall.mape == pytest.approx(np.mean(np.abs(e - a) / a))
    assert overall.bias == pytest.approx((e - a).sum() / a.sum())
    assert sum(r.requests for r in rows[1:]) == overall.requests
    table = estimate_table(batch, est, np.where(np.arange(len(batch)) == 13, -1, actual))
    assert table.num_rows == len(batch) and table.column("actual_output_tokens").null_count == 1


def test_inline_warmup_admits_samples_first_and_every_request_once(caplog) -> None:
    from blendserve.scheduling import warmup
    from blendserve.scheduling.warmup import warmup_controller
    from blendserve.sim import SimConfig, simulate

    batch = synthetic_batch(1500, family_size=100, memory_heavy_fraction=0.2, seed=4)
    tree = build_prefix_tree(batch, COST)
    sampled = select_samples(batch, tree, rate=0.02, min_subtree=50, seed=0)
    controller = warmup_controller(batch, tree, sampled, COST, kv_capacity_tokens=200_000)
    admitted = record_admissions(controller)
    with caplog.at_level("INFO", logger="blendserve.scheduling.warmup"):
        simulate(batch, batch.sim_output_tokens, COST, controller, SimConfig(kv_capacity_tokens=200_000))
    assert sorted(admitted) == list(range(len(batch)))  # every request once: none twice, none lost
    # the plan's time is kept and told (it is made beside the engine: plan_worker)
    assert controller.plan_seconds > 0
    told = [r.getMessage() for r in caplog.records if "planned the" in r.getMessage()]
    assert len(told) == 1 + len(warmup.REPLAN_AT) == 1 + controller.replans, told  # the plan, then any re-plans
    assert "in blendserve[spread]'s order" in told[0], told
    assert f"chose {controller.inner.choice.name}" in told[-1], told
    assert admitted[: len(sampled)] == sampled.tolist()
    assert controller.inner is not None and 0 < controller.unplanned < len(batch) - len(sampled)
    assert controller.sample_lengths() == {int(i): int(batch.sim_output_tokens[i]) for i in sampled}


def _rare_long_family(n: int = 4000, family: int = 24, seed: int = 5):  # type: ignore[no-untyped-def]
    """``n`` requests with long prompts and short answers, ``family`` of them with short prompts and 8k-token
    answers (the video prompts of a chat job); one uniform max_tokens, every length hidden."""
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(100, 30_000, size=int(rng.integers(400, 900)))) for _ in range(n - family)]
    prompts += [[7, 7, 7] + list(rng.integers(100, 30_000, size=int(rng.integers(8, 14)))) for _ in range(family)]
    batch = batch_from_prompts(prompts, max_tokens=16_384)
    truth = np.concatenate([rng.integers(2, 40, size=n - family), rng.integers(6_000, 10_000, size=family)])
    batch.sim_output_tokens = truth.astype(np.int32)
    return batch, truth, np.arange(n - family, n)


def test_a_rare_family_that_could_hold_most_of_the_work_is_sampled_and_estimated_long() -> None:
    batch, truth, rare = _rare_long_family()
    tree = build_prefix_tree(batch, COST)
    sampled = select_samples(batch, tree, rate=0.01, min_subtree=100, seed=0)
    assert np.isin(rare, sampled).sum() >= 3  # a 1% draw alone expects 0.24 of them
    est = estimate_outputs(batch, tree, sampled, truth[sampled])
    unsampled = rare[~np.isin(rare, sampled)]
    assert np.median(est.mean[unsampled]) > 0.5 * np.median(truth[rare])  # not the short answers' mean
    short = np.setdiff1d(np.arange(len(batch)), np.concatenate([rare, sampled]))
    assert np.median(est.mean[short]) < 100


def _shared_prompt_family(n: int = 3000, family: int = 30, seed: int = 4):  # type: ignore[no-untyped-def]
    """Every request under one 50-token system prompt, with 20-40 more tokens: the long answers (``family`` of
    them, 6-10k tokens) look like the short ones in prompt and cap; only their group (source file or task
    tag) differs."""
    rng = np.random.default_rng(seed)
    system = list(rng.integers(100, 30_000, size=50))
    prompts = [system + list(rng.integers(100, 30_000, size=int(rng.integers(20, 40)))) for _ in range(n)]
    batch = batch_from_prompts(prompts, max_tokens=16_384)
    truth = np.concatenate([rng.integers(2, 40, size=n - family), rng.integers(6_000, 10_000, size=family)])
    batch.sim_output_tokens = truth.astype(np.int32)
    batch.group = np.where(np.arange(n) >= n - family, 1, 0)
    return batch, truth, np.arange(n - family, n)


def test_a_family_under_the_prompt_all_share_is_told_apart_by_its_group() -> None:
    batch, truth, family = _shared_prompt_family()
    tree = build_prefix_tree(batch, COST)
    sampled = select_samples(batch, tree, rate=0.01, min_subtree=100, seed=0)
    assert np.isin(family, sampled).sum() >= 3  # the group's stratum is covered
    unsampled = family[~np.isin(family, sampled)]
    short = np.setdiff1d(np.arange(len(batch)), np.concatenate([family, sampled]))
    est = estimate_outputs(batch, tree, sampled, truth[sampled])
    assert np.median(est.mean[unsampled]) > 0.5 * np.median(truth[family])
    assert np.median(est.mean[short]) < 100
    # Without the group the same samples cannot tell the family from the rest: they share prompt and cap.
    batch.group = None
    blind = estimate_outputs(batch, tree, sampled, truth[sampled])
    assert np.median(blind.mean[unsampled]) < 0.2 * np.median(truth[family])


def test_a_family_spread_over_prompt_lengths_is_estimated_from_its_whole_group() -> None:
    """Long answers of one group whose prompts fall in four length buckets, under the system prompt the short
    answers share: two samples per bucket are too few for a bucket, eight for the group are enough."""
    rng = np.random.default_rng(5)
    system = list(rng.integers(100, 30_000, size=50))
    short, per_bucket = 2000, 10
    extra = [int(rng.integers(20, 40)) for _ in range(short)]
    extra += [size for size in (20, 100, 300, 1000) for _ in range(per_bucket)]  # buckets 64, 128, 256, 1024
    batch = batch_from_prompts([system + list(rng.integers(100, 30_000, size=k)) for k in extra], max_tokens=16_384)
    truth = np.r_[rng.integers(2, 40, size=short), rng.integers(6_000, 10_000, size=4 * per_bucket)]
    batch.group = np.where(np.arange(len(extra)) >= short, 1, 0)
    tree = build_prefix_tree(batch, COST)
    family = np.arange(short, len(extra))
    sampled = np.r_[np.arange(0, short, 50), family[::per_bucket], family[1::per_bucket]]  # 2 per bucket
    unsampled = np.setdiff1d(family, sampled)
    est = estimate_outputs(batch, tree, sampled, truth[sampled])
    assert np.all(est.mean[unsampled] > 5_000)
    for draw in draw_outputs(est, 3, seed=0):  # drawn from the group's samples, not the short answers'
        assert np.all(draw[unsampled] >= truth[sampled[sampled >= short]].min())
    short_rest = np.setdiff1d(np.arange(short), sampled)
    assert np.median(est.mean[short_rest]) < 100
    batch.group = None  # the same samples, no group: the short answers' subtree wins
    assert np.median(estimate_outputs(batch, tree, sampled, truth[sampled]).mean[unsampled]) < 2_000


def test_a_family_of_one_prompt_length_each_is_sampled_as_a_group() -> None:
    """Six long answers of one group, each alone in its prompt-length bucket: no bucket can be covered (one
    request), the group could hold a material share of the work, so the warm-up draws from it as a group."""
    rng = np.random.default_rng(6)
    system = list(rng.integers(100, 30_000, size=50))
    short = 3000
    extra = [int(rng.integers(300, 500)) for _ in range(short)] + [30, 100, 300, 700, 1500, 3500]
    batch = batch_from_prompts([system + list(rng.integers(100, 30_000, size=k)) for k in extra], max_tokens=16_384)
    truth = np.r_[rng.integers(2, 40, size=short), rng.integers(6_000, 10_000, size=6)]
    batch.group = np.where(np.arange(len(extra)) >= short, 1, 0)
    tree = build_prefix_tree(batch, COST)
    family = np.arange(short, len(extra))
    sampled = select_samples(batch, tree, rate=0.01, min_subtree=100, seed=0)
    assert np.isin(family, sampled).sum() == 3  # PER_STRATUM of the group; a 1% draw expects 0.06
    unsampled = np.setdiff1d(family, sampled)
    assert np.all(estimate_outputs(batch, tree, sampled, truth[sampled]).mean[unsampled] > 5_000)
    assert len(sampled) < 0.02 * len(batch)  # the group's picks add to the 1% draw, not multiply it


def test_groups_add_at_most_the_uniform_draw_to_the_sample() -> None:
    """A thousand groups of three, each request alone in its prompt-length bucket: every group could hold a
    share of the work, and sampling each would run the whole job first."""
    rng = np.random.default_rng(7)
    extra = [size for _ in range(1000) for size in (30, 300, 1500)]
    batch = batch_from_prompts([list(rng.integers(100, 30_000, size=k)) for k in extra], max_tokens=16_384)
    batch.group = np.repeat(np.arange(1000), 3)
    sampled = select_samples(batch, build_prefix_tree(batch, COST), rate=0.01, min_subtree=100, seed=0)
    assert 2 * 30 - 5 <= len(sampled) <= 2 * 30  # the 1% draw and as many group picks (a few may coincide)


def test_a_batch_read_from_a_table_knows_each_requests_group() -> None:
    import pyarrow as pa

    from blendserve.batch import RequestBatch

    table = pa.table({
        "request_id": ["a", "b", "c", "d", "e"],
        "prompt_token_ids": [[1], [2], [3], [4], [5]],
        "source_file": ["x.jsonl", "x.jsonl", "y.jsonl", "x.jsonl", "x.jsonl"],
        "metadata_json": ['{"task": "label"}', '{"source": "video", "frames": 3}', '{"task": "label"}',
                          '{"note": "n", "task": "label"}', None],
    })
    batch = RequestBatch.from_table(table)
    group = batch.group
    assert group is not None and group[0] == group[3]  # same file, same tag wherever it sits in the JSON
    assert len({group[0], group[1], group[2], group[4]}) == 4  # another tag, another file, no tag
    assert batch.take(np.array([3, 1])).group.tolist() == [group[3], group[1]]
    assert RequestBatch.from_table(table.select(["request_id", "prompt_token_ids"])).group is None


def test_censored_length_is_the_log_uniform_mean_above_the_progress_and_within_the_cap() -> None:
    from blendserve.sampling.strata import censored_length

    assert censored_length(256, 32_768) == pytest.approx((32_768 - 256) / np.log(128))
    assert censored_length(32_768, 32_768) == 32_768 and censored_length(40_000, 32_768) == 32_768
    grown = censored_length(np.array([256, 1024, 4096]), 32_768)
    assert np.all(np.diff(grown) > 0) and np.all(grown >= [256, 1024, 4096])


def test_the_plan_does_not_wait_for_the_longest_sampled_answer() -> None:
    from blendserve.scheduling.warmup import warmup_controller
    from blendserve.sim import SimConfig, simulate

    batch, truth, rare = _rare_long_family()
    tree = build_prefix_tree(batch, COST)
    sampled = select_samples(batch, tree, rate=0.01, min_subtree=100, seed=0)
    controller = warmup_controller(batch, tree, sampled, COST, kv_capacity_tokens=200_000)
    simulate(batch, truth, COST, controller, SimConfig(kv_capacity_tokens=200_000))
    # Fillers run only until the long samples pass LONG_AFTER tokens, not through their 6-10k tokens.
    assert controller.inner is not None and controller.unplanned < 0.5 * (len(batch) - len(sampled))
    assert controller.estimates is not None and np.median(controller.estimates.mean[rare]) > 1_000


# A list policy, so the first plan can be re-planned (a run-time controller's is not: is_list); and blendserve,
# whose first plan runs a quick list while it is made, which must not land again on a re-plan's rest.
@pytest.mark.parametrize("policy", ["blendserve[spread]", "blendserve"])
def test_online_replans_keep_every_request_once_and_stay_lists(policy, monkeypatch) -> None:
    import blendserve.scheduling.warmup as warmup
    from blendserve.sim import SimConfig, simulate

    monkeypatch.setattr(warmup, "REPLAN_AT", (0.3, 0.5, 0.7))
    batch, truth, _ = _rare_long_family(n=1500, family=12)
    tree = build_prefix_tree(batch, COST)
    sampled = select_samples(batch, tree, rate=0.02, min_subtree=50, seed=0)
    controller = warmup.warmup_controller(batch, tree, sampled, COST, kv_capacity_tokens=100_000, policy=policy)
    admitted = record_admissions(controller)
    simulate(batch, truth, COST, controller, SimConfig(kv_capacity_tokens=100_000))
    assert sorted(admitted) == list(range(len(batch)))
    assert controller.replans == 3 and warmup.is_list(controller.inner)  # a re-plan never books blind
    assert controller._quick_list == "none"  # a re-plan runs the earlier plan meanwhile, not a quick list
    assert controller.cohort > len(sampled)  # the last one learnt from more than the sample


def test_a_replan_that_keeps_the_running_plan_admits_what_it_would_have(monkeypatch) -> None:
    """The re-plan's ``keep`` candidate is the running plan over the rest: picked, the run goes on as without it."""
    import blendserve.scheduling.choice as choice
    import blendserve.scheduling.warmup as warmup
    from blendserve.sim import SimConfig, simulate

    batch, truth, _ = _rare_long_family(n=1500, family=12)
    tree = build_prefix_tree(batch, COST)
    sampled = select_samples(batch, tree, rate=0.02, min_subtree=50, seed=0)
    config = SimConfig(kv_capacity_tokens=100_000)

    def run() -> tuple[list[int], warmup.WarmupController]:
        controller = warmup.warmup_controller(batch, tree, sampled, COST, kv_capacity_tokens=100_000,
                                              policy="blendserve")
        admitted = record_admissions(controller)
        simulate(batch, truth, COST, controller, config)
        return admitted, controller

    monkeypatch.setattr(warmup, "REPLAN_AT", ())
    once, _ = run()
    monkeypatch.setattr(warmup, "REPLAN_AT", (0.3, 0.5, 0.7))
    seen: list[set[str]] = []
    real_pick = choice.pick

    def keep_when_offered(times, prefer=()):  # type: ignore[no-untyped-def]
        seen.append(set(times))
        return choice.KEEP if choice.KEEP in times else real_pick(times, prefer)

    told: list[str | None] = []  # the running candidate each re-plan was told
    real_replan = choice.pick_replan

    def replan(times, gain=choice.CLEAR_GAIN, running=None):  # type: ignore[no-untyped-def]
        told.append(running)
        return real_replan(times, gain, running)

    monkeypatch.setattr(choice, "pick", keep_when_offered)
    monkeypatch.setattr(choice, "pick_replan", replan)
    kept, controller = run()
    offered = [choice.KEEP in names for names in seen]  # each plan picks twice (``choose``'s two rounds)
    assert controller.replans == 3 and sum(offered) == 2 * 3 and not any(offered[:2])  # on re-plans only
    assert kept == once
    # each plan's choice is recorded: the first plan's, then the three re-plans', which kept it
    assert controller.choices[0] in choice.BLENDS | {"dual-scan", "static", "fcfs", "balance"}
    assert controller.choices[1:] == [choice.KEEP] * 3
    assert told == [controller.choices[0]] * 3  # each re-plan knows the candidate still running


@pytest.mark.parametrize("cap", [None, 0.25])
def test_the_plan_waits_for_at_most_a_quarter_of_the_shard(cap, monkeypatch) -> None:
    """A sampled answer of 250 tokens finishes before LONG_AFTER lets the plan go without it; on a slow
    engine that is minutes, while short fillers stream through. MAX_BEFORE_PLAN stops the fillers."""
    import blendserve.scheduling.warmup as warmup
    from blendserve.scheduling.plan_worker import InlinePlan
    from blendserve.sim import SimConfig, simulate

    if cap is None:
        monkeypatch.setattr(warmup, "MAX_BEFORE_PLAN", 1.0)  # the rule off: what the fillers would take
    batch, truth, rare = _rare_long_family(n=400, family=12)
    truth[rare] = 250
    batch.sim_output_tokens = truth.astype(np.int32)
    tree = build_prefix_tree(batch, COST)
    sampled = select_samples(batch, tree, rate=0.02, min_subtree=50, seed=0)
    assert len(set(sampled.tolist()) & set(rare.tolist())) > 0
    # the rule is when the plan starts: made inline, no filler runs while it is made
    controller = warmup.warmup_controller(batch, tree, sampled, COST, kv_capacity_tokens=200_000,
                                          worker=InlinePlan())
    admitted = record_admissions(controller)
    simulate(batch, truth, COST, controller, SimConfig(kv_capacity_tokens=200_000))
    assert sorted(admitted) == list(range(len(batch)))  # every request once, either way
    before_plan = (len(sampled) + controller.unplanned) / len(batch)
    if cap is None:
        assert before_plan > 0.3  # 35% on this seed
    else:
        assert before_plan <= 0.25 + 1 / len(batch)
        # the long samples still running were counted at their expected length given their progress
        assert np.median(controller.estimates.mean[rare]) > truth[:-12].max()


def _captions_batch(captions: int = 60, questions: int = 4, singles: int = 200):  # type: ignore[no-untyped-def]
    """A labelling job under one hot system prompt: ``questions`` requests share each cold caption prefix,
    beside ``singles`` requests under another hot prompt that share nothing more."""
    rng = np.random.default_rng(1)
    system, other = [7] * 20, [8] * 20
    prompts = [system + [1000 + c] * 30 + [50 + q] for c in range(captions) for q in range(questions)]
    prompts += [other + [2000 + i] + list(rng.integers(3000, 9000, 11)) for i in range(singles)]
    order = rng.permutation(len(prompts))  # the file's order: siblings scattered
    return batch_from_prompts([prompts[i] for i in order], max_tokens=1000), order < captions * questions


def test_fillers_keep_each_cold_prefix_unit_together_in_a_random_order_of_units() -> None:
    """The warm-up's fillers run before the plan: a random order of single requests split the questions of a
    caption, and the caption had to be prefilled again for each (vLLM-CPU large peer batch, 47.5% of label
    prompt tokens cached against 58.6% in the sorted file)."""
    from blendserve.scheduling.blend import prefix_units
    from blendserve.scheduling.warmup import filler_order

    batch, is_caption = _captions_batch()
    tree = build_prefix_tree(batch, COST)
    units = prefix_units(tree)[tree.request_leaf]
    assert len(np.unique(units[is_caption])) == 60  # one unit per caption
    assert len(np.unique(units[~is_caption])) == 200  # a hot prefix binds nothing: one unit per request
    others = np.flatnonzero(np.arange(len(batch)) % 7 != 0)  # the sample taken out
    orders = [filler_order(tree, np.arange(len(batch)), others, seed) for seed in (0, 1)]
    for order in orders:
        assert sorted(order.tolist()) == others.tolist()  # each filler once
        seen = units[order]
        runs = np.flatnonzero(np.diff(seen) != 0)  # unit changes along the order
        assert len(runs) + 1 == len(np.unique(seen))  # every unit is one contiguous run
        early = is_caption[order[: len(order) // 4]].mean()
        assert 0.35 < early < 0.75  # a blend: the first quarter holds both kinds near their share (0.55)
    assert orders[0].tolist() != orders[1].tolist()  # seeded


def test_fillers_in_pieces_cut_a_large_unit_and_leave_small_ones_whole() -> None:
    """``piece``: a unit's requests in runs of at most that many, so a unit of many long answers does not start
    as one burst; a caption's four questions (a unit of 4) stay one run."""
    from blendserve.scheduling.blend import prefix_units
    from blendserve.scheduling.warmup import filler_order

    batch, is_caption = _captions_batch(captions=20, questions=12, singles=1200)  # a caption under 1% of leaves
    tree = build_prefix_tree(batch, COST)
    units = prefix_units(tree)[tree.request_leaf]
    assert len(np.unique(units[is_caption])) == 20  # one unit a caption
    others = np.arange(len(batch))
    for piece in (4, 5, 12):  # 12 questions a caption: 4+4+4, 5+5+2, one run
        order = filler_order(tree, others, others, 0, piece=piece)
        assert sorted(order.tolist()) == others.tolist()  # each filler once
        position = np.argsort(order)
        cut = 0
        for unit in np.unique(units[is_caption]):
            members = np.flatnonzero(units == unit)
            members = members[np.argsort(tree.request_leaf[members], kind="stable")]  # leaf order
            chunks = [members[k : k + piece] for k in range(0, len(members), piece)]
            for chunk in chunks:  # each piece one run, in leaf order
                assert np.diff(position[chunk]).tolist() == [1] * (len(chunk) - 1)
            cut += len(np.unique(np.diff(np.sort(position[members])) > 1)) > 1
        assert (cut > 15) == (piece < 12)  # pieces of a caption land apart (a few next to each other by chance)
    batch4, _ = _captions_batch()  # four questions a caption: pieces of 4 are its units
    tree4 = build_prefix_tree(batch4, COST)
    units4 = prefix_units(tree4)[tree4.request_leaf]
    seen4 = units4[filler_order(tree4, np.arange(len(batch4)), np.arange(len(batch4)), 3, piece=4)]
    assert np.count_nonzero(np.diff(seen4)) + 1 == len(np.unique(seen4))  # every unit still one run


@pytest.mark.parametrize("progress, planned", [(2048, False), (4096, True)])
def test_a_finished_long_sample_does_not_hold_the_plan_until_the_other_long_ones_end(progress, planned) -> None:
    """One long answer finished at 9,000 tokens: the others count as long once past LONG_ENOUGH, not only
    once past LONG_FACTOR x 9,000 (beyond the cap: when they end)."""
    from blendserve.scheduling.admission import StaticOrder
    from blendserve.scheduling.plan_worker import InlinePlan
    from blendserve.scheduling.warmup import LONG_ENOUGH, WarmupController

    class Planner:
        def __init__(self) -> None:
            self.calls: list[dict[int, float]] = []  # the evidence of every estimate made

        def estimate(self, observed, running):  # type: ignore[no-untyped-def]
            self.calls.append(dict(observed))
            return None

        def plan(self, rest, estimates, lists_only, keep=None):  # type: ignore[no-untyped-def]
            return StaticOrder(np.arange(len(rest)))

    planner = Planner()
    controller = WarmupController(np.array([0, 1, 2]), np.arange(3, 40), planner, np.full(40, 32_768),
                                  worker=InlinePlan())
    state = EngineState(running=0, waiting=0, kv_used_tokens=0, kv_total_tokens=450_000)
    assert [controller.next_request(state) for _ in range(3)] == [0, 1, 2]
    controller.on_finish(0, 9_000)
    controller.on_progress(1, progress)
    controller.on_progress(2, progress)
    controller.next_request(state)
    assert (controller.inner is not None) is planned
    assert progress < LONG_ENOUGH or planner.calls[-1][1] > 9_000  # counted at its expected length, not 4,096
