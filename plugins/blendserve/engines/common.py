"""What every engine shares: estimates, refusals, the stats timeline.

The timeline is one dict per interval with the keys of ``TIMELINE_KEYS``; a
value an engine cannot observe is ``None`` rather than a made-up zero.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from blendserve.batch import RequestBatch
from blendserve.engines.base import BatchRequests, EngineRequest, EngineResult, EngineStats
from blendserve.scheduling.admission import AdmissionController, EngineState

TIMELINE_KEYS: dict[str, str] = {
    "t": "seconds since the run started, at the end of the interval (simulated seconds for the simulator)",
    "steps": "engine steps in the interval",
    "running": "requests running (holding KV) at the end of the interval",
    "waiting": "requests queued inside the engine, not yet running",
    "kv_used_tokens": "KV slots in use, in tokens (vLLM: usage fraction x capacity)",
    "kv_total_tokens": "KV capacity, in tokens",
    "prefill_tokens": "prompt tokens computed in the interval (cache hits excluded); None if the engine does not say",
    "decode_tokens": "output tokens generated in the interval; None if the engine does not say",
    "prefix_queries": "prompt tokens looked up in the prefix cache in the interval; None if unknown",
    "prefix_hits": "of those, tokens served from the prefix cache; None if unknown",
    "admitted": "requests handed to the engine in the interval",
    "finished": "requests finished (ok or error) in the interval",
}
SUMMED = ("steps", "prefill_tokens", "decode_tokens", "prefix_queries", "prefix_hits", "admitted", "finished")
PROGRESS_FIRST = 16  # first output count reported to on_progress, then doubling (as the simulator does)


def requests_from_batch(batch: RequestBatch) -> BatchRequests:
    """Greedy engine requests for a columnar batch (benchmarks, tests): known and simulated lengths carried along."""
    return BatchRequests(batch)


def estimated_output(request: EngineRequest) -> int:
    """The planner's fallback rule: a known length, else the request's cap. Never the simulator's truth."""
    known = request.expected_output_tokens
    return max(1, min(known, request.max_tokens) if known is not None and known >= 0 else request.max_tokens)


def refusal(request: EngineRequest, max_len: int, what: str) -> str | None:
    """Why an engine with ``max_len`` tokens of context refuses ``request``, or None if it takes it."""
    p = len(request.prompt_token_ids)
    if p == 0:
        return "empty prompt"
    if p + 1 > max_len:
        return f"prompt of {p} tokens does not fit the {what} of {max_len} tokens"
    if request.max_tokens < 1:
        return f"max_tokens must be at least 1, got {request.max_tokens}"
    return None


class ProgressReporter:
    """Tells the controller when a request's output reaches 16, 32, 64, ... tokens.

    Doubling thresholds keep the calls O(log d) per request, like the
    simulator's, so a controller behaves the same on every engine.
    """

    def __init__(self, controller: AdmissionController) -> None:
        self.controller = controller
        self.next_report: dict[int, int] = {}  # index -> output count at which to report next

    def update(self, index: int, output_tokens: int) -> None:
        threshold = self.next_report.get(index, PROGRESS_FIRST)
        if output_tokens >= threshold:
            self.controller.on_progress(index, output_tokens)
            while threshold <= output_tokens:
                threshold *= 2
        self.next_report[index] = threshold

    def forget(self, index: int) -> None:
        self.next_report.pop(index, None)


@dataclass
class TimelineRecorder:
    """Folds per-step samples into per-interval rows of ``TIMELINE_KEYS``."""

    interval_s: float  # length of one row; 0 keeps one row per sample
    rows: list[dict] = field(default_factory=list)  # the finished rows
    _open: dict | None = None  # the row being filled
    _opened_at: float = 0.0  # its start, in the run's seconds

    def sample(self, t: float, **values: float | int | None) -> None:
        """Add one step's counts (summed) and gauges (last value wins) at run time ``t``."""
        if self._open is None:
            self._open, self._opened_at = {key: None for key in TIMELINE_KEYS}, t
        row = self._open
        for key, value in values.items():
            if key not in TIMELINE_KEYS:
                raise KeyError(f"unknown timeline key {key!r}")
            if key in SUMMED and value is not None:
                row[key] = (row[key] or 0) + value
            elif key not in SUMMED:
                row[key] = value
        row["t"] = t
        if t - self._opened_at >= self.interval_s:
            self.flush()

    def flush(self) -> None:
        if self._open is not None:
            self.rows.append(self._open)
            self._open = None


class RunBook:
    """Book-keeping of one ``Engine.run``: results to the sink and the controller, stats, the clock."""

    def __init__(self, controller: AdmissionController, on_result: Callable[[EngineResult], None],
                 interval_s: float) -> None:
        self.controller = controller
        self.on_result = on_result
        self.stats = EngineStats()
        self.progress = ProgressReporter(controller)
        self.timeline = TimelineRecorder(interval_s)
        self.started = time.monotonic()
        self.finished_since_sample = 0  # requests finished since the last timeline sample
        self.admitted_since_sample = 0  # requests handed to the engine since the last timeline sample
        self.seen: set[str] = set()  # request ids already answered: one result per request

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def finish(self, index: int, result: EngineResult, tell_controller: bool = True) -> None:
        if result.request_id in self.seen:
            raise RuntimeError(f"engine answered request {result.request_id!r} twice")
        self.seen.add(result.request_id)
        if tell_controller:
            self.controller.on_finish(index, result.num_output_tokens)
        self.progress.forget(index)
        self.stats.add(result)
        self.finished_since_sample += 1
        self.on_result(result)

    def refuse(self, index: int, request: EngineRequest, reason: str, tell_controller: bool = True) -> None:
        now = datetime.now(timezone.utc)
        self.finish(index, EngineResult.failed(request, f"engine rejected the request: {reason}", now), tell_controller)

    def sample(self, t: float | None = None, **values: float | int | None) -> None:
        self.timeline.sample(self.elapsed() if t is None else t, admitted=self.admitted_since_sample,
                             finished=self.finished_since_sample, **values)
        self.admitted_since_sample = self.finished_since_sample = 0

    def close(self, wall_seconds: float | None = None) -> EngineStats:
        self.timeline.flush()
        self.stats.timeline = self.timeline.rows
        self.stats.wall_seconds = self.elapsed() if wall_seconds is None else wall_seconds
        return self.stats
