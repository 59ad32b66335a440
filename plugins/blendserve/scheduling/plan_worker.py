"""Where a warm-up's plan is made while the engine goes on admitting requests.

The plan of the rest (``choice.choose``: every candidate simulated under
several draws) takes seconds to minutes of CPU: 2.0-4.1% of the simulated run
on the 8B paper mixes at 40k requests, on the benches' 2-core host. Made
inline, the engine waits for it; made here, the warm-up controller keeps
admitting requests until it is ready (``warmup.WarmupController``: a quick
plan's list, else fillers), so the plan's time costs only the share of the
job that runs in that order meanwhile.

- ``ThreadPlan``: real engines. A thread, not a process: the planner's inputs
  (batch, tree, cost model) would have to be pickled or forked from a process
  that holds a GPU context. vLLM's engine core runs in its own process, so the
  thread shares the GIL only with the front end's loop.
- ``SimulatedPlan``: the simulator. The plan is made at once and held back
  for a modelled latency on the simulated clock (``plan_latency``), so runs stay
  deterministic and the simulated time charges the plan (not this host's
  wall seconds, which vary with its load).
- ``InlinePlan``: the plan at once, the engine waiting (revision 3's behaviour;
  for comparison and for small tests).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Protocol

from blendserve.scheduling.admission import AdmissionController

MakePlan = Callable[[], AdmissionController]

# Host seconds a plan takes: per request planned (the tree and the order: dfs's 1.0 s for 38k requests), and for
# blendserve's choice per request and per engine step it simulated. Fitted by bench/plan_cost.py on the benches'
# host (2-core AMD EPYC, 2k-40k requests of two paper mixes): 400k plans measured there come within 15% of the
# model. A GPU host's CPU is faster, so the modelled plan is slow rather than fast.
PLAN_S_PER_REQUEST = 26e-6
PLAN_S_PER_SIM_REQUEST = 59e-6
PLAN_S_PER_SIM_STEP = 35e-6


class PlanWorker(Protocol):
    seconds: float  # host wall seconds the last plan took to make
    waits: bool  # whether the engine waits for the plan (else requests are admitted while it is made)

    def start(self, make: MakePlan, now_s: float, requests: int) -> None:
        """Make a plan of ``requests`` with ``make``; ``now_s`` is the engine's clock (``EngineState.clock_s``)."""
        ...

    def ready(self, now_s: float) -> AdmissionController | None:
        """The plan once it is made (and, simulated, its latency has passed); None until then."""
        ...


def _made(make: MakePlan) -> tuple[AdmissionController, float]:
    started = time.perf_counter()
    plan = make()
    return plan, time.perf_counter() - started


class InlinePlan:
    """The plan made at once: the engine waits for it."""

    waits = True

    def __init__(self) -> None:
        self.seconds = 0.0
        self._plan: AdmissionController | None = None

    def start(self, make: MakePlan, now_s: float, requests: int) -> None:
        self._plan, self.seconds = _made(make)

    def ready(self, now_s: float) -> AdmissionController | None:
        return self._plan


def plan_latency(plan: AdmissionController, requests: int) -> float:
    """Modelled host seconds to make ``plan`` over ``requests``: per request, and per request and step its
    choice simulated."""
    choice = getattr(plan, "choice", None)
    simulated = 0.0 if choice is None else (PLAN_S_PER_SIM_REQUEST * choice.simulated_requests
                                            + PLAN_S_PER_SIM_STEP * choice.simulated_steps)
    return PLAN_S_PER_REQUEST * requests + simulated


class SimulatedPlan:
    """The plan made at once, handed over once the simulated clock passes its modelled latency."""

    waits = False

    def __init__(self) -> None:
        self.seconds = 0.0
        self.latency_s = 0.0  # the simulated seconds the last plan was held back
        self._plan: AdmissionController | None = None
        self._due_s = 0.0

    def start(self, make: MakePlan, now_s: float, requests: int) -> None:
        self._plan, self.seconds = _made(make)
        self.latency_s = plan_latency(self._plan, requests)
        self._due_s = now_s + self.latency_s

    def ready(self, now_s: float) -> AdmissionController | None:
        return self._plan if now_s >= self._due_s else None


class ThreadPlan:
    """The plan made on a daemon thread; a failure is raised where the engine asks for it."""

    waits = False

    def __init__(self) -> None:
        self.seconds = 0.0
        self._thread: threading.Thread | None = None
        self._result: tuple[AdmissionController, float] | None = None
        self._error: BaseException | None = None

    def start(self, make: MakePlan, now_s: float, requests: int) -> None:
        self._result, self._error = None, None

        def work() -> None:
            try:
                self._result = _made(make)
            except BaseException as error:  # noqa: BLE001 - re-raised in the engine's thread by ready()
                self._error = error

        self._thread = threading.Thread(target=work, name="blendserve-plan", daemon=True)
        self._thread.start()

    def ready(self, now_s: float) -> AdmissionController | None:
        if self._thread is None or self._thread.is_alive():
            return None
        if self._error is not None:
            raise self._error
        plan, self.seconds = self._result  # type: ignore[misc]
        return plan

    def join(self, timeout: float | None = None) -> None:
        """Wait for the plan's thread to end (for tests: an engine never blocks on it)."""
        if self._thread is not None:
            self._thread.join(timeout)
