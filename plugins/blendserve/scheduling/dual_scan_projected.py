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

from blendserve.costmodel import kv_tokens_read
from blendserve.planner.items import ScanItems, item_work
from blendserve.scheduling.admission import EngineState
from blendserve.scheduling.dual_scan import LEFT, RIGHT, DualScanController


def projected_peak(current: np.ndarray, remaining: np.ndarray, horizon: float = np.inf) -> float:
    """Most KV held at once within ``horizon`` steps if request i holds ``current[i]`` now and grows one token a step for ``remaining[i]`` steps.

    At future step ``tau`` the requests with ``remaining > tau`` hold
    ``current + tau``; the sum peaks just before one of them ends (or at the
    horizon), so with requests sorted by remaining steps (longest first) the
    peak is ``max_k (sum of the k first currents + k min(r_k - 1, horizon))``.
    """
    if len(current) == 0:
        return 0.0
    order = np.argsort(-remaining, kind="stable")
    r = remaining[order]
    k = np.arange(1, len(r) + 1, dtype=np.float64)
    return float(np.max(np.cumsum(current[order]) + k * np.minimum(np.maximum(r - 1.0, 0.0), horizon)))


class ProjectedDualScan(DualScanController):
    """Dual scan that keeps the right side's projected peak KV, not the sum of peak charges, within its share.

    Same hooks as ``DualScanController``; ``on_progress`` and ``on_finish``
    also advance the decode clock. Needs per-item output estimates
    (``ScanItems.output_est``); without them it behaves like the base. Two
    refinements over the paper's fixed split, each measured on the paper
    mixes (docs/PLANNER_NOTES.md):

    - *The left side borrows.* Compute-heavy requests live tens of steps;
      the right side's projected peak lies thousands of steps ahead. A left
      request fits when the left side's projected peak plus what the right
      side will hold *within the left requests' lifetime* fits the KV, so
      the compute side is never starved by the share its short requests
      would leave unused (``M_L`` is ~4% of the KV on the paper mixes).
    - *Pacing on memory-bound jobs.* With ``rho_t < 1`` memory decides the
      end time, and a compute side that runs ahead leaves a memory-only
      tail. There the left side admits only while its share of the job's
      compute admitted so far stays within ``pace_slack`` of the share of
      the job's KV reads already done (finished and in-flight progress).
    """

    def __init__(
        self, items: ScanItems, capacity_tokens: float, lookahead: int = 512, headroom: float = 0.1,
        pace_slack: float = 0.02,
    ) -> None:
        super().__init__(items, capacity_tokens)
        self.lookahead = max(int(lookahead), 1)  # items the right cursor may look past for one that fits
        # The right side may project up to share x (1 + headroom): the decode clock lags and estimates are
        # means, so the projection overstates the peak; measured best at 0.1 of {0, 0.05, 0.1, 0.25, 0.3}.
        self.headroom = max(float(headroom), 0.0)
        self.pace_slack = pace_slack  # lead of compute admitted over memory done allowed on memory-bound jobs
        self.taken = np.zeros(len(items.requests), dtype=bool)  # items admitted, by position
        self.holes = 0  # taken items strictly between the cursors (picked from inside the right window)
        self.clock = 0.0  # decode clock: steps every decoding request has advanced since the scan began
        self.started: dict[int, float] = {}  # batch index -> clock when admitted
        est = items.output_est
        self._prompt = None if est is None else self._private_prompt(items)  # (k,) prompt KV each item adds
        self._by_index = self._lookup(items.requests) if est is not None else None  # batch index -> item position
        self.paced = est is not None and items.target_density < 1.0  # memory-bound job: the left side is paced
        self._compute, self._reads = item_work(items) if est is not None else (None, None)  # (k,) tokens in, KV read
        self._totals = (1.0, 1.0)  # job totals of compute and KV reads, the pacing's denominators
        if est is not None:
            self._totals = (max(float(self._compute.sum()), 1.0), max(float(self._reads.sum()), 1.0))
        self.compute_admitted = 0.0  # compute tokens of the left side's admissions
        self.reads_done = 0.0  # KV reads of finished requests

    @staticmethod
    def _private_prompt(items: ScanItems) -> np.ndarray:
        """Prompt KV an item adds: its prompt less the prefix it shares with the previous item.

        The engine's prefix cache holds a shared prefix once, and the
        previous item (admitted just before on the same side) holds it
        already; charging every item its whole prompt would make a side of
        5-shot prompts look several times its real size and starve it.
        """
        prompt = np.maximum(items.kv_charge - items.output_est, 0.0)
        if items.shared_prompt is None:
            return prompt
        return np.maximum(prompt - items.shared_prompt, 1.0)

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
        if side == LEFT:
            return self._left_fits(position) and self._paced_ok()
        if not self._has_inflight(RIGHT):
            return True  # an empty side always takes one request
        current, remaining = self._with_candidate(RIGHT, position)
        return projected_peak(current, remaining) <= self.share[RIGHT] * (1.0 + self.headroom)

    def _has_inflight(self, side: int) -> bool:
        return any(s == side for s, _ in self.inflight.values())

    def _with_candidate(self, side: int, position: int) -> tuple[np.ndarray, np.ndarray]:
        current, remaining = self._side_state(side)
        current = np.append(current, self._prompt[position])
        remaining = np.append(remaining, max(float(self.items.output_est[position]), 1.0))
        return current, remaining

    def _left_fits(self, position: int) -> bool:
        """The left side's projected peak plus what the right side holds within the left's lifetime fits the KV."""
        if not self._has_inflight(LEFT):
            return True  # an empty side always takes one request
        current, remaining = self._with_candidate(LEFT, position)
        right_near = projected_peak(*self._side_state(RIGHT), horizon=float(remaining.max()))
        return projected_peak(current, remaining) + right_near <= self.capacity

    def _paced_ok(self) -> bool:
        """On memory-bound jobs, the left side's compute share admitted may lead the KV reads done by ``pace_slack``.

        Only while right-side requests are in flight: without them memory
        progress cannot move, and waiting would stall the scan.
        """
        if not self.paced or not self._has_inflight(RIGHT):
            return True
        return self.compute_admitted / self._totals[0] <= self._reads_progress() + self.pace_slack

    def _reads_progress(self) -> float:
        """Share of the job's KV reads done: finished requests, plus in-flight ones up to the decode clock."""
        index = np.fromiter(self.inflight, np.int64, len(self.inflight))
        position = self._by_index[index]
        estimate = self.items.output_est[position]
        started = np.fromiter((self.started[i] for i in index.tolist()), np.float64, len(index))
        steps = np.minimum(self.clock - started, estimate)
        in_flight = float(np.sum(kv_tokens_read(self.items.kv_charge[position] - estimate, steps)))
        return (self.reads_done + in_flight) / self._totals[1]

    def next_request(self, state: EngineState) -> int | None:
        if self.remaining() == 0:
            return None
        self._sync_capacity(state)
        right_pick = self._window_pick()
        side = self._choose(self._fits(LEFT, self.left), right_pick is not None)
        if side is None:
            return None
        position = self.left if side == LEFT else right_pick
        if side == LEFT:
            self.compute_admitted += float(self._compute[position]) if self._compute is not None else 0.0
        self._take(position)
        index = self._book(side, position)
        self.started[index] = self.clock
        return index

    def remaining(self) -> int:
        return max(self.right - self.left - self.holes, 0)

    def _window_pick(self) -> int | None:
        """The right cursor's pick: the first of its next ``lookahead`` items that fits the projected curve.

        The right end holds the longest decodes. Taken strictly in order, a
        side of equal long requests starts them together, and their
        projection (all growing at once to the same peak) leaves the KV
        half empty until they end. Looking up to ``lookahead`` items past the
        cursor for one that fits under the projected curve puts shorter decodes beside
        the long ones, so the side's KV fills early and stays near its
        share. Items are tried in order (lowest density first); one per
        distinct estimate, since equal estimates project alike. The window
        is bounded so prefix-sharing neighbours stay close in time (the
        prefix cache still holds their prefix).
        """
        if self._prompt is None:
            return self.right - 1 if self._fits(RIGHT, self.right - 1) else None
        lo = max(self.left, self.right - self.lookahead)
        window = np.arange(self.right - 1, lo - 1, -1)
        window = window[~self.taken[window]]
        _, first = np.unique(self.items.output_est[window], return_index=True)
        for position in window[np.sort(first)][: self.max_tries]:
            if self._fits(RIGHT, int(position)):
                return int(position)
        return None

    max_tries = 8  # distinct estimates tried per call: bounds the cost of a call

    def _take(self, position: int) -> None:
        """Mark an item admitted and move each cursor past the taken items next to it."""
        self.taken[position] = True
        self.holes += 1
        while self.left < self.right and self.taken[self.left]:
            self.left += 1
            self.holes -= 1
        while self.right > self.left and self.taken[self.right - 1]:
            self.right -= 1
            self.holes -= 1

    def on_progress(self, index: int, output_tokens: int) -> None:
        self._tick(index, output_tokens)
        super().on_progress(index, output_tokens)

    def on_finish(self, index: int, output_tokens: int) -> None:
        self._tick(index, output_tokens)
        if self.started.pop(index, None) is not None and self._reads is not None:
            self.reads_done += float(self._reads[self._by_index[index]])
        super().on_finish(index, output_tokens)

    def _tick(self, index: int, output_tokens: int) -> None:
        if index in self.started:
            self.clock = max(self.clock, self.started[index] + float(output_tokens))

