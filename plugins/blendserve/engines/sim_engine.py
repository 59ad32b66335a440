"""The step simulator behind the engine interface: GPU-scale runs on any machine.

Admission goes through the same controller as on the real engines; the
simulator (``blendserve.sim``) plays the engine, costed by the cost model of
a catalog GPU and model. Results carry simulated timings (the run starts at
the wall-clock time of ``run`` and advances in simulated seconds) and
synthetic outputs of the simulated length: ``sim_output_tokens`` when the
request has one (the simulator's model of what the model generates), else the
known ``expected_output_tokens``, else ``max_tokens``.

Settings: ``RunConfig.extra["simulator"]`` with ``model`` (catalog name or a
config.json/GGUF path; default ``smollm2-135m``), ``hardware`` (default
``a100-80g``), ``tp`` and any ``SimConfig`` field (``max_running`` defaults
to ``RunConfig.max_num_seqs``).
"""

from __future__ import annotations

import zlib
from dataclasses import fields, replace
from datetime import datetime, timedelta, timezone
from typing import Sequence

import numpy as np

from blendserve.batch import UNKNOWN, RequestBatch
from blendserve.config import RunConfig
from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.costmodel.profiles import AUTO, FALLBACK
from blendserve.engines.base import BatchRequests, EngineRequest, EngineResult, EngineStats, ResultSink
from blendserve.engines.common import RunBook, refusal
from blendserve.scheduling.admission import AdmissionController, EngineState
from blendserve.sim import SimConfig, kv_capacity_tokens
from blendserve.sim.engine_core import EngineCore


def simulated_outputs(batch: RequestBatch, max_model_len: int) -> np.ndarray:
    """(n,) output tokens the simulated model generates: each request's truth, capped like a real engine caps."""
    length = np.where(batch.sim_output_tokens >= 0, batch.sim_output_tokens,
                      np.where(batch.expected_output_tokens >= 0, batch.expected_output_tokens, batch.max_tokens))
    room = max_model_len - batch.prompt_lens
    return np.maximum(1, np.minimum(np.minimum(length, batch.max_tokens), room)).astype(np.int64)


def synthetic_ids(request_id: str, length: int, vocab: int) -> list[int]:
    """Stand-in output ids, the same for the same request on every run."""
    rng = np.random.default_rng(zlib.crc32(request_id.encode()))
    return rng.integers(0, vocab, size=length, dtype=np.int64).tolist()


