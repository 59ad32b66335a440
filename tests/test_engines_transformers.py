"""transformers continuous batching on SmolLM2 from the GGUF: plan order kept, refusals per request."""

from __future__ import annotations

import numpy as np
import pytest

from blendserve.engines import EngineRequest, engine_session
from blendserve.engines.common import TIMELINE_KEYS
from blendserve.scheduling.admission import StaticOrder

pytestmark = pytest.mark.engine
KV_BLOCKS = 48  # x 32 tokens: set explicitly, the library default sizes the cache from system RAM


def transformers_config(make_config):
    return make_config(engine="transformers", extra={"transformers": {"num_blocks": KV_BLOCKS}})


def test_every_request_is_answered_once_and_refusals_stay_per_request(make_config, tokenizer):
    chats = [[{"role": "user", "content": f"Give one word for the colour of {thing}."}]
             for thing in ("grass", "snow", "the sky", "coal", "blood")]
    prompts = tokenizer.encode_chats(chats)
    requests = [EngineRequest(f"c{i}", list(p), max_tokens=8) for i, p in enumerate(prompts)]
    requests.insert(1, EngineRequest("too-long", [42] * 3000, max_tokens=8))  # beyond the 2048-token context
    requests.insert(3, EngineRequest("sampled", list(prompts[0]), max_tokens=8, temperature=0.8))
    requests.insert(4, EngineRequest("cache-overflow", [42] * 1700, max_tokens=40))  # more KV than 48 blocks hold
    results = []
    order = list(range(len(requests)))[::-1]
    with engine_session(transformers_config(make_config)) as engine:
        stats = engine.run(requests, StaticOrder(order), results.append)
    by_id = {r.request_id: r for r in results}
    assert len(results) == len(requests) == len(by_id) and stats.order == order  # one each, in the plan's order
    assert {k for k, r in by_id.items() if r.status == "error"} == {"too-long", "sampled", "cache-overflow"}
    assert "context" in by_id["too-long"].error and "temperature" in by_id["sampled"].error
    assert "KV" in by_id["cache-overflow"].error
    for i in range(len(prompts)):
        result = by_id[f"c{i}"]
        assert result.status == "ok" and 0 < result.num_output_tokens <= 8 and result.finish_reason in ("stop", "length")
        assert result.text.strip() and result.num_output_tokens == len(result.output_token_ids)
    assert stats.timeline and set(stats.timeline[0]) == set(TIMELINE_KEYS)
    assert all(row["kv_total_tokens"] == KV_BLOCKS * 32 for row in stats.timeline)


def test_shared_prefixes_hit_the_block_cache_and_greedy_repeats(make_config, tokenizer):
    preamble = "Background: " + "The harbour town lives from fishing, salt and small boat repairs. " * 10
    prompts = tokenizer.encode_chats([[{"role": "user", "content": preamble + f"Question {i}: who lives there?"}]
                                      for i in range(6)])
    requests = [EngineRequest(f"p{i}", list(p), max_tokens=6) for i, p in enumerate(prompts)]
    with engine_session(transformers_config(make_config)) as engine:
        first, again = [], []
        engine.run(requests, StaticOrder(np.arange(len(requests))), first.append)
        stats = engine.run(requests, StaticOrder(np.arange(len(requests))), again.append)
    assert stats.cached_prompt_tokens >= len(requests) * 32 * 3  # each prompt finds at least its preamble's blocks
    texts = {r.request_id: r.output_token_ids for r in first}
    assert all(texts[r.request_id] == r.output_token_ids for r in again)
