"""The simulator's prefix cache pinned to vLLM's: siblings that share a prefix hit it whether or not they start together.

vLLM caches a request's full KV blocks when it allocates them for a step, so
of two prompts sharing a prefix the second hits it even when both are
scheduled in the same step; hits are whole blocks. The simulator must give
the same per-request ``num_cached_tokens`` for the same prompts.
"""

from __future__ import annotations

import numpy as np
import pytest

from blendserve.batch import UNKNOWN, RequestBatch
from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.engines import EngineRequest, EngineResult, engine_session
from blendserve.scheduling.admission import StaticOrder
from blendserve.sim import SimConfig, simulate

pytestmark = pytest.mark.engine

COST = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))  # only timing depends on it, not cache hits


def sibling_prompts(seed: int, shared: int) -> list[np.ndarray]:
    """Two prompts of random token ids, the first ``shared`` the same; a fresh seed per case, so nothing an
    earlier test (or case) left in the session's kept engine can be hit."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(1_000, 40_000, shared)
    return [np.concatenate([prefix, rng.integers(1_000, 40_000, 8)]).astype(np.int32) for _ in range(2)]


def batch_of(prompts: list[np.ndarray]) -> RequestBatch:
    offsets = np.zeros(len(prompts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in prompts], out=offsets[1:])
    n = len(prompts)
    return RequestBatch(np.array([f"r{i}" for i in range(n)], dtype=object), offsets, np.concatenate(prompts),
                        np.full(n, 1 << 20, np.int32), np.full(n, UNKNOWN, np.int32), np.full(n, UNKNOWN, np.int32))


def vllm_runs(engine, prompts: list[np.ndarray], together: bool) -> list[EngineResult]:
    """The prompts through vLLM: in one run (added before its first step), or one run each."""
    requests = [EngineRequest(f"r{i}", p, max_tokens=4) for i, p in enumerate(prompts)]
    results: list[EngineResult] = []
    for group in ([requests] if together else [[r] for r in requests]):
        engine.run(group, StaticOrder(np.arange(len(group))), results.append)
    return sorted(results, key=lambda r: r.request_id)


@pytest.mark.parametrize("shared", [1024, 1000], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("together", [True, False], ids=["one-run", "two-runs"])
def test_simulator_caches_siblings_as_vllm_does(make_config, shared: int, together: bool) -> None:
    prompts = sibling_prompts(seed=shared + 2 * together, shared=shared)
    # static: both requests are in vLLM's queue before its first step, so it schedules them in that one step
    with engine_session(make_config(extra={"vllm_mode": "static"})) as engine:
        block = engine.block_size
        step_tokens, kv_tokens = engine.step_tokens, engine.kv_total_tokens
        results = vllm_runs(engine, prompts, together)
    assert [r.status for r in results] == ["ok", "ok"]
    engine_cached = [r.num_cached_tokens for r in results]
    assert engine_cached == [0, shared - shared % block]  # whole blocks of the shared prefix, even in one step

    outputs = np.array([r.num_output_tokens for r in results])
    config = SimConfig(token_budget=step_tokens, kv_capacity_tokens=kv_tokens, block_size=block,
                       max_running=2 if together else 1)  # max_running 1: the second starts after the first ends
    sim = simulate(batch_of(prompts), outputs, COST, StaticOrder([0, 1]), config)
    assert list(sim.cached_tokens) == engine_cached
