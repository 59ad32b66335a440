"""Step times and the per-step timeline of a simulated run.

A run of identical decode steps is costed in closed form: with ``n``
sequences decoding, step ``j`` of the run reads ``S + n j`` tokens of KV, so
both its compute and its memory time are linear in ``j`` and the sum of
``f(comp_j, mem_j)`` over the run needs no loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _arith(a: float, b: float, lo: int, hi: int) -> float:
    """Sum of a + b j for j = lo .. hi (0 when hi < lo)."""
    count = hi - lo + 1
    if count <= 0:
        return 0.0
    return a * count + b * (lo + hi) * count / 2.0


def sum_linear_steps(c0: float, c1: float, m0: float, m1: float, k: int, overlap: str) -> float:
    """Sum over j = 1..k of f(c0 + c1 j, m0 + m1 j), f = max or sum."""
    if overlap == "sum":
        return _arith(c0 + m0, c1 + m1, 1, k)
    g0, g1 = c0 - m0, c1 - m1  # comp - mem is linear in j, so it changes sign at most once
    if g1 == 0.0:
        return _arith(c0, c1, 1, k) if g0 >= 0 else _arith(m0, m1, 1, k)
    cross = int(np.clip(np.floor(-g0 / g1), 0, k))  # last j with g <= 0 when g1 > 0, g >= 0 when g1 < 0
    first, second = ((m0, m1), (c0, c1)) if g1 > 0 else ((c0, c1), (m0, m1))
    return _arith(*first, 1, cross) + _arith(*second, cross + 1, k)


@dataclass
class Timeline:
    """Segments of the run: one engine step, or a run of decode-only steps costed together."""

    start: list[float] = field(default_factory=list)  # seconds at which the segment starts
    duration: list[float] = field(default_factory=list)  # seconds the segment takes
    steps: list[int] = field(default_factory=list)  # engine steps in the segment
    comp: list[float] = field(default_factory=list)  # compute-bound seconds of work in the segment
    mem: list[float] = field(default_factory=list)  # memory-bound seconds (weights + KV) in the segment

    def add(self, start: float, duration: float, steps: int, comp: float, mem: float) -> None:
        self.start.append(start)
        self.duration.append(duration)
        self.steps.append(steps)
        self.comp.append(comp)
        self.mem.append(mem)

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: np.asarray(getattr(self, name)) for name in ("start", "duration", "steps", "comp", "mem")}

    def utilization(self) -> tuple[np.ndarray, np.ndarray]:
        """Compute and memory-bandwidth utilization of each segment (busy time / segment time)."""
        a = self.arrays()
        with np.errstate(divide="ignore", invalid="ignore"):
            dur = np.where(a["duration"] > 0, a["duration"], 1.0)
            return a["comp"] / dur, a["mem"] / dur
