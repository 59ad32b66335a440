"""Engines behind one interface (``base.Engine``): vLLM, transformers, the simulator.

``get_engine`` keeps one started engine per process and settings: starting
vLLM costs ~30 s on 2 cores, so tests and DAG tasks in one process share it.
"""

from __future__ import annotations

from blendserve.config import RunConfig
from blendserve.engines.base import Engine, EngineRequest, EngineResult, EngineStats

_STARTED: dict[tuple, Engine] = {}


def engine_key(config: RunConfig) -> tuple:
    return (config.engine, str(config.model_path()), config.max_model_len, config.max_num_seqs,
            config.kv_cache_gb, config.enforce_eager, repr(sorted(config.extra.items())))


def get_engine(config: RunConfig) -> Engine:
    key = engine_key(config)
    if key not in _STARTED:
        _STARTED[key] = _start(config)
    return _STARTED[key]


def _start(config: RunConfig) -> Engine:
    if config.engine == "vllm":
        from blendserve.engines.vllm_engine import VllmEngine

        return VllmEngine(config)
    raise NotImplementedError(f"engine {config.engine!r} is not available yet; use --engine vllm")


__all__ = ["Engine", "EngineRequest", "EngineResult", "EngineStats", "get_engine"]
