"""Dual scan: the memory split, the admission controller, the static order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blendserve.scheduling.admission import EngineState
from blendserve.scheduling.dual_scan import (
    LEFT, RIGHT, DualScanController, ScanItems, item_work, memory_split, static_dual_scan_order,
)
from blendserve.scheduling.dual_scan_projected import ProjectedDualScan, projected_peak

STATE = EngineState(running=0, waiting=0, kv_used_tokens=0, kv_total_tokens=0)


def test_worked_example_memory_split() -> None:
    m_left, m_right = memory_split(60.0, rho_t=1.27, rho_l=3.73, rho_r=0.096)
    assert m_left == pytest.approx(19.38, abs=0.05)
    assert m_left + m_right == pytest.approx(60.0)


@pytest.mark.parametrize("rho_t, expected_left", [(5.0, 60.0), (0.01, 0.0)])
def test_split_is_clamped_when_target_is_outside_the_cursors(rho_t: float, expected_left: float) -> None:
    assert memory_split(60.0, rho_t, 3.73, 0.096)[0] == expected_left


def _items(n: int, groups: int, seed: int) -> ScanItems:
    rng = np.random.default_rng(seed)
    group = np.sort(rng.integers(0, groups, size=n))
    density = np.sort(rng.uniform(0.05, 50, size=groups))[::-1]
    return ScanItems(
        requests=rng.permutation(n),
        group=group,
        group_density=density,
        kv_charge=rng.integers(10, 400, size=n).astype(np.float64),
        target_density=float(np.median(density)),
    )


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.integers(1, 12), st.integers(0, 10_000), st.integers(400, 5000))
def test_controller_admits_everything_once_within_each_share(n: int, groups: int, seed: int, capacity: int) -> None:
    items = _items(n, groups, seed)
    controller = DualScanController(items, capacity)
    rng = np.random.default_rng(seed)
    admitted: list[int] = []
    running: list[int] = []
    while controller.remaining():
        share, used = list(controller.share), list(controller.used)
        index = controller.next_request(STATE)
        if index is None:
            assert running, "the controller stalled with nothing running"
            done = running.pop(int(rng.integers(len(running))))
            controller.on_finish(done, 1)
            continue
        admitted.append(index)
        running.append(index)
        side, charge = controller.inflight[index]
        # Within the side's share as it stood, or the one request an empty side may always take.
        assert used[side] + charge <= share[side] or used[side] == 0
    assert sorted(admitted) == sorted(items.requests.tolist())


def test_left_takes_compute_heavy_right_takes_memory_heavy_first() -> None:
    items = ScanItems(
        requests=np.arange(8),
        group=np.array([0, 0, 1, 1, 2, 2, 3, 3]),
        group_density=np.array([10.0, 5.0, 0.5, 0.1]),
        kv_charge=np.full(8, 10.0),
        target_density=2.0,
    )
    controller = DualScanController(items, capacity_tokens=40)
    first = [controller.next_request(STATE) for _ in range(4)]
    # M_L = 40 (2 - 0.1) / (10 - 0.1) = 7.7 tokens: one left request (an empty side may always take one), M_R three.
    assert set(first) == {0, 7, 6, 5}
    assert controller.splits >= 1


def _items_with_outputs(n: int, groups: int, seed: int) -> ScanItems:
    base = _items(n, groups, seed)
    output = np.random.default_rng(seed + 1).integers(1, 2000, size=n).astype(np.float64)
    return ScanItems(base.requests, base.group, base.group_density, base.kv_charge + output, base.target_density, output)


def test_static_order_is_a_permutation_and_starts_from_both_ends() -> None:
    items = _items_with_outputs(500, 10, seed=1)
    stream, sides = static_dual_scan_order(items)
    assert sorted(stream.tolist()) == list(range(500))
    left = stream[sides == 0]
    right = stream[sides == 1]
    assert np.all(np.diff(left) == 1) and np.all(np.diff(right) == -1)
    assert len(left) and len(right) and left.max() < right.min()


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 300), st.integers(1, 20), st.integers(0, 10_000))
def test_static_order_keeps_the_admitted_streams_density_at_the_jobs(n: int, groups: int, seed: int) -> None:
    base = _items_with_outputs(n, groups, seed)
    compute, reads = item_work(base)
    by_density = np.argsort(-(compute / reads), kind="stable")  # the planner's order: compute-heavy first
    items = ScanItems(base.requests[by_density], base.group, base.group_density, base.kv_charge[by_density],
                      base.target_density, base.output_est[by_density])
    stream, _ = static_dual_scan_order(items, lead=0.0)
    compute, reads = compute[by_density], reads[by_density]
    c_share, m_share = compute / compute.sum(), reads / reads.sum()
    gap = np.abs(np.cumsum(c_share[stream]) - np.cumsum(m_share[stream]))
    assert gap.max() <= max(c_share.max(), m_share.max()) + 1e-9  # never more than one item off the target blend
    # With a lead the memory-heavy side runs ahead: its reads are admitted sooner along the list.
    led, _ = static_dual_scan_order(items, lead=0.05)
    assert np.all(np.cumsum(m_share[led]) >= np.cumsum(m_share[stream]) - max(m_share.max(), c_share.max()) - 1e-9)


def test_projected_peak_counts_growth_until_each_request_ends() -> None:
    # Two requests: 10 KV now with 100 steps left, and 50 now with 5 left.
    # Just before the short one ends (tau = 4): 14 + 54 = 68; later the long one alone peaks at 10 + 99 = 109.
    assert projected_peak(np.array([10.0, 50.0]), np.array([100.0, 5.0])) == 109.0
    assert projected_peak(np.array([10.0, 50.0]), np.array([3.0, 5.0])) == 12.0 + 52.0  # tau = 2
    assert projected_peak(np.zeros(0), np.zeros(0)) == 0.0
    assert projected_peak(np.array([10.0, 50.0]), np.array([100.0, 5.0]), horizon=2.0) == 12.0 + 52.0


def _blend_items(n_left: int, n_right: int, target: float) -> ScanItems:
    # Left: 300-token prompts with 10-token outputs (density 10); right: 10-token prompts, 4000-token decodes.
    output = np.concatenate([np.full(n_left, 10.0), np.full(n_right, 4000.0)])
    n = n_left + n_right
    return ScanItems(
        requests=np.arange(n), group=(np.arange(n) >= n_left).astype(np.int64), group_density=np.array([10.0, 0.1]),
        kv_charge=np.concatenate([np.full(n_left, 300.0), np.full(n_right, 10.0)]) + output,
        target_density=target, output_est=output,
    )


def _side_peak(controller: ProjectedDualScan, side: int, horizon: float = np.inf) -> float:
    return projected_peak(*controller._side_state(side), horizon=horizon)


def test_left_side_borrows_what_the_right_side_will_not_reach_in_its_lifetime() -> None:
    items = _blend_items(60, 10, target=1.0)  # rho_t >= 1: not paced
    controller = ProjectedDualScan(items, 10_000, lookahead=1)  # the right cursor strictly in order
    assert controller.share[LEFT] == pytest.approx(909.1, abs=0.1)  # M (1 - 0.1) / (10 - 0.1)
    for _ in range(40):
        if controller.next_request(STATE) is None:
            break
        left_horizon = max(controller._side_state(LEFT)[1].max(initial=0.0), 1.0)
        # The invariant: the left's projected peak plus the right's KV within the left's lifetime fits the KV.
        assert _side_peak(controller, LEFT) + _side_peak(controller, RIGHT, left_horizon) <= controller.capacity
    assert _side_peak(controller, RIGHT) > 2 * 4000  # two long decodes projected to ~8,000 of 10,000 tokens
    assert _side_peak(controller, LEFT) > controller.share[LEFT]  # more than M_L: borrowed from the right's future


def test_memory_bound_job_paces_the_left_side_by_memory_progress() -> None:
    items = _blend_items(60, 10, target=0.5)  # rho_t < 1: memory decides the end
    controller = ProjectedDualScan(items, 12_000, lookahead=1, pace_slack=0.02)
    admitted = [controller.next_request(STATE) for _ in range(40)]
    assert None in admitted
    first_stall = admitted.index(None)
    right = [i for i in admitted[:first_stall] if i >= 60]
    assert right, "the right side starts while the left is paced"
    total = 60 * 310.0 + 10 * 4010.0
    assert controller.compute_admitted / total <= 0.02 + 310.0 / total  # one admission past the slack at most
    for index in right:
        controller.on_progress(index, 2000)  # half of each decode done: memory progress moves
    assert controller.next_request(STATE) is not None


def _memory_heavy_items(n: int, output: float) -> ScanItems:
    # Item 0 is a compute-heavy group the target gives no memory (M_L = 0); the rest are long decodes.
    return ScanItems(
        requests=np.arange(n), group=np.minimum(np.arange(n), 1), group_density=np.array([10.0, 0.1]),
        kv_charge=np.full(n, 10.0 + output), target_density=0.1, output_est=np.full(n, output),
    )


def test_projected_scan_staggers_long_decodes_that_peak_charges_would_hold_back() -> None:
    items = _memory_heavy_items(40, output=1000.0)
    peak, projected = DualScanController(items, 5000), ProjectedDualScan(items, 5000, headroom=0.0)
    assert sum(peak.next_request(STATE) is not None for _ in range(10)) == 4  # 4 x 1010 tokens of 5000
    started = [projected.next_request(STATE) for _ in range(10)]
    assert sum(i is not None for i in started) == 4  # started together they peak together: no more room
    for index in started[:4]:
        projected.on_progress(index, 900)  # 100 steps from their end: a newcomer peaks after they are gone
    assert projected.next_request(STATE) is not None
    assert peak.next_request(STATE) is None  # peak charges still see the share as full
    assert projected._load(RIGHT) <= projected.share[RIGHT]


def _long_then_short_items(n_long: int, n_short: int) -> ScanItems:
    # Left: one compute-heavy item with no memory share; right end: n_long decodes of 1000, before them shorter ones of 300.
    n = 1 + n_short + n_long
    output = np.concatenate([[1.0], np.full(n_short, 300.0), np.full(n_long, 1000.0)])
    return ScanItems(
        requests=np.arange(n), group=np.minimum(np.arange(n), 1), group_density=np.array([10.0, 0.1]),
        kv_charge=10.0 + output, target_density=0.1, output_est=output,
    )


def test_right_window_puts_short_decodes_beside_the_long_wave() -> None:
    items = _long_then_short_items(n_long=10, n_short=10)
    in_order = ProjectedDualScan(items, 2100, lookahead=1, headroom=0.0)
    window = ProjectedDualScan(items, 2100, lookahead=16, headroom=0.0)
    # Two long decodes peak at 2 x 1009 = 2018 of 2100: strictly in order nothing else fits until they end.
    assert [in_order.next_request(STATE) for _ in range(3)] == [20, 19, None]
    first = [window.next_request(STATE) for _ in range(3)]
    assert first[:2] == [20, 19]
    # A 300-token decode ends long before the long ones peak: 2 x 309 + 309 = 927 at tau = 299.
    assert first[2] is not None and items.output_est[first[2]] == 300.0
    assert window.remaining() == len(items.requests) - 3


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 200), st.integers(1, 64), st.integers(0, 10_000))
def test_window_scan_admits_every_item_exactly_once(n: int, lookahead: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = _items(n, 5, seed)
    output = rng.integers(1, 300, size=n).astype(np.float64)
    items = ScanItems(base.requests, base.group, base.group_density, output + 20.0, base.target_density, output)
    controller = ProjectedDualScan(items, 2000, lookahead=lookahead)
    admitted: list[int] = []
    running: list[int] = []
    while controller.remaining():
        index = controller.next_request(STATE)
        if index is None:
            assert running, "the controller stalled with nothing running"
            controller.on_finish(running.pop(int(rng.integers(len(running)))), 1)
            continue
        admitted.append(index)
        running.append(index)
    assert sorted(admitted) == sorted(items.requests.tolist())
    assert controller.next_request(STATE) is None


def test_shared_prefix_is_charged_once() -> None:
    output = np.array([2.0, 2.0, 2.0])
    items = ScanItems(
        requests=np.arange(3), group=np.zeros(3, dtype=np.int64), group_density=np.array([50.0]),
        kv_charge=np.array([1002.0, 1002.0, 1002.0]), target_density=50.0, output_est=output,
        shared_prompt=np.array([0.0, 900.0, 1000.0]),  # the third is a duplicate of the second
    )
    assert ProjectedDualScan._private_prompt(items).tolist() == [1000.0, 100.0, 1.0]
