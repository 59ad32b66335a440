"""Engines behind one interface (``base.Engine``): vLLM, transformers, the simulator.

``engine_session`` starts an engine for one task and stops it at the end, so
no engine processes outlive a task. With ``BLENDSERVE_KEEP_ENGINES=1`` it
keeps one engine per process and settings instead: starting vLLM costs ~30 s
on 2 cores, so a test session (or ``dag.test()``) shares one and calls
``close_all`` at its end.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from blendserve.config import RunConfig
from blendserve.engines.base import Engine, EngineRequest, EngineResult, EngineStats

_STARTED: dict[tuple, Engine] = {}


def engine_key(config: RunConfig) -> tuple:
    return (config.engine, str(config.model_path()), config.max_model_len, config.max_num_seqs,
            config.kv_cache_gb, config.enforce_eager, repr(sorted(config.extra.items())))


def keep_engines() -> bool:
    return os.environ.get("BLENDSERVE_KEEP_ENGINES") == "1"


@contextmanager
def engine_session(config: RunConfig, keep: bool = False) -> Iterator[Engine]:
    """The engine for ``config``; stopped at the end unless ``keep`` or BLENDSERVE_KEEP_ENGINES=1."""
    key = engine_key(config)
    engine = _STARTED.pop(key, None) or _start(config)
    try:
        yield engine
    finally:
        if keep or keep_engines():
            _STARTED[key] = engine
        else:
            engine.close()  # explicitly: left to interpreter exit, vLLM's teardown can hang for minutes


def close_all() -> None:
    """Stop every kept engine."""
    while _STARTED:
        _STARTED.popitem()[1].close()


def _start(config: RunConfig) -> Engine:
    if config.engine == "vllm":
        from blendserve.engines.vllm_engine import VllmEngine

        return VllmEngine(config)
    raise NotImplementedError(f"engine {config.engine!r} is not available yet; use --engine vllm")


__all__ = ["Engine", "EngineRequest", "EngineResult", "EngineStats", "close_all", "engine_session"]
