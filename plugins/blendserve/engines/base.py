"""The engine interface: requests in (token ids + sampling), results out, one per request.

An engine admits requests only through an ``AdmissionController`` (see
``blendserve.admission``), so the same plan drives every engine. A request the
engine refuses becomes an error result; it never stops the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Protocol, Sequence

from blendserve.admission import AdmissionController


@dataclass
class EngineRequest:
    request_id: str  # the user's custom_id
    prompt_token_ids: list[int]  # after the chat template: what the prefix cache sees
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] | None = None
    expected_output_tokens: int | None = None  # known in advance (a data column): planners and the simulator may use it
    sim_output_tokens: int | None = None  # true length, read only by the simulator engine (its model of the model)


@dataclass
class EngineResult:
    request_id: str
    status: str  # "ok" | "error"
    text: str | None
    output_token_ids: list[int] | None
    finish_reason: str  # "stop" | "length" | "error"
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int | None  # prompt tokens served from the prefix cache, if known
    error: str | None
    started_at: datetime
    finished_at: datetime

    @classmethod
    def failed(cls, request: EngineRequest, reason: str, started_at: datetime | None = None) -> "EngineResult":
        now = datetime.now(timezone.utc)
        return cls(request.request_id, "error", None, None, "error", len(request.prompt_token_ids), 0, None,
                   reason, started_at or now, now)


@dataclass
class EngineStats:
    wall_seconds: float = 0.0  # from the first admission to the last result (simulated seconds for the simulator)
    requests: int = 0  # results returned (ok or error)
    errors: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # served from the prefix cache
    output_tokens: int = 0
    timeline: list[dict] = field(default_factory=list)  # per-interval engine state, keys in engines.common.TIMELINE_KEYS
    order: list[int] = field(default_factory=list)  # request indices in the order they were handed to the engine
    mode: str = ""  # how requests entered: "stream" (admission step by step) or "static" (one list)

    @property
    def tokens_per_second(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def add(self, result: EngineResult) -> None:
        self.requests += 1
        self.errors += result.status != "ok"
        self.prompt_tokens += result.num_prompt_tokens
        self.cached_prompt_tokens += result.num_cached_tokens or 0
        self.output_tokens += result.num_output_tokens


ResultSink = Callable[[EngineResult], None]


class Engine(Protocol):
    name: str

    def run(self, requests: Sequence[EngineRequest], controller: AdmissionController, on_result: ResultSink) -> EngineStats:
        """Serve every request the controller admits; call ``on_result`` once per request."""
        ...

    def close(self) -> None:
        ...