def to_batch(requests: Sequence[EngineRequest]) -> RequestBatch:
    """The requests' columns: a ``BatchRequests`` hands over its own batch (no token copied)."""
    if isinstance(requests, BatchRequests):
        return requests.batch
    lens = np.array([len(r.prompt_token_ids) for r in requests], dtype=np.int64)
    offsets = np.zeros(len(requests) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    tokens = np.fromiter((t for r in requests for t in r.prompt_token_ids), dtype=np.int32, count=int(offsets[-1]))
    known = [UNKNOWN if r.expected_output_tokens is None else r.expected_output_tokens for r in requests]
    simulated = [UNKNOWN if r.sim_output_tokens is None else r.sim_output_tokens for r in requests]
    return RequestBatch(
        request_ids=np.array([r.request_id for r in requests], dtype=object),
        token_offsets=offsets,
        tokens=tokens,
        max_tokens=np.array([r.max_tokens for r in requests], dtype=np.int32),
        expected_output_tokens=np.array(known, dtype=np.int32),
        sim_output_tokens=np.array(simulated, dtype=np.int32),
    )


def simulator_setup(config: RunConfig) -> tuple[CostModel, SimConfig]:
    """The simulated model, GPU and engine settings of a run (``extra["simulator"]``); the planner
    costs a simulator run with the same ones, so prediction and simulation share one clock."""
    settings = dict(config.extra.get("simulator", {}))
    model = get_model(settings.pop("model", "smollm2-135m"))
    default = FALLBACK if config.hardware == AUTO else config.hardware  # the simulator plays a catalog GPU
    hardware = get_hardware(settings.pop("hardware", default), int(settings.pop("tp", 1)))
    settings.setdefault("max_running", config.max_num_seqs)
    known = {f.name for f in fields(SimConfig)}
    unknown = set(settings) - known
    if unknown:
        raise ValueError(f"unknown simulator settings {sorted(unknown)}; known: {sorted(known)} + model, hardware, tp")
    return CostModel(model, hardware), SimConfig(**settings)


class SimulatorEngine:
    name = "simulator"

    def __init__(self, config: RunConfig) -> None:
        self.cost, self.sim_config = simulator_setup(config)
        self.capacity = kv_capacity_tokens(self.cost, self.sim_config)
        self.max_model_len = min(config.max_model_len, self.cost.model.max_context)
        self.interval_s = float(config.extra.get("stats_interval_s", 0.25))
        self.vocab = self.cost.model.vocab_size

    def run(self, requests: Sequence[EngineRequest], controller: AdmissionController, on_result: ResultSink) -> EngineStats:
        batch = to_batch(requests)
        outputs = simulated_outputs(batch, self.max_model_len)
        book = RunBook(controller, on_result, self.interval_s)
        proxy = _SimulatedRun(requests, outputs, self._refusals(requests, batch, outputs), book, self)
        batch = replace(batch, sim_output_tokens=outputs.astype(np.int32))
        core = EngineCore(batch, outputs, self.cost, proxy, self.sim_config, self.capacity)
        proxy.core = core
        core.run()
        proxy.sample(EngineState(len(core.running), len(core.waiting), core.used, core.capacity))
        stats = book.close(wall_seconds=core.clock)
        stats.mode = "stream"
        return stats

    def _refusals(self, requests: Sequence[EngineRequest], batch: RequestBatch, outputs: np.ndarray) -> dict[int, str]:
        """Index -> why the engine refuses it. Arrays find the few suspects; ``refusal`` words the reason."""
        p = batch.prompt_lens
        suspect = (p == 0) | (p + 1 > self.max_model_len) | (batch.max_tokens < 1) | (p + outputs > self.capacity)
        refused = {}
        for i in np.flatnonzero(suspect).tolist():
            request = requests[i]
            reason = refusal(request, self.max_model_len, "context (max_model_len)")
            if reason is None and p[i] + outputs[i] > self.capacity:
                reason = f"needs {p[i] + outputs[i]} KV tokens, capacity is {self.capacity}"
            if reason is not None:
                refused[i] = reason
        return refused

    def close(self) -> None:
        pass  # nothing runs between calls


class _SimulatedRun:
    """The controller as the simulator sees it: refuses what the engine cannot take, turns finishes into results."""

    def __init__(self, requests: Sequence[EngineRequest], outputs: np.ndarray, refused: dict[int, str],
                 book: RunBook, engine: SimulatorEngine) -> None:
        self.requests, self.outputs, self.refused = requests, outputs, refused
        self.book, self.engine = book, engine
        self.core: EngineCore | None = None  # set once the simulator exists; its clock is the run's time
        self.t0 = datetime.now(timezone.utc)
        self.admitted_at: dict[int, float] = {}  # index -> simulated admission time
        self.last = (0, 0, 0)  # core counters (step, lookup tokens, hit tokens) at the last sample

    def _at(self, seconds: float) -> datetime:
        return self.t0 + timedelta(seconds=seconds)

    def next_request(self, state: EngineState) -> int | None:
        while True:
            index = self.book.controller.next_request(state)
            if index is None:
                return None
            self.book.stats.order.append(index)
            if index not in self.refused:
                self.admitted_at[index] = self.core.clock
                self.book.admitted_since_sample += 1
                self.sample(state)
                return index
            self.book.refuse(index, self.requests[index], self.refused[index])

    def on_progress(self, index: int, output_tokens: int) -> None:
        self.book.controller.on_progress(index, output_tokens)

    def on_finish(self, index: int, output_tokens: int) -> None:
        request, d = self.requests[index], int(self.outputs[index])
        result = EngineResult(
            request_id=request.request_id,
            status="ok",
            text=f"<simulated output: {d} tokens>",
            output_token_ids=synthetic_ids(request.request_id, d, self.engine.vocab),
            finish_reason="length" if d >= request.max_tokens else "stop",
            num_prompt_tokens=len(request.prompt_token_ids),
            num_output_tokens=d,
            num_cached_tokens=int(self.core.first_hit[index]),  # at its first start, as vLLM reports it
            error=None,
            started_at=self._at(self.admitted_at.pop(index)),
            finished_at=self._at(self.core.clock),
        )
        self.book.finish(index, result)

    def remaining(self) -> int:
        return self.book.controller.remaining()

    def sample(self, state: EngineState) -> None:
        core = self.core
        step, lookups, hits = core.step, core.lookup_tokens, core.hit_tokens
        self.book.sample(t=core.clock, steps=step - self.last[0], running=state.running, waiting=state.waiting,
                         kv_used_tokens=state.kv_used_tokens, kv_total_tokens=state.kv_total_tokens,
                         prefix_queries=lookups - self.last[1], prefix_hits=hits - self.last[2])
        self.last = (step, lookups, hits)
