"""Synthetic request batches with a known prefix structure, for the planner tests and the scale benchmarks.

Requests fall into families that share a prefix (a few-shot block, a system
prompt) followed by a private suffix; a family is either compute-heavy
(short outputs) or memory-heavy (long outputs). Built block by block so a
million 500-token prompts cost the token array and little more.
"""

from __future__ import annotations

import numpy as np

from blendserve.batch import UNKNOWN, RequestBatch

VOCAB = 128_000


def synthetic_batch(
    n: int,
    mean_prompt: int = 500,
    shared_fraction: float = 0.6,
    family_size: int = 200,
    memory_heavy_fraction: float = 0.3,
    duplicate_fraction: float = 0.0,
    seed: int = 0,
) -> RequestBatch:
    """``n`` requests; prompts average ``mean_prompt`` tokens, ``shared_fraction`` of them in a family prefix.

    Memory-heavy families know their output length (``expected_output_tokens``,
    like video frames); compute-heavy ones are capped by ``max_tokens``.
    ``sim_output_tokens`` holds a true length near the known one.
    """
    rng = np.random.default_rng(seed)
    n_families = max(1, n // max(family_size, 1))
    family = np.sort(rng.integers(0, n_families, size=n))
    prefix_len = rng.integers(int(mean_prompt * shared_fraction * 0.5), int(mean_prompt * shared_fraction * 1.5) + 1, size=n_families)
    suffix_mean = max(mean_prompt - int(prefix_len.mean()), 1)
    lens = prefix_len[family] + rng.integers(1, 2 * suffix_mean, size=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    tokens = _tokens(rng, offsets, family, prefix_len)
    heavy = rng.random(n_families) < memory_heavy_fraction
    expected = np.where(heavy[family], rng.integers(800, 2000, size=n), UNKNOWN).astype(np.int32)
    max_tokens = np.where(heavy[family], 2048, rng.integers(4, 64, size=n)).astype(np.int32)
    truth = np.where(heavy[family], expected, np.minimum(max_tokens, rng.integers(1, 64, size=n))).astype(np.int32)
    batch = RequestBatch(
        request_ids=np.array([f"req-{i}" for i in range(n)], dtype=object),
        token_offsets=offsets,
        tokens=tokens,
        max_tokens=max_tokens,
        expected_output_tokens=expected,
        sim_output_tokens=truth,
    )
    return _with_duplicates(batch, rng, duplicate_fraction)


def batch_from_prompts(prompts: list[list[int]], max_tokens: int = 64, expected: list[int] | None = None) -> RequestBatch:
    """A small batch from literal token lists (ids ``r0``, ``r1``, ...), for tests."""
    n = len(prompts)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(p) for p in prompts], out=offsets[1:])
    tokens = np.concatenate([np.asarray(p, dtype=np.int32) for p in prompts]) if offsets[-1] else np.zeros(0, np.int32)
    known = np.full(n, UNKNOWN, dtype=np.int32) if expected is None else np.asarray(expected, dtype=np.int32)
    return RequestBatch(
        request_ids=np.array([f"r{i}" for i in range(n)], dtype=object),
        token_offsets=offsets,
        tokens=tokens,
        max_tokens=np.full(n, max_tokens, dtype=np.int32),
        expected_output_tokens=known,
        sim_output_tokens=np.full(n, UNKNOWN, dtype=np.int32),
    )


def _tokens(rng: np.random.Generator, offsets: np.ndarray, family: np.ndarray, prefix_len: np.ndarray) -> np.ndarray:
    """Random tokens, then each request's first prefix_len[family] tokens overwritten by its family's prefix."""
    tokens = rng.integers(0, VOCAB, size=int(offsets[-1]), dtype=np.int32)
    family_offsets = np.zeros(len(prefix_len) + 1, dtype=np.int64)
    np.cumsum(prefix_len, out=family_offsets[1:])
    prefixes = rng.integers(0, VOCAB, size=int(family_offsets[-1]), dtype=np.int32)
    block = 20_000
    for lo in range(0, len(family), block):
        req = np.arange(lo, min(lo + block, len(family)))
        plen = prefix_len[family[req]]
        rel = np.arange(plen.sum()) - np.repeat(np.cumsum(plen) - plen, plen)
        tokens[np.repeat(offsets[req], plen) + rel] = prefixes[np.repeat(family_offsets[family[req]], plen) + rel]
    return tokens


def _with_duplicates(batch: RequestBatch, rng: np.random.Generator, fraction: float) -> RequestBatch:
    """Replace ``fraction`` of the requests by copies of others (same tokens, same lengths), ids kept unique."""
    n = len(batch)
    k = int(n * fraction)
    if k == 0:
        return batch
    source = np.arange(n)
    source[rng.choice(n, size=k, replace=False)] = rng.choice(n, size=k)
    copy = batch.take(source)
    copy.request_ids = batch.request_ids.copy()
    return copy
