"""The three engines on one plan: the same requests succeed; the real engines answer greedily alike.

Greedy answers are compared in float32: in bfloat16 the two engines' kernels
round differently and about a third of 16-token answers part ways at a
near-tie (measured: 16 of 24 identical in bf16, 23 of 24 in fp32).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from blendserve.engines import EngineRequest, engine_session
from blendserve.scheduling.admission import StaticOrder

pytestmark = pytest.mark.engine
FP32 = {"vllm": {"dtype": "float32"}, "transformers": {"dtype": "float32", "num_blocks": 512}}


def fixture_requests(tokenizer, fixtures_dir) -> list[EngineRequest]:
    """The mini fixture's chats and prompts (tails of the long ones), as chat requests of 16 tokens."""
    chats = []
    for line in (fixtures_dir / "mini.jsonl").read_text().splitlines()[:12]:
        body = json.loads(line).get("body") or json.loads(line)
        chats.append(body.get("messages") or [{"role": "user", "content": body["prompt"][-500:]}])
    prompts = tokenizer.encode_chats(chats)
    requests = [EngineRequest(f"m{i}", list(p), max_tokens=16) for i, p in enumerate(prompts)]
    requests.insert(5, EngineRequest("too-long", [42] * 3000, max_tokens=8))  # beyond the 2048-token context
    return requests


def serve(config, requests) -> dict:
    results = []
    with engine_session(config) as engine:
        engine.run(requests, StaticOrder(np.arange(len(requests))), results.append)
    assert len(results) == len(requests)
    return {r.request_id: r for r in results}


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_engines_agree_on_success_and_greedy_answers(make_config, tokenizer):
    from pathlib import Path

    requests = fixture_requests(tokenizer, Path(__file__).parent / "fixtures")
    by_engine = {name: serve(make_config(engine=name, extra=FP32), requests)
                 for name in ("vllm", "transformers", "simulator")}
    ok = {name: {k for k, r in results.items() if r.status == "ok"} for name, results in by_engine.items()}
    assert ok["vllm"] == ok["transformers"] == ok["simulator"] == {r.request_id for r in requests} - {"too-long"}

    vllm, hf = by_engine["vllm"], by_engine["transformers"]
    identical = [k for k in ok["vllm"] if vllm[k].output_token_ids == hf[k].output_token_ids]
    assert len(identical) >= 0.9 * len(ok["vllm"])
    for k in ok["vllm"]:  # where they differ, only after a shared start (a near-tie, not a different model)
        a, b = vllm[k].output_token_ids, hf[k].output_token_ids
        assert common_prefix(a, b) >= min(4, len(a), len(b)), (k, a, b)
        if a == b:
            assert vllm[k].text == hf[k].text
