"""vLLM-CPU on SmolLM2, stream and static modes: real engine state drives admission; errors stay per request."""

from __future__ import annotations

import numpy as np
import pytest

from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.engines import EngineRequest, engine_session
from blendserve.engines.common import TIMELINE_KEYS, estimated_output
from blendserve.scheduling.admission import planned_order, EngineState, StaticOrder
from synthetic import batch_from_prompts
from blendserve.scheduling.registry import PolicyContext, make_controller

pytestmark = pytest.mark.engine
TOPICS = ["rivers", "volcanoes", "bread", "chess", "owls", "glaciers", "jazz", "bridges", "comets", "tea"]


class Recorded:
    """A controller that remembers the engine state it was shown at each decision."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.states: list[EngineState] = []
        self.finished: list[int] = []

    def next_request(self, state: EngineState):
        self.states.append(state)
        return self.inner.next_request(state)

    def on_progress(self, index: int, output_tokens: int) -> None:
        self.inner.on_progress(index, output_tokens)

    def on_finish(self, index: int, output_tokens: int) -> None:
        self.finished.append(index)
        self.inner.on_finish(index, output_tokens)

    def remaining(self) -> int:
        return self.inner.remaining()


def mixed_requests(tokenizer, n: int, max_tokens: int = 12) -> list[EngineRequest]:
    """Chat prompts on a few topics: short questions and a long shared preamble, like a real mixed file."""
    preamble = "Read the notes and answer. " + "Notes: water, stone, light and time shape everything. " * 8
    chats = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        text = f"{preamble}Question {i}: what is special about {topic}?" if i % 2 else f"One fact about {topic}, please."
        chats.append([{"role": "user", "content": text}])
    prompts = tokenizer.encode_chats(chats)
    return [EngineRequest(f"q{i}", list(p), max_tokens=max_tokens) for i, p in enumerate(prompts)]


def vllm_config(make_config, mode: str):
    return make_config(extra={"vllm_mode": mode})  # the mode is per run: the session's one engine serves both


def test_stream_mode_decides_from_real_engine_state_and_keeps_the_queue_short(make_config, tokenizer):
    requests = mixed_requests(tokenizer, 80)
    controller = Recorded(StaticOrder(np.arange(len(requests))))
    results = []
    with engine_session(vllm_config(make_config, "stream")) as engine:
        stats = engine.run(requests, controller, results.append)
        capacity = engine.kv_total_tokens
    assert len(results) == len(requests) and stats.errors == 0 and stats.mode == "stream"
    assert capacity > 0 and all(s.kv_total_tokens == capacity for s in controller.states)
    assert any(s.kv_used_tokens > 0 and s.running > 0 for s in controller.states)  # vLLM's own numbers, not zeros
    assert sorted(controller.finished) == list(range(len(requests)))
    assert stats.timeline and set(stats.timeline[0]) == set(TIMELINE_KEYS)
    assert max(row["waiting"] for row in stats.timeline) <= make_config().max_num_seqs  # never a whole list queued
    assert sum(row["decode_tokens"] for row in stats.timeline) >= stats.output_tokens - len(requests)
    assert sum(row["prefix_hits"] for row in stats.timeline) > 0  # the shared preamble hits the prefix cache


def test_static_mode_submits_the_whole_plan_in_order(make_config, tokenizer):
    requests = mixed_requests(tokenizer, 80)
    order = list(np.random.default_rng(0).permutation(len(requests)))
    results = []
    with engine_session(vllm_config(make_config, "static")) as engine:
        stats = engine.run(requests, StaticOrder(order), results.append)
    assert stats.mode == "static" and stats.order == order
    assert sorted(r.request_id for r in results) == sorted(r.request_id for r in requests) and stats.errors == 0
    assert max(row["waiting"] for row in stats.timeline) > make_config().max_num_seqs  # everything queued at once


@pytest.mark.parametrize("mode", ["stream", "static"])
def test_dual_scan_admission_on_vllm_answers_every_request_once_and_isolates_errors(make_config, tokenizer, mode):
    requests = mixed_requests(tokenizer, 30, max_tokens=16)
    requests.insert(7, EngineRequest("too-long", [42] * 3000, max_tokens=8))  # beyond the 2048-token context
    batch = batch_from_prompts([r.prompt_token_ids for r in requests], max_tokens=16)
    cost = CostModel(get_model("smollm2-135m"), get_hardware("a100-80g"))
    controller = make_controller("blendserve", PolicyContext(batch, np.full(len(batch), 16), cost, 4096))
    plan = controller.items.requests.tolist()
    results = []
    with engine_session(vllm_config(make_config, mode)) as engine:
        expected_order = planned_order(make_controller("blendserve", PolicyContext(
            batch, np.full(len(batch), 16), cost, 4096)), [estimated_output(r) for r in requests],
            engine.kv_total_tokens)
        stats = engine.run(requests, controller, results.append)
    by_id = {r.request_id: r for r in results}
    assert len(results) == len(requests) == len(by_id)
    assert by_id["too-long"].status == "error" and "context" in by_id["too-long"].error
    assert all(r.status == "ok" and 0 < r.num_output_tokens <= 16 for k, r in by_id.items() if k != "too-long")
    assert sorted(stats.order) == list(range(len(requests)))
    early = set(stats.order[:8])
    assert early & set(plan[:8]) and early & set(plan[-8:])  # the scan takes from both ends of the plan
    if mode == "static":
        assert stats.order == expected_order
