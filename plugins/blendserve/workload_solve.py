"""How many requests of each source a paper mix needs: the counts whose expected density and sharing meet
the mix's targets, costed from per-source expectations without building the file (used by ``workload``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from blendserve.costmodel import CostModel
from blendserve.workload_sources import Pool, video_lengths

if TYPE_CHECKING:
    from blendserve.workload import WorkloadSpec


@dataclass
class SourceStats:
    """Per-request expectations of a pool, enough to cost a mix without building it."""

    mean_p: float  # E[p]
    mean_d: float  # E[d]
    mean_reads: float  # E[p d + d (d + 1) / 2]: KV tokens read, as Mem counts them
    shared: float  # tokens computed once however many requests (system prompt, subject prefixes)
    per_distinct: float  # unique tokens each distinct row adds beyond ``shared``
    distinct_rows: int  # rows in the pool (a larger count repeats rows)


def prefix_lengths(pool: Pool) -> np.ndarray:
    """Tokens every prompt of a group shares (the MMLU subject's few-shot prefix), per group."""
    out = np.zeros(int(pool.group.max(initial=0)) + 1, dtype=np.int64)
    for g in range(len(out)):
        rows = np.flatnonzero(pool.group == g)
        first = pool.tokens[pool.offsets[rows[0]] : pool.offsets[rows[0] + 1]]
        shared = len(first)
        for r in rows[1:]:
            other = pool.tokens[pool.offsets[r] : pool.offsets[r + 1]][:shared]
            diff = np.flatnonzero(first[: len(other)] != other)
            shared = int(diff[0]) if len(diff) else min(shared, len(other))
        out[g] = shared
    return out


def source_stats(pool: Pool, spec: WorkloadSpec, rng: np.random.Generator) -> SourceStats:
    p = pool.prompt_lens.astype(np.float64)
    if pool.name == "video":
        d, _, _ = video_lengths(rng, 100_000, spec.video_mean_tokens)
        d = d.astype(np.float64)
        reads = p.mean() * d.mean() + (np.mean(d * d) + d.mean()) / 2.0
        return SourceStats(p.mean(), d.mean(), reads, 0.0, p.mean(), len(pool))
    d = pool.outputs.astype(np.float64)
    reads = float(np.mean(p * d + d * (d + 1.0) / 2.0))
    if pool.name == "api":
        s = np.minimum(spec.system_prompt_tokens, p - 1)  # a prompt keeps at least one token of its own
        return SourceStats(p.mean(), d.mean(), reads, float(spec.system_prompt_tokens), float(np.mean(p - s)), 1 << 62)
    prefix = prefix_lengths(pool)
    return SourceStats(p.mean(), d.mean(), reads, float(prefix.sum()), float(np.mean(p - prefix[pool.group])), len(pool))


def mix_metrics(stats: dict[str, SourceStats], counts: dict[str, float], cost: CostModel) -> tuple[float, float]:
    """Expected (density, sharing) of a mix with these request counts."""
    unique = total_p = out = reads = 0.0
    for name, n in counts.items():
        if n <= 0:
            continue
        st = stats[name]
        unique += st.shared + min(n, st.distinct_rows) * st.per_distinct
        total_p += n * st.mean_p
        out += n * st.mean_d
        reads += n * st.mean_reads
    density = float(cost.density(cost.comp_time(unique + out), cost.kv_read_time(reads)))
    return density, 1.0 - unique / total_p


def _bisect(f, lo: float, hi: float, target: float, increasing: bool, iters: int = 50) -> float:
    for _ in range(iters):
        mid = (lo + hi) / 2.0
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def solve_mix(stats: dict[str, SourceStats], spec: WorkloadSpec, cost: CostModel) -> dict[str, int]:
    """Request counts whose expected density and sharing meet the targets (clamped when out of reach).

    Outer search: the MMLU share of compute-heavy requests (sharing rises with it);
    inner search: the video share of all requests (density falls with it).
    """
    n = spec.num_requests

    def counts(m: float, v: float) -> dict[str, float]:
        return {"api": n * (1 - v) * (1 - m), "mmlu": n * (1 - v) * m, "video": n * v}

    def video_share(m: float) -> float:
        return _bisect(lambda v: mix_metrics(stats, counts(m, v), cost)[0], 0.0, 1.0, spec.density, False)

    m = _bisect(lambda m: mix_metrics(stats, counts(m, video_share(m)), cost)[1], 0.0, 1.0, spec.sharing, True, 30)
    raw = counts(m, video_share(m))
    rounded = {k: int(round(v)) for k, v in raw.items()}
    rounded["api"] += n - sum(rounded.values())
    return rounded
