"""Admission: who decides which request enters the engine next.

Engines (the simulator, vLLM streaming, transformers) ask a controller at each
step for the next request while they have room; the controller hears back when
requests progress and finish. A static order is the simplest controller; the
dual scan (``blendserve.planner``) is the BlendServe one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np


@dataclass(frozen=True)
class EngineState:
    running: int  # sequences holding KV now
    waiting: int  # admitted, not yet scheduled
    kv_used_tokens: int  # KV slots in use, in tokens
    kv_total_tokens: int  # KV capacity, in tokens


class AdmissionController(Protocol):
    def next_request(self, state: EngineState) -> int | None:
        """Index (into the batch) of the request to admit now, or None to admit nothing yet."""
        ...

    def on_progress(self, index: int, output_tokens: int) -> None:
        """A running request has produced ``output_tokens`` so far."""
        ...

    def on_finish(self, index: int, output_tokens: int) -> None:
        """A request finished (or failed) after ``output_tokens`` tokens."""
        ...

    def remaining(self) -> int:
        """Requests not yet admitted."""
        ...


class StaticOrder:
    """Admit requests in a fixed order as soon as the engine asks (FCFS over a list)."""

    def __init__(self, order: Sequence[int] | np.ndarray) -> None:
        self.order = np.asarray(order, dtype=np.int64)
        self.cursor = 0

    def next_request(self, state: EngineState) -> int | None:
        if self.cursor >= len(self.order):
            return None
        self.cursor += 1
        return int(self.order[self.cursor - 1])

    def on_progress(self, index: int, output_tokens: int) -> None:
        pass

    def on_finish(self, index: int, output_tokens: int) -> None:
        pass

    def remaining(self) -> int:
        return len(self.order) - self.cursor
