"""The simulator as an engine: dual-scan admission checked against the simulator's own KV accounting."""

from __future__ import annotations

import numpy as np
import pytest

from blendserve.batch import RequestBatch
from blendserve.engines import EngineRequest, engine_session
from blendserve.engines.common import TIMELINE_KEYS, estimated_output, requests_from_batch
from blendserve.scheduling.admission import EngineState, StaticOrder, planned_order
from blendserve.scheduling.dual_scan import DualScanController
from synthetic import synthetic_batch
from blendserve.scheduling.registry import PolicyContext, make_controller
from blendserve.sim import SimConfig, kv_capacity_tokens

CAPACITY = 24_000  # KV tokens: small enough that the shares, not the sequence limit, decide admission


class SharesChecked:
    """Wraps a DualScanController; records every admission against the share in force when it was made.

    The base controller charges each request its estimated peak KV (p + d) until it finishes; the share
    invariant below is that accounting. (The ``blendserve`` policy's projected variant charges less.)
    """

    def __init__(self, inner) -> None:
        self.inner = inner
        self.admissions: list[tuple[int, float, float, float]] = []  # (side, used before, charge, share before)
        self.engine_kv: list[tuple[int, float]] = []  # (KV the simulator holds, estimated KV the controller holds)
        self.declined = 0  # times the controller admitted nothing while requests remained

    def next_request(self, state: EngineState):
        used, share = list(self.inner.used), list(self.inner.share)
        self.engine_kv.append((state.kv_used_tokens, sum(c for _, c in self.inner.inflight.values())))
        index = self.inner.next_request(state)
        if index is None:
            self.declined += self.inner.remaining() > 0
            return None
        side, charge = self.inner.inflight[index]
        self.admissions.append((side, used[side], charge, share[side]))
        return index

    def on_progress(self, index: int, output_tokens: int) -> None:
        self.inner.on_progress(index, output_tokens)

    def on_finish(self, index: int, output_tokens: int) -> None:
        self.inner.on_finish(index, output_tokens)

    def remaining(self) -> int:
        return self.inner.remaining()


def exact_lengths(batch: RequestBatch) -> RequestBatch:
    """Known lengths equal to the simulated truth, so each request's KV charge bounds its real KV."""
    batch.expected_output_tokens = np.minimum(batch.sim_output_tokens, batch.max_tokens).astype(np.int32)
    return batch


def sim_config(make_config, **simulator):
    return make_config(engine="simulator", extra={"simulator": {"kv_capacity_tokens": CAPACITY, **simulator}})


def test_dual_scan_never_exceeds_its_shares_and_bounds_the_simulated_kv(make_config):
    batch = exact_lengths(synthetic_batch(400, mean_prompt=300, family_size=40, memory_heavy_fraction=0.4, seed=1))
    requests = requests_from_batch(batch)
    config = sim_config(make_config, prefix_cache=False)  # without cached prefixes, KV in use is exactly the running KV
    with engine_session(config) as engine:
        context = PolicyContext(batch, batch.expected_output_tokens.astype(np.int64), engine.cost, CAPACITY)
        controller = SharesChecked(DualScanController(make_controller("blendserve", context).items, CAPACITY))
        results = []
        stats = engine.run(requests, controller, results.append)

    assert sorted(r.request_id for r in results) == sorted(batch.request_ids) and stats.errors == 0
    assert controller.declined > 0  # memory, not the sequence limit, held admission back at times
    sides = {side for side, *_ in controller.admissions}
    assert sides == {0, 1}  # both cursors admitted
    for side, used, charge, share in controller.admissions:
        assert used == 0 or used + charge <= share + 1e-6, (side, used, charge, share)
    assert all(held <= charged + 1e-6 for held, charged in controller.engine_kv)
    assert max(held for held, _ in controller.engine_kv) > CAPACITY / 2  # the check ran with the cache well used


def test_results_carry_simulated_timings_and_outputs_of_the_true_length(make_config):
    batch = synthetic_batch(60, mean_prompt=120, family_size=20, seed=2)
    requests = requests_from_batch(batch)
    with engine_session(sim_config(make_config)) as engine:
        results = []
        stats = engine.run(requests, StaticOrder(np.arange(len(requests))), results.append)
    by_id = {r.request_id: r for r in results}
    for request in requests:
        result = by_id[request.request_id]
        expected = min(request.sim_output_tokens, request.max_tokens)
        assert result.status == "ok" and result.num_output_tokens == len(result.output_token_ids) == expected
        assert result.started_at <= result.finished_at
    span = max(r.finished_at for r in results) - min(r.started_at for r in results)
    assert span.total_seconds() == pytest.approx(stats.wall_seconds, rel=1e-3)  # simulated, not wall-clock, time
    assert stats.timeline and set(stats.timeline[0]) == set(TIMELINE_KEYS)
    assert sum(row["admitted"] for row in stats.timeline) == len(requests)
    assert 0 < stats.prefix_hit_rate < 1  # families share prefixes through the radix cache
    # each row carries its first start's hit, as vLLM's do, and the shard's total is their sum
    assert stats.cached_prompt_tokens == sum(r.num_cached_tokens for r in results)
    assert all(0 <= r.num_cached_tokens < r.num_prompt_tokens for r in results)


def test_refused_requests_become_errors_and_the_rest_run(make_config):
    ok = [EngineRequest(f"ok{i}", [5, 6, 7, 8 + i], max_tokens=8) for i in range(4)]
    too_long = EngineRequest("too-long", [3] * 5000, max_tokens=8)  # beyond the 2048-token context
    too_big = EngineRequest("too-big", [3] * 1000, max_tokens=64, sim_output_tokens=1000)
    empty = EngineRequest("empty", [], max_tokens=8)
    requests = [ok[0], too_long, ok[1], too_big, empty, ok[2], ok[3]]
    with engine_session(sim_config(make_config, kv_capacity_tokens=1050)) as engine:
        results = []
        stats = engine.run(requests, StaticOrder(np.arange(len(requests))), results.append)
    by_id = {r.request_id: r for r in results}
    assert len(results) == len(requests) == len(by_id)
    assert {k for k, r in by_id.items() if r.status == "error"} == {"too-long", "too-big", "empty"}
    assert "context" in by_id["too-long"].error and "KV" in by_id["too-big"].error
    assert stats.errors == 3 and all(by_id[r.request_id].num_output_tokens == 8 for r in ok)


def test_planned_order_of_a_static_list_is_the_list_and_dual_scan_takes_both_ends():
    requests = [EngineRequest(f"r{i}", [1, 2, i + 3], max_tokens=4) for i in range(6)]
    assert planned_order(StaticOrder([5, 0, 3, 1, 4, 2]), [estimated_output(r) for r in requests]) == [5, 0, 3, 1, 4, 2]
    batch = exact_lengths(synthetic_batch(200, mean_prompt=200, family_size=20, memory_heavy_fraction=0.5, seed=3))
    from blendserve.costmodel import CostModel, get_hardware, get_model

    cost = CostModel(get_model("smollm2-135m"), get_hardware("a100-80g"))
    capacity = kv_capacity_tokens(cost, SimConfig(kv_capacity_tokens=8000))
    controller = make_controller("blendserve[dual-scan]", PolicyContext(
        batch, batch.expected_output_tokens.astype(np.int64), cost, capacity))
    items = controller.items.requests
    order = planned_order(controller, [estimated_output(r) for r in requests_from_batch(batch)], capacity)
    assert sorted(order) == list(range(len(batch)))
    first = set(order[:20])
    assert first & set(items[:20].tolist()) and first & set(items[-20:].tolist())  # from the left and the right
