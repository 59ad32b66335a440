"""Step simulator: radix cache, closed-form decode runs, exact small cases, and T_opt as a lower bound."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blendserve.batch import UNKNOWN, RequestBatch
from blendserve.costmodel import CostModel, balanced_token_budget, batch_t_opt, get_hardware, get_model, t_opt
from blendserve.scheduling.admission import StaticOrder
from blendserve.sim import SimConfig, kv_capacity_tokens, simulate
from blendserve.sim.radix_cache import RadixCache
from blendserve.sim.timeline import sum_linear_steps

COST = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))


def make_batch(prompts: list[np.ndarray], outputs: list[int]) -> RequestBatch:
    lens = np.array([len(p) for p in prompts], dtype=np.int64)
    offsets = np.zeros(len(prompts) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    n = len(prompts)
    return RequestBatch(
        np.array([f"r{i}" for i in range(n)], dtype=object), offsets,
        np.concatenate([np.asarray(p, dtype=np.int32) for p in prompts]),
        np.full(n, 1 << 20, np.int32), np.full(n, UNKNOWN, np.int32), np.asarray(outputs, np.int32),
    )


class Recorder(StaticOrder):
    """A static order that checks the protocol: each request admitted once, finished once."""

    def __init__(self, order: np.ndarray) -> None:
        super().__init__(order)
        self.finished: dict[int, int] = {}

    def on_finish(self, index: int, output_tokens: int) -> None:
        assert index not in self.finished
        self.finished[index] = output_tokens


def test_radix_cache_matches_inserts_locks_and_evicts_lru() -> None:
    cache = RadixCache()
    a, b = np.arange(10, dtype=np.int32), np.concatenate([np.arange(6), [99, 98]]).astype(np.int32)
    assert cache.insert(a)[0] == 10
    added, node_b = cache.insert(b)
    assert added == 2 and cache.size == 12
    assert cache.match_prefix(b)[0] == 8
    assert cache.match_prefix(a, limit=4)[0] == 4
    cache.lock(node_b)
    assert cache.evictable == 4  # a's private tail; the shared 6 and b's tail are locked
    assert cache.evict(100) == 4 and cache.size == 8
    cache.unlock(node_b)
    assert cache.evict(1) == 2  # whole leaf (b's tail) first, then the shared node on demand
    assert cache.evict(100) == 6 and cache.size == 0


def test_lru_evicts_the_least_recently_used_leaf_first() -> None:
    cache = RadixCache()
    old, new = np.array([1, 2, 3], np.int32), np.array([7, 8], np.int32)
    cache.insert(old)
    cache.insert(new)
    cache.match_prefix(old)  # touch: now ``new`` is the least recently used
    cache.evict(1)
    assert cache.match_prefix(new)[0] == 0 and cache.match_prefix(old)[0] == 3


def test_match_is_cut_back_to_whole_blocks_and_locks_only_those() -> None:
    cache = RadixCache()
    cache.insert(np.arange(40, dtype=np.int32))
    hit, node = cache.match_prefix(np.arange(50, dtype=np.int32), block=16)
    assert hit == 32 and cache.size == 40
    cache.lock(node)
    assert cache.evictable == 8  # the 8 tokens past the last whole block stay evictable
    assert cache.match_prefix(np.arange(40, dtype=np.int32), limit=39, block=16)[0] == 32


def _tree_state(cache: RadixCache) -> list[tuple]:
    """Every node's path, key, locks and stamp, depth first in token order: two caches that agree here
    evict, match and lock alike."""
    out, stack = [], [((), cache.root)]
    while stack:
        path, node = stack.pop()
        out.append((path, tuple(node.key.tolist()), node.ref, node.last_access))
        stack.extend((path + (first,), node.children[first]) for first in sorted(node.children, reverse=True))
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_extending_a_locked_prompt_is_insert_then_lock_and_unlock(seed: int) -> None:
    """``extend`` + ``relock`` (the engine's chunk-by-chunk caching) leave the tree, its stamps, locks and
    evictions exactly as ``insert`` + ``lock`` + ``unlock`` do, under matches, splits and evictions."""
    rng = np.random.default_rng(seed)
    stems = [rng.integers(0, 50, int(rng.integers(1, 40))) for _ in range(3)]
    prompts = [np.concatenate([stems[int(rng.integers(3))][: int(rng.integers(0, 40))],
                               rng.integers(0, 50, int(rng.integers(1, 60)))]).astype(np.int32) for _ in range(12)]
    caches = [RadixCache(), RadixCache()]
    held: list[list] = [[], []]  # per cache: [prompt index, locked node, depth]
    for _ in range(80):
        op = int(rng.integers(4))
        which, cut, block = int(rng.integers(len(prompts))), int(rng.integers(1, 8)), int(rng.choice([1, 4]))
        pick = int(rng.integers(1 << 30))
        evicted = []
        for k, cache in enumerate(caches):
            if op == 0:  # a request starts: its cached prefix in whole blocks, locked
                hit, node = cache.match_prefix(prompts[which], block=block)
                cache.lock(node)
                held[k].append([which, node, hit])
            elif op == 1 and held[k]:  # a chunk of a running request's prompt is cached
                entry = held[k][pick % len(held[k])]
                tokens = prompts[entry[0]]
                n = min(len(tokens), entry[2] + cut)
                if n > entry[2]:
                    if k == 0:
                        _, node = cache.insert(tokens[:n])
                        cache.lock(node)
                        cache.unlock(entry[1])
                    else:
                        _, node = cache.extend(entry[1], entry[2], tokens[:n])
                        cache.relock(entry[1], node)
                    entry[1], entry[2] = node, n
            elif op == 2 and held[k]:  # a request finishes
                cache.unlock(held[k].pop(pick % len(held[k]))[1])
            elif op == 3:
                evicted.append(cache.evict(cut))
        assert len(set(evicted)) <= 1
        assert caches[0].size == caches[1].size and caches[0].evictable == caches[1].evictable
        assert _tree_state(caches[0]) == _tree_state(caches[1])


def sibling_batch(shared: int, tail: int) -> RequestBatch:
    """Two prompts that share their first ``shared`` tokens and differ in the last ``tail``."""
    prefix = np.arange(shared)
    return make_batch([np.concatenate([prefix, np.arange(50_000 + i * tail, 50_000 + (i + 1) * tail)])
                       for i in range(2)], [4, 4])


@pytest.mark.parametrize("config", [
    SimConfig(token_budget=8192),  # both start in step 1: the second hits the blocks the first was just allocated
    SimConfig(token_budget=600),  # the first's prompt is cached chunk by chunk; the second starts in its last step
    SimConfig(token_budget=8192, max_running=1),  # separate steps: the second starts after the first has finished
], ids=["same-step", "chunked", "separate"])
def test_siblings_hit_the_shared_prefix_whenever_they_start(config: SimConfig) -> None:
    result = simulate(sibling_batch(1024, 8), np.array([4, 4]), COST, StaticOrder([0, 1]), config)
    assert list(result.cached_tokens) == [0, 1024]
    assert result.computed_tokens == 1032 + 8 + 2 * 3


def test_same_step_siblings_start_together_and_share_one_copy_of_the_prefix() -> None:
    batch = sibling_batch(1024, 8)
    together = simulate(batch, np.array([4, 4]), COST, StaticOrder([0, 1]), SimConfig(token_budget=8192, kv_capacity_tokens=1100))
    apart = simulate(batch, np.array([4, 4]), COST, StaticOrder([0, 1]), SimConfig(token_budget=8192, max_running=1))
    assert together.steps == 4 and apart.steps == 8  # one prefill step for both, then three shared decodes
    # two private copies of the prompt (2,064 tokens) would not fit in 1,100: the hit holds no second copy
    assert together.preemptions == 0 and list(together.cached_tokens) == [0, 1024]


@pytest.mark.parametrize("overlap", ["max", "sum"])
def test_closed_form_decode_run_equals_the_loop(overlap: str) -> None:
    rng = np.random.default_rng(1)
    for _ in range(50):
        c0, c1, m0, m1 = rng.uniform(0, 2, 4) * [1, 0.01, 1, rng.choice([-0.02, 0.02])]
        k = int(rng.integers(1, 300))
        j = np.arange(1, k + 1)
        f = np.maximum if overlap == "max" else np.add
        assert sum_linear_steps(c0, c1, m0, m1, k, overlap) == pytest.approx(float(np.sum(f(c0 + c1 * j, m0 + m1 * j))))


def test_single_request_time_is_the_sum_of_its_steps() -> None:
    p, d = 300, 40
    batch = make_batch([np.arange(p)], [d])
    result = simulate(batch, np.array([d]), COST, StaticOrder([0]), SimConfig())
    prefill = max(float(COST.comp_time(p)), COST.weight_read_time + float(COST.kv_read_time(p)))
    decode = sum(max(float(COST.comp_time(1)), COST.weight_read_time + float(COST.kv_read_time(p + j))) for j in range(1, d))
    assert result.total_time == pytest.approx(prefill + decode)
    assert result.steps == d and result.computed_tokens == p + d - 1
    assert result.throughput == pytest.approx((p + d) / result.total_time)


def test_prefix_cache_hits_save_compute_of_the_shared_prefix() -> None:
    shared = np.arange(500)
    prompts = [np.concatenate([shared, [1000 + i]]) for i in range(3)]
    batch = make_batch(prompts, [5, 5, 5])
    on = simulate(batch, np.full(3, 5), COST, StaticOrder([0, 1, 2]), SimConfig(max_running=1))
    off = simulate(batch, np.full(3, 5), COST, StaticOrder([0, 1, 2]), SimConfig(max_running=1, prefix_cache=False))
    # hits are whole 16-token KV blocks, as vLLM shares them: 496 of the 500 shared tokens
    assert on.hit_tokens == 2 * 496 and on.prefix_hit_ratio == pytest.approx(992 / 1503)
    assert list(on.cached_tokens) == [0, 496, 496] and on.shared_tokens == 992
    assert off.hit_tokens == 0 and off.computed_tokens - on.computed_tokens == 992
    assert on.total_time < off.total_time


def test_kv_exhaustion_preempts_and_still_finishes_everything() -> None:
    prompts = [np.arange(i * 1000, i * 1000 + 50) for i in range(8)]
    batch = make_batch(prompts, [300] * 8)
    controller = Recorder(np.arange(8))
    result = simulate(batch, np.full(8, 300), COST, controller, SimConfig(kv_capacity_tokens=900))
    assert result.preemptions > 0
    assert controller.finished == {i: 300 for i in range(8)}
    assert result.computed_tokens > 8 * (50 + 299)  # recomputation costs compute
    assert result.total_time >= batch_t_opt(COST, batch, np.full(8, 300)).time


def test_a_restart_finding_its_own_prompt_is_a_hit_but_not_sharing() -> None:
    # no two prompts share a token: every hit is a preempted request finding its own prompt again
    prompts = [np.arange(i * 1000, i * 1000 + 160) for i in range(6)]
    result = simulate(make_batch(prompts, [300] * 6), np.full(6, 300), COST, StaticOrder(np.arange(6)),
                      SimConfig(kv_capacity_tokens=1200))
    assert result.preemptions > 0 and result.hit_tokens > 0
    assert result.shared_tokens == 0 and list(result.cached_tokens) == [0] * 6


@st.composite
def workloads(draw: st.DrawFn) -> tuple[RequestBatch, np.ndarray, np.ndarray, SimConfig]:
    n = draw(st.integers(1, 25))
    prefixes = [np.arange(k * 10_000, k * 10_000 + draw(st.integers(0, 200))) for k in range(3)]
    prompts, outputs = [], []
    for i in range(n):
        prefix = prefixes[draw(st.integers(0, 2))][: draw(st.integers(0, 200))]
        tail = np.arange(100_000 + i * 1000, 100_000 + i * 1000 + draw(st.integers(0 if len(prefix) else 1, 120)))
        prompts.append(np.concatenate([prefix, tail]))
        outputs.append(draw(st.integers(1, 400)))
    order = np.asarray(draw(st.permutations(range(n))))
    config = SimConfig(
        token_budget=draw(st.sampled_from([16, 64, 512, 8192])), max_running=draw(st.integers(1, 16)),
        kv_capacity_tokens=draw(st.integers(900, 5000)), overlap=draw(st.sampled_from(["max", "sum"])),
        attention_flops=draw(st.booleans()), prefix_cache=draw(st.booleans()),
    )
    return make_batch(prompts, outputs), np.asarray(outputs), order, config


@settings(max_examples=150, deadline=None)
@given(workloads())
def test_simulated_time_is_never_below_t_opt(case: tuple[RequestBatch, np.ndarray, np.ndarray, SimConfig]) -> None:
    batch, outputs, order, config = case
    controller = Recorder(order)
    result = simulate(batch, outputs, COST, controller, config)
    cache = RadixCache()
    unique = sum(cache.insert(batch.prompt(i))[0] for i in range(len(batch)))  # independent of the planner's LCP
    optimum = t_opt(COST, batch.prompt_lens, outputs, unique, config.overlap)
    assert result.total_time >= optimum.time * (1 - 1e-12)
    assert result.comp_time >= optimum.comp * (1 - 1e-12) and result.mem_time >= optimum.mem * (1 - 1e-12)
    assert controller.finished == {i: int(outputs[i]) for i in range(len(batch))}


@st.composite
def long_decodes(draw: st.DrawFn) -> tuple[RequestBatch, np.ndarray, np.ndarray, SimConfig]:
    """Few long decodes on a small KV cache, where the KV-capacity step bound binds."""
    n = draw(st.integers(2, 10))
    prompts = [np.arange(i * 1000, i * 1000 + draw(st.integers(1, 40))) for i in range(n)]
    outputs = np.array([draw(st.integers(50, 700)) for _ in range(n)])
    config = SimConfig(
        token_budget=draw(st.sampled_from([None, 16, 512])), max_running=draw(st.integers(1, 16)),
        kv_capacity_tokens=draw(st.integers(800, 1500)), overlap=draw(st.sampled_from(["max", "sum"])),
    )
    return make_batch(prompts, outputs), outputs, np.asarray(draw(st.permutations(range(n)))), config


@settings(max_examples=100, deadline=None)
@given(long_decodes())
def test_capacity_step_bound_is_never_above_the_simulator(case) -> None:
    batch, outputs, order, config = case
    result = simulate(batch, outputs, COST, Recorder(order), config)
    optimum = t_opt(COST, batch.prompt_lens, outputs, int(batch.prompt_lens.sum()), config.overlap,
                    kv_capacity_tokens=config.kv_capacity_tokens)
    assert result.steps >= optimum.min_steps
    assert result.mem_time >= optimum.mem * (1 - 1e-12) and result.total_time >= optimum.time * (1 - 1e-12)


def test_capacity_bound_tightens_t_opt_when_long_decodes_cannot_share_steps() -> None:
    outputs = np.full(20, 1000)
    loose = t_opt(COST, np.full(20, 10), outputs, 200)
    tight = t_opt(COST, np.full(20, 10), outputs, 200, kv_capacity_tokens=2000)
    assert loose.min_steps == 1000
    assert tight.min_steps == np.ceil(20 * 1000 * 999 / 2 / 2000)  # 4995 steps: 2 sequences' outputs at a time
    assert tight.mem > loose.mem


def test_resource_aware_budget_balances_a_full_step() -> None:
    capacity = kv_capacity_tokens(COST, SimConfig())
    budget = balanced_token_budget(COST, capacity)
    full_step_memory = COST.weight_read_time + float(COST.kv_read_time(capacity))
    assert float(COST.comp_time(budget)) == pytest.approx(full_step_memory, rel=2e-3)
    batch = make_batch([np.arange(5000)], [2])
    result = simulate(batch, np.array([2]), COST, StaticOrder([0]), SimConfig())
    assert result.token_budget == budget
    assert result.steps == int(np.ceil(5000 / budget)) + 1  # chunks of the budget, then one decode
