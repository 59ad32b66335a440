"""Sort prompts by token sequence and find longest common prefixes of neighbours.

The prefix tree is derived from these two arrays (like a suffix tree from a
suffix array), so no Python object is ever made per token or per request.
"""

from __future__ import annotations

import numpy as np

_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit multiplier (golden ratio)


def _chunk_hash(tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray, chunk: int) -> np.ndarray:
    """64-bit hash of tokens[starts : starts + chunk] (clipped at ends); ``chunk`` must be even.

    It only answers "do all members of a group agree on this chunk?", which
    is most rounds inside a long shared prefix; pairs of tokens are read as
    one 64-bit word to halve the multiply-adds. A group whose different
    chunks all collide (about 2**-64 per pair) would be kept whole by mistake.
    """
    packed = _gather_chunk(tokens, starts, ends, chunk).view(np.uint64)
    h = packed[:, 0].copy()
    with np.errstate(over="ignore"):
        for k in range(1, packed.shape[1]):
            h = h * _HASH_MULT + packed[:, k]
    h[h == 0] = 1  # 0 is reserved for "prompt already ended"
    return h


def _gather_chunk(tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray, width: int) -> np.ndarray:
    """(n, width) uint32 block of token + 1 from each start, 0 past the prompt's end."""
    last = max(len(tokens) - 1, 0)
    cols = np.arange(width, dtype=np.int64)
    block = tokens[np.minimum(starts[:, None] + cols, last)].astype(np.uint32) + np.uint32(1)
    block[cols[None, :] >= (ends - starts)[:, None]] = 0
    return block


