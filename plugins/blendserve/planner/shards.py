"""Data-parallel shards: cut the dual-scan stream into K pieces of equal estimated time.

The stream eats the ordered list from both ends, so cutting it at a point
in time gives each shard one contiguous piece from the left (compute-heavy)
and one from the right (memory-heavy): every shard is itself blended and
prefix-local. Each cut loses at most one root-to-leaf path of sharing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blendserve.costmodel import CostModel


@dataclass
class Shards:
    of_item: np.ndarray  # (k,) shard of each item position of the planned order
    left_cuts: np.ndarray  # (K + 1,) shard j takes left items [left_cuts[j], left_cuts[j + 1])
    right_cuts: np.ndarray  # (K + 1,) ... and right items [right_cuts[j + 1], right_cuts[j])
    comp: np.ndarray  # (K,) Comp_eff seconds of each shard
    mem: np.ndarray  # (K,) Mem seconds of each shard
    time: np.ndarray  # (K,) estimated seconds of each shard: max(comp, mem)

    @property
    def imbalance(self) -> float:
        """Largest shard's estimated time over the mean (1.0 is perfect)."""
        mean = float(self.time.mean()) if len(self.time) else 0.0
        return float(self.time.max() / mean) if mean > 0 else 1.0


def cut_shards(
    stream: np.ndarray,
    sides: np.ndarray,
    item_costs: tuple[np.ndarray, np.ndarray, np.ndarray],
    cost_model: CostModel,
    k: int,
) -> Shards:
    """Split the dual-scan ``stream`` (item positions with their ``sides``) into ``k`` shards.

    ``item_costs`` = (tokens computed if the previous item's prefix is
    cached, prompt tokens shared with the previous item, Mem seconds) per
    item position; a shard whose piece starts at an item pays that item's
    shared part again. Every item is a leaf, so any cut is between whole
    subtrees and loses at most the one prefix path it crosses.
    """
    n = len(stream)
    k = max(1, min(int(k), max(n, 1)))
    fresh, shared, mem = item_costs
    at = _balanced_cuts(cost_model.comp_time(fresh)[stream], mem[stream], k)
    left_picks = np.concatenate([[0], np.cumsum(sides == 0)])
    left_cuts, right_cuts = _monotone(left_picks[at], n - (at - left_picks[at]), n)
    of_item = np.empty(n, dtype=np.int64)
    for j in range(k):
        of_item[left_cuts[j] : left_cuts[j + 1]] = j
        of_item[right_cuts[j + 1] : right_cuts[j]] = j
    first_of_piece = np.zeros(n, dtype=bool)
    piece_starts = np.concatenate([left_cuts[:-1], right_cuts[1:]])
    first_of_piece[piece_starts[piece_starts < n]] = True
    tokens = fresh + np.where(first_of_piece, shared, 0)
    comp = cost_model.comp_time(np.bincount(of_item, weights=tokens, minlength=k))
    mem_k = np.bincount(of_item, weights=mem, minlength=k)
    return Shards(of_item, left_cuts, right_cuts, comp, mem_k, np.maximum(comp, mem_k))


def _balanced_cuts(comp: np.ndarray, mem: np.ndarray, k: int) -> np.ndarray:
    """K - 1 stream positions giving every piece about the same max(Comp, Mem).

    For a per-shard time T the cuts follow greedily (a piece ends where
    either sum reaches T); bisection finds the T that leaves the last piece
    no longer than the others.
    """
    c = np.concatenate([[0.0], np.cumsum(comp)])
    m = np.concatenate([[0.0], np.cumsum(mem)])
    n = len(comp)

    def cuts_for(t: float) -> np.ndarray:
        at, out = 0, []
        for _ in range(k - 1):
            at = int(min(np.searchsorted(c, c[at] + t), np.searchsorted(m, m[at] + t), n))
            out.append(at)
        return np.asarray(out, dtype=np.int64)

    lo, hi = max(c[-1], m[-1]) / k, max(c[-1], m[-1])
    for _ in range(40):
        mid = (lo + hi) / 2
        at = cuts_for(mid)
        last = max(c[-1] - c[at[-1]], m[-1] - m[at[-1]]) if k > 1 else 0.0
        lo, hi = (mid, hi) if last > mid else (lo, mid)
    return cuts_for(hi)


def _monotone(left: np.ndarray, right: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut lists framed by the ends: left non-decreasing from 0, right non-increasing from n, never crossing.

    The last shard takes the middle, where the two cursors met.
    """
    lefts, rights = [0], [n]
    for a, b in zip(left.tolist(), right.tolist()):
        a, b = max(a, lefts[-1]), min(b, rights[-1])
        if a > b:
            a = b = min(max(a, lefts[-1]), rights[-1])
        lefts.append(a)
        rights.append(b)
    meet = lefts[-1]
    return np.asarray(lefts + [meet], dtype=np.int64), np.asarray(rights + [meet], dtype=np.int64)
