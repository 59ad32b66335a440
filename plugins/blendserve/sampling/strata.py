"""Prompt-side strata: requests that look alike before anything runs.

The prefix tree groups requests by the prompt text they share; strata group
them by what else is known of a request before it runs: its prompt length
and its output cap, and the group the user's data puts it in (its source file and metadata
task tag, ``RequestBatch.group``). A 12-token prompt under a 32k cap is not the same
kind of work as a 600-token question, whatever prefix the two share, and a
family of a hundred long answers in a job of 20,000 short ones can hold most
of its work. The warm-up sample covers every stratum that *could* hold a
material share of the job's work (``covered_strata``), and the estimator
uses a stratum's samples where they explain a request better than its
subtree's.
"""

from __future__ import annotations

import numpy as np

from blendserve.batch import RequestBatch

# A stratum gets its own samples when its requests, each running to its cap, could do this share of the
# job's least work (every prompt plus one output token): rare families with room for long answers qualify.
POTENTIAL_SHARE = 0.01
PER_STRATUM = 3  # samples a covered stratum gets: the estimator's min_samples, so they are used
# A group (all prompt lengths, one cap bucket) is covered from a quarter of that share: one left unsampled is
# estimated from other groups' samples. On the 40k d1.4-s35 mix, 8 video answers of 9,065-23,865 tokens, one
# group of 0.54% potential spread over prompt lengths, went unsampled and took MMLU subtrees' 181 tokens.
GROUP_SHARE = POTENTIAL_SHARE / 4


def strata(batch: RequestBatch, prompt_buckets: bool = True) -> np.ndarray:
    """(n,) stratum of each request: power-of-two bucket of its prompt length x of its max_tokens x its group
    (``RequestBatch.group``: source file and task tag); without ``prompt_buckets``, its group x its cap
    bucket only (the estimator's coarser level: a family spread over several prompt lengths)."""
    prompt = np.floor(np.log2(np.maximum(batch.prompt_lens, 1))).astype(np.int64)
    cap = np.floor(np.log2(np.maximum(batch.max_tokens.astype(np.int64), 1))).astype(np.int64)
    key = prompt * 64 + cap if prompt_buckets else cap
    if batch.group is not None:
        key = key + batch.group.astype(np.int64) * 4096
    return np.unique(key, return_inverse=True)[1].astype(np.int64)


def potential_shares(batch: RequestBatch, stratum: np.ndarray) -> np.ndarray:
    """(S,) what each stratum could cost at its caps (prompts plus max_tokens) over the job's least work."""
    prompt = batch.prompt_lens.astype(np.float64)
    least = max(float(np.sum(prompt + 1.0)), 1.0)
    return np.bincount(stratum, weights=prompt + batch.max_tokens.astype(np.float64)) / least


def covered_strata(batch: RequestBatch, stratum: np.ndarray, share: float = POTENTIAL_SHARE) -> np.ndarray:
    """(S,) bool: strata whose potential share reaches ``share`` and that hold two requests or more."""
    sizes = np.bincount(stratum)
    return (potential_shares(batch, stratum) >= share) & (sizes >= 2)


def censored_length(progress: np.ndarray | float, cap: np.ndarray | float) -> np.ndarray:
    """Expected output of a request still running after ``progress`` tokens, under a cap.

    Output lengths span orders of magnitude, so the prior is log-uniform
    between what it has produced and its cap: E[L | L > x] = (cap - x) / ln(cap / x).
    A request already at its cap (or past it) is expected to end there.
    """
    x = np.maximum(np.asarray(progress, dtype=np.float64), 1.0)
    c = np.maximum(np.asarray(cap, dtype=np.float64), 1.0)
    ratio = np.log(np.maximum(c / x, 1.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = np.where(ratio > 1e-9, (c - x) / ratio, c)
    return np.clip(expected, x, c)
