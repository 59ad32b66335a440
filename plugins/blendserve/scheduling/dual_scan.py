"""BlendServe's dual scan: admit from both ends of the density-ordered list at once.

The left cursor walks compute-heavy groups, the right cursor memory-heavy
ones. KV memory is split so the blend's density matches the whole job's:
with a memory share ``M_L`` of density ``rho_L`` and ``M_R`` of ``rho_R``,
the mix has density ``(M_L rho_L + M_R rho_R) / M``; setting that to
``rho_t`` gives ``M_L = M (rho_t - rho_R) / (rho_L - rho_R)``.
"""

from __future__ import annotations

import numpy as np

from blendserve.planner.items import ScanItems, item_work
from blendserve.scheduling.admission import EngineState

LEFT, RIGHT = 0, 1


def memory_split(capacity: float, rho_t: float, rho_l: float, rho_r: float) -> tuple[float, float]:
    """(M_L, M_R): memory for the compute-heavy and the memory-heavy side, clamped to [0, M].

    When both cursors see the same density any split gives the same blend,
    so the memory is halved rather than dividing by zero.
    """
    gap = rho_l - rho_r
    if not (np.isfinite(gap) and gap > 1e-12):
        m_left = capacity / 2.0
    else:
        m_left = capacity * (rho_t - rho_r) / (rho_l - rho_r)
    m_left = float(min(max(m_left, 0.0), capacity))
    return m_left, capacity - m_left


class DualScanController:
    """Admission by dual scan: keeps each side's in-flight estimated KV within its share.

    Implements ``blendserve.scheduling.admission.AdmissionController``, so the same
    object drives the simulator and a real engine step by step. Each
    in-flight request remembers its side and charge: a later run-time
    correction (an overrun charged to the right side, an early finish
    freeing its budget) only changes what ``on_progress`` does with them.
    """

    overrun_factor = 1.0  # output / estimate above which a request counts as running past its estimate
    corrections = 0  # on_progress reports that moved or re-charged an overrunning request

    def __init__(self, items: ScanItems, capacity_tokens: float) -> None:
        self.items = items
        self.capacity = float(capacity_tokens)
        self.left = 0  # next item the left cursor admits
        self.right = len(items.requests)  # one past the next item the right cursor admits
        self.used = [0.0, 0.0]  # estimated KV in flight per side
        self.share = [0.0, 0.0]  # M_L, M_R
        self.inflight: dict[int, tuple[int, float]] = {}  # batch index -> (side, KV charge)
        self._groups = (-1, -1)  # groups under the cursors when the split was last computed
        self.splits = 0  # times the split was recomputed (a cursor entered a new group)
        self._est_by_index = _estimate_lookup(items)  # batch index -> estimated d, for on_progress
        self._resplit()

    def _resplit(self) -> None:
        if self.left >= self.right:
            return
        g_left = int(self.items.group[self.left])
        g_right = int(self.items.group[self.right - 1])
        if (g_left, g_right) == self._groups:
            return
        self._groups = (g_left, g_right)
        density = self.items.group_density
        m_left, m_right = memory_split(self.capacity, self.items.target_density, density[g_left], density[g_right])
        self.share = [m_left, m_right]
        self.splits += 1

    def _fits(self, side: int, position: int) -> bool:
        """Whether the item at ``position`` fits its side's share (peak charges held until finish)."""
        if self.share[side] <= 0:
            return False
        # An empty side always takes one request, or a request larger than its share would wait forever.
        return self.used[side] == 0 or self.used[side] + self.items.kv_charge[position] <= self.share[side]

    def _load(self, side: int) -> float:
        """KV the side counts as taken when choosing where there is more room."""
        return self.used[side]

    def next_request(self, state: EngineState) -> int | None:
        if self.left >= self.right:
            return None
        self._sync_capacity(state)
        side = self._choose(self._fits(LEFT, self.left), self._fits(RIGHT, self.right - 1))
        return None if side is None else self._admit(side)

    def _sync_capacity(self, state: EngineState) -> None:
        """Follow the engine's real KV capacity when it reports one (the plan may have assumed another)."""
        if state.kv_total_tokens > 0 and state.kv_total_tokens != self.capacity:
            self.capacity = float(state.kv_total_tokens)
            self._groups = (-1, -1)
            self._resplit()

    def _choose(self, fits_left: bool, fits_right: bool) -> int | None:
        """The side to admit from: the one with room, or with relatively more room when both have some."""
        if not (fits_left or fits_right):
            return None
        if fits_left and fits_right:  # a side may fit with no share (an empty side, a borrowing one)
            room_left = 1.0 - self._load(LEFT) / max(self.share[LEFT], 1.0)
            room_right = 1.0 - self._load(RIGHT) / max(self.share[RIGHT], 1.0)
            return LEFT if room_left >= room_right else RIGHT
        return LEFT if fits_left else RIGHT

    def _admit(self, side: int) -> int:
        if side == LEFT:
            position = self.left
            self.left += 1
        else:
            self.right -= 1
            position = self.right
        return self._book(side, position)

    def _book(self, side: int, position: int) -> int:
        """Charge the item at ``position`` to ``side`` and return its batch index."""
        index = int(self.items.requests[position])
        cost = float(self.items.kv_charge[position])
        self.used[side] += cost
        self.inflight[index] = (side, cost)
        self._resplit()
        return index

    def on_progress(self, index: int, output_tokens: int) -> None:
        """Run-time correction: a request past its estimated output moves to the right (memory-heavy) budget.

        It has turned out longer than planned, so it is memory-heavy whatever
        side admitted it; it is charged the KV it holds now (prompt plus
        output so far) and re-charged at every later report. Without
        per-item estimates the charge stays the estimated peak.
        """
        estimate = self._estimate_of(index)
        if estimate is None or index not in self.inflight or output_tokens <= estimate * self.overrun_factor:
            return
        side, cost = self.inflight[index]
        charge = max(cost - estimate + float(output_tokens), cost)
        self.used[side] = max(self.used[side] - cost, 0.0)
        self.used[RIGHT] += charge
        self.inflight[index] = (RIGHT, charge)
        self.corrections += 1

    def _estimate_of(self, index: int) -> float | None:
        table = self._est_by_index
        if table is None or not 0 <= index < len(table) or np.isnan(table[index]):
            return None
        return float(table[index])

    def on_finish(self, index: int, output_tokens: int) -> None:
        side, cost = self.inflight.pop(index, (LEFT, 0.0))
        self.used[side] = max(self.used[side] - cost, 0.0)

    def remaining(self) -> int:
        return max(self.right - self.left, 0)


