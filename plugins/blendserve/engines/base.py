"""The engine interface: requests in (token ids + sampling), results out, one per request.

An engine admits requests only through an ``AdmissionController`` (see
``blendserve.scheduling.admission``), so the same plan drives every engine. A request the
engine refuses becomes an error result; it never stops the others.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

import numpy as np

import pyarrow as pa

from blendserve.batch import UNKNOWN, RequestBatch
from blendserve.scheduling.admission import AdmissionController


@dataclass
class EngineRequest:
    request_id: str  # the user's custom_id
    prompt_token_ids: Sequence[int]  # after the chat template: what the prefix cache sees (an array view)
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] | None = None
    expected_output_tokens: int | None = None  # known in advance (a data column): planners and the simulator may use it
    sim_output_tokens: int | None = None  # true length, read only by the simulator engine (its model of the model)


def token_list(ids: Sequence[int]) -> list[int]:
    """The prompt as a Python list, for an engine API that takes one: made at submission, one request at a time."""
    return ids.tolist() if isinstance(ids, np.ndarray) else list(ids)


class BatchRequests(Sequence[EngineRequest]):
    """The engine's requests over columns: an ``EngineRequest`` (its ids a view into ``batch.tokens``) is made
    when an engine asks for one, so a shard's input costs its token array, not a Python object per token.

    ``sampling``: the rows' temperature, top_p, seed and stop_json columns (None: greedy, as ``requests_from_batch``).
    """

    def __init__(self, batch: "RequestBatch", sampling: "pa.Table | None" = None) -> None:
        self.batch, n = batch, len(batch)
        self.unknown = UNKNOWN

        def column(name: str, default: object) -> list:
            return [default] * n if sampling is None else sampling.column(name).to_pylist()

        self.temperature, self.top_p = column("temperature", 0.0), column("top_p", 1.0)
        self.seed, self.stop_json = column("seed", None), column("stop_json", None)

    def __len__(self) -> int:
        return len(self.batch)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        b = self.batch
        known, sim = int(b.expected_output_tokens[i]), int(b.sim_output_tokens[i])
        return EngineRequest(
            request_id=str(b.request_ids[i]), prompt_token_ids=b.prompt(i), max_tokens=int(b.max_tokens[i]),
            temperature=self.temperature[i], top_p=self.top_p[i], seed=self.seed[i],
            stop=None if self.stop_json[i] is None else json.loads(self.stop_json[i]),
            expected_output_tokens=None if known == self.unknown else known,
            sim_output_tokens=None if sim == self.unknown else sim,
        )


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
