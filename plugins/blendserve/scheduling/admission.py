"""Admission: who decides which request enters the engine next.

Engines (the simulator, vLLM streaming, transformers) ask a controller at each
step for the next request while they have room; the controller hears back when
requests progress and finish. A static order is the simplest controller; the
dual scan (``scheduling.dual_scan_projected``) is the BlendServe one. Engines that
take one whole list (vLLM's static mode) get a controller's order from ``planned_order``.
"""

from __future__ import annotations

from dataclasses import dataclass
import heapq
from typing import Protocol, Sequence

import numpy as np


@dataclass(frozen=True)
class EngineState:
    running: int  # sequences holding KV now
    waiting: int  # admitted, not yet scheduled
    kv_used_tokens: int  # KV slots in use, in tokens
    kv_total_tokens: int  # KV capacity, in tokens
    clock_s: float = 0.0  # the simulator's seconds since the run began (plan_worker.SimulatedPlan); 0 elsewhere


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


class Delegating:
    """A controller that hands every call to ``self.controller`` (set by the subclass)."""

    controller: AdmissionController

    def next_request(self, state: EngineState) -> int | None:
        return self.controller.next_request(state)

    def on_progress(self, index: int, output_tokens: int) -> None:
        self.controller.on_progress(index, output_tokens)

    def on_finish(self, index: int, output_tokens: int) -> None:
        self.controller.on_finish(index, output_tokens)

    def remaining(self) -> int:
        return self.controller.remaining()


def planned_order(controller: AdmissionController, estimates: Sequence[int], kv_total_tokens: int = 0) -> list[int]:
    """Every index the controller admits, in its order, for engines that take one list (static mode).

    The controller runs against a crude clock: an admitted request holds its
    place for its estimated output length (``estimates[index]``), and time
    jumps to the earliest finish whenever the controller admits nothing. Only
    the order of finishes matters.
    """
    order: list[int] = []
    holding: list[tuple[int, int]] = []  # (finish time, index)
    now = 0
    while controller.remaining():
        state = EngineState(running=len(holding), waiting=0, kv_used_tokens=0, kv_total_tokens=kv_total_tokens)
        index = controller.next_request(state)
        if index is None:
            if not holding:
                raise RuntimeError("admission controller admits nothing while nothing is running")
            now, done = heapq.heappop(holding)
            controller.on_finish(done, int(estimates[done]))
            continue
        order.append(index)
        heapq.heappush(holding, (now + int(estimates[index]), index))
    return order