def _packed_words(tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray, chunk: int, bits: int) -> np.ndarray:
    """The chunk as (n, W) uint64 words whose lexicographic order is the tokens' (0 = past the end)."""
    per_word = 64 // bits
    n_words = -(-chunk // per_word)
    block = np.zeros((len(starts), n_words * per_word), dtype=np.uint64)
    block[:, :chunk] = _gather_chunk(tokens, starts, ends, chunk)  # zeros after the chunk: same for all
    block = block.reshape(len(starts), n_words, per_word)
    shifts = (bits * np.arange(per_word - 1, -1, -1)).astype(np.uint64)
    return np.bitwise_or.reduce(block << shifts, axis=2)


def _refine_round(state: dict, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray, lens: np.ndarray, j: int,
                  chunk: int) -> None:
    """Split every active group by its members' ``j``-th chunk.

    A hash of the chunk finds the groups whose members all agree (the common
    case inside a long shared prefix): those stay as they are. Only groups
    that do split are sorted, by exact packed tokens, so siblings come out in
    token order and prompts sharing part of a chunk stay adjacent.
    """
    active, order, group = state["active"], state["order"], state["group"]
    req = order[active]
    key = _chunk_hash(tokens, starts[req] + j * chunk, ends[req], chunk)
    key[lens[req] <= j * chunk] = 0
    g = group[active]
    head = np.ones(len(active), dtype=bool)
    head[1:] = g[1:] != g[:-1]
    group_index = np.cumsum(head) - 1
    splitting = np.zeros(int(head.sum()), dtype=bool)
    splitting[group_index[key != key[head][group_index]]] = True
    in_split = splitting[group_index]
    still = active[~in_split & (key != 0)]
    if in_split.any():
        still = np.sort(np.concatenate([still, _split_groups(state, tokens, starts, ends, active[in_split], j, chunk)]))
    state["active"] = still


def _split_groups(state: dict, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray, positions: np.ndarray, j: int,
                  chunk: int) -> np.ndarray:
    """Sort the groups at ``positions`` by exact chunk ``j``, record where neighbours parted; return still-active positions."""
    order, group = state["order"], state["group"]
    req = order[positions]
    g = group[positions]
    words = _packed_words(tokens, starts[req] + j * chunk, ends[req], chunk, state["bits"])
    perm = np.lexsort(tuple(words[:, w] for w in range(words.shape[1] - 1, -1, -1)) + (g,))
    order[positions] = req[perm]  # groups are contiguous position ranges: this only permutes within them
    words = words[perm]
    same_group = g[1:] == g[:-1]
    continues = np.zeros(len(positions), dtype=bool)
    continues[1:] = same_group & np.all(words[1:] == words[:-1], axis=1)
    parted = np.zeros(len(positions), dtype=bool)
    parted[1:] = same_group & ~continues[1:]
    state["split_round"][positions[parted]] = j
    new_group = np.maximum.accumulate(np.where(continues, 0, positions))
    group[positions] = new_group
    shared = continues.copy()
    shared[:-1] |= continues[1:]
    return positions[shared & (words[:, 0] != 0)]


def sort_prompts(
    tokens: np.ndarray, offsets: np.ndarray, tiebreak: np.ndarray | None = None, chunk: int = 16,
    starts: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Order of prompts grouped by shared prefix, and LCP with the previous prompt in that order.

    Groups are refined chunk by chunk (an MSD radix sort); only groups of
    two or more prompts that have not ended stay active, so a round costs
    what is still shared, not the whole batch. The order is lexicographic
    by token id (a shorter prompt before its extensions). Equal prompts are ordered by
    ``tiebreak`` (a sampling key), so identical requests end up adjacent.

    Returns ``order`` (n,) and ``lcp`` (n,), ``lcp[i]`` = common prefix of
    prompts ``order[i - 1]`` and ``order[i]`` (``lcp[0] = 0``).
    ``offsets`` give the lengths; prompt i starts at ``starts[i]`` when given
    (a batch sharing its tokens, ``RequestBatch.take``), else at ``offsets[i]``.
    """
    if chunk < 2 or chunk % 2:
        raise ValueError(f"chunk must be even and at least 2, got {chunk}")
    if len(tokens) and tokens.min() < 0:
        raise ValueError("token ids must be non-negative")
    n = len(offsets) - 1
    lens = np.diff(offsets).astype(np.int64)
    starts = offsets[:-1].astype(np.int64) if starts is None else np.asarray(starts, dtype=np.int64)
    ends = starts + lens
    state = {
        "order": np.arange(n, dtype=np.int64),
        "group": np.zeros(n, dtype=np.int64),
        "split_round": np.full(n, -1, dtype=np.int64),
        "active": np.arange(n, dtype=np.int64) if n > 1 else np.zeros(0, dtype=np.int64),
        "bits": max(int(tokens.max(initial=0)) + 1, 1).bit_length(),  # token + 1 fits; 0 marks "ended"
    }
    j = 0
    while len(state["active"]):
        _refine_round(state, tokens, starts, ends, lens, j, chunk)
        j += 1
    order, group = state["order"], state["group"]
    if tiebreak is not None and n:
        order = order[np.lexsort((np.asarray(tiebreak)[order], group))]
    lcp = _exact_lcp(tokens, starts, ends, lens, order, state["split_round"], chunk)
    return order, lcp


def _exact_lcp(
    tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray, lens: np.ndarray, order: np.ndarray,
    split_round: np.ndarray, chunk: int,
) -> np.ndarray:
    """LCP of neighbours: whole chunks before the round they parted, then token by token inside it."""
    n = len(order)
    lcp = np.zeros(n, dtype=np.int64)
    if n < 2:
        return lcp
    a, b = order[:-1], order[1:]
    rounds = split_round[1:]
    same = rounds < 0  # never parted: identical prompts
    lcp[1:][same] = lens[b][same]
    parted = np.flatnonzero(~same)
    a, b, base = a[parted], b[parted], rounds[parted] * chunk
    extra = np.zeros(len(parted), dtype=np.int64)
    equal = np.ones(len(parted), dtype=bool)
    last = max(len(tokens) - 1, 0)
    for k in range(chunk):
        pa, pb = starts[a] + base + k, starts[b] + base + k
        both = (pa < ends[a]) & (pb < ends[b])
        match = both & (tokens[np.minimum(pa, last)] == tokens[np.minimum(pb, last)])
        equal &= match
        extra += equal
    lcp[1:][parted] = base + extra
    return lcp


class RangeMin:
    """Sparse table over an int array: O(1) range minimum, O(log n) nearest-smaller searches, all vectorized.

    Level k holds min(values[i : i + 2**k]); levels are rows of one padded 2-D
    table so a query of many ranges is a single gather.
    """

    def __init__(self, values: np.ndarray) -> None:
        self.values = np.asarray(values, dtype=np.int64)
        n = len(self.values)
        n_levels = max(int(n).bit_length(), 1)
        self.table = np.full((n_levels, max(n, 1)), np.iinfo(np.int64).max, dtype=np.int64)
        self.table[0, :n] = self.values
        width = 1
        for level in range(1, n_levels):
            prev = self.table[level - 1]
            self.table[level, : n - 2 * width + 1] = np.minimum(prev[: n - 2 * width + 1], prev[width : n - width + 1])
            width *= 2

    def query(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """min(values[lo:hi]) elementwise; hi > lo required."""
        lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
        k = _floor_log2(hi - lo)
        flat = self.table.ravel()
        row = k * self.table.shape[1]
        return np.minimum(flat[row + lo], flat[row + hi - (np.int64(1) << k)])

    def extent_at_least(self, index: np.ndarray, threshold: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each i, the widest [lo, hi) around it with every value >= threshold[i].

        Binary lifting over the table: one pass per level, over all i at once.
        """
        n = len(self.values)
        lo = np.asarray(index, dtype=np.int64).copy()
        hi = lo + 1
        for level in range(self.table.shape[0] - 1, -1, -1):
            width = 1 << level
            table = self.table[level]
            can = lo - width >= 0
            can[can] = table[lo[can] - width] >= threshold[can]
            lo[can] -= width
            can = hi + width <= n
            can[can] = table[hi[can]] >= threshold[can]
            hi[can] += width
        return lo, hi


def _floor_log2(x: np.ndarray) -> np.ndarray:
    """floor(log2(x)) for positive int64 x, exact (float log2 can round up just below a power of two)."""
    k = np.floor(np.log2(np.maximum(x, 1).astype(np.float64))).astype(np.int64)
    k -= (np.int64(1) << k) > x
    k += (np.int64(1) << (k + 1)) <= x
    return np.maximum(k, 0)
