"""Dual scan with projected KV: each side's share bounds the KV its requests will hold, not their peaks.

A request's KV grows by one token per decode step, from its prompt to
``p + d``. Charging every in-flight request its peak for its whole life (the
base ``DualScanController``) counts a 15k-token video as 15k tokens on the
step it starts, so the memory-heavy side holds about half the KV its share
allows, and long decodes that should run beside the compute-heavy phase end
in a memory-bound tail. Here a side admits a request when the side's
*projected peak* -- the most KV its in-flight requests and the candidate will
hold at once in the future, if each grows one token a step until its
estimated output -- stays within the share. Requests that started earlier are
nearer their end, so admissions stagger by themselves and the side's KV stays
close to its share without overflowing it.

The controller has no step counter, so it keeps a *decode clock*: every
request decodes one token a step, so a report of ``n`` outputs from a request
admitted at clock ``s`` means the clock is at least ``s + n``. Admission,
prefill and queueing delays make the clock lag, which only makes the
projection conservative (requests look further from their end).
"""

from __future__ import annotations

import numpy as np

from blendserve.admission import EngineState
from blendserve.planner.dual_scan import DualScanController, ScanItems


def projected_peak(current: np.ndarray, remaining: np.ndarray) -> float:
    """Most KV held at once if request i holds ``current[i]`` now and grows one token a step for ``remaining[i]`` steps.

    At future step ``tau`` the requests with ``remaining > tau`` hold
    ``current + tau``; the sum peaks just before one of them ends, so with
    requests sorted by remaining steps (longest first) the peak is
    ``max_k (sum of the k first currents + k (r_k - 1))``.
    """
    if len(current) == 0:
        return 0.0
    order = np.argsort(-remaining, kind="stable")
    r = remaining[order]
    k = np.arange(1, len(r) + 1, dtype=np.float64)
    return float(np.max(np.cumsum(current[order]) + k * np.maximum(r - 1.0, 0.0)))


class ProjectedDualScan(DualScanController):
    """Dual scan that keeps each side's projected peak KV, not the sum of peak charges, within its share.

    Same constructor and hooks as ``DualScanController``; ``on_progress`` and
    ``on_finish`` also advance the decode clock. Needs per-item output
    estimates (``ScanItems.output_est``); without them it behaves like the base.
    """

    def __init__(self, items: ScanItems, capacity_tokens: float) -> None:
        super().__init__(items, capacity_tokens)
        self.clock = 0.0  # decode clock: steps every decoding request has advanced since the scan began
        self.started: dict[int, float] = {}  # batch index -> clock when admitted
        est = items.output_est
        self._prompt = None if est is None else np.maximum(items.kv_charge - est, 0.0)  # (k,) p per item
        self._by_index = self._lookup(items.requests) if est is not None else None  # batch index -> item position

    @staticmethod
    def _lookup(requests: np.ndarray) -> np.ndarray:
        table = np.full(int(requests.max(initial=-1)) + 1, -1, dtype=np.int64)
        table[requests] = np.arange(len(requests))
        return table

    def _side_state(self, side: int) -> tuple[np.ndarray, np.ndarray]:
        """(current KV, remaining steps) of the side's in-flight requests at the decode clock."""
        members = [i for i, (s, _) in self.inflight.items() if s == side]
        if not members:
            return np.zeros(0), np.zeros(0)
        index = np.asarray(members, dtype=np.int64)
        position = self._by_index[index]
        elapsed = self.clock - np.fromiter((self.started[i] for i in members), np.float64, len(members))
        estimate = self.items.output_est[position]
        done = np.minimum(elapsed, np.maximum(estimate - 1.0, 0.0))  # past its estimate it still holds one more step
        return self._prompt[position] + done, np.maximum(estimate - done, 1.0)

    def _load(self, side: int) -> float:
        if self._prompt is None:
            return super()._load(side)
        return projected_peak(*self._side_state(side))

    def _fits(self, side: int, position: int) -> bool:
        if self._prompt is None or self.share[side] <= 0:
            return super()._fits(side, position)
        if not any(s == side for s, _ in self.inflight.values()):
            return True  # an empty side always takes one request
        current, remaining = self._side_state(side)
        current = np.append(current, self._prompt[position])
        remaining = np.append(remaining, max(float(self.items.output_est[position]), 1.0))
        return projected_peak(current, remaining) <= self.share[side]

    def next_request(self, state: EngineState) -> int | None:
        index = super().next_request(state)
        if index is not None:
            self.started[index] = self.clock
        return index

    def on_progress(self, index: int, output_tokens: int) -> None:
        self._tick(index, output_tokens)
        super().on_progress(index, output_tokens)

    def on_finish(self, index: int, output_tokens: int) -> None:
        self._tick(index, output_tokens)
        self.started.pop(index, None)
        super().on_finish(index, output_tokens)

    def _tick(self, index: int, output_tokens: int) -> None:
        if index in self.started:
            self.clock = max(self.clock, self.started[index] + float(output_tokens))