def _estimate_lookup(items: ScanItems) -> np.ndarray | None:
    """Estimated d by batch index (NaN for indices not in the scan), None without per-item estimates."""
    if items.output_est is None:
        return None
    table = np.full(int(items.requests.max(initial=-1)) + 1, np.nan)
    table[items.requests] = items.output_est
    return table


def static_dual_scan_order(items: ScanItems, lead: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Item positions in the order the dual scan admits them for engines that take a whole list, and each
    pick's side (0 left, 1 right).

    A list has no run-time state to split memory by, so the split's goal is
    applied to the list itself: the cursors advance so that the admitted
    stream's density stays at the job's, taking from the left (compute-heavy)
    end while the share of the job's compute admitted is at most the share of
    its KV reads admitted (scaled by ``1 - lead``), else from the right. The
    engine's own admission (as for any list) then fills its KV.

    ``lead`` lets the memory-heavy side run ahead: a long decode admitted at
    the end of the list runs alone after everything else, so the right side
    finishes admitting when ``1 - lead`` of the compute is admitted. What the
    pacing and the lead gain on the paper mixes is in docs/PLANNER_NOTES.md.
    """
    compute_array, reads_array = item_work(items)
    total_c, total_m = max(float(compute_array.sum()), 1e-12), max(float(reads_array.sum()), 1e-12)
    compute, reads = compute_array.tolist(), reads_array.tolist()  # Python floats: the loop reads them one by one
    n = len(compute)
    order = np.empty(n, dtype=np.int64)
    sides = np.empty(n, dtype=np.int8)
    left, right, c_taken, m_taken = 0, n, 0.0, 0.0
    for k in range(n):
        side = LEFT if c_taken / total_c <= (1.0 - lead) * m_taken / total_m else RIGHT
        if side == LEFT:
            position, left = left, left + 1
        else:
            right -= 1
            position = right
        order[k], sides[k] = position, side
        c_taken += compute[position]
        m_taken += reads[position]
    return order, sides
