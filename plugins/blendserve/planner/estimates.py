"""Output-length estimates the planner may use (never the simulator's true lengths)."""

from __future__ import annotations

import numpy as np

from blendserve.batch import UNKNOWN, RequestBatch


def default_output_estimates(batch: RequestBatch) -> np.ndarray:
    """Estimated output tokens when no sampler has run: a known length, else the request's cap.

    ``max_tokens`` is an upper bound, so without warm-up sampling the planner
    errs towards memory-heavy; a known length (e.g. video frames) is exact.
    """
    known = batch.expected_output_tokens != UNKNOWN
    estimates = np.where(known, batch.expected_output_tokens, batch.max_tokens).astype(np.int64)
    return np.maximum(estimates, 1)  # every request decodes at least one token


def checked_estimates(batch: RequestBatch, estimates: np.ndarray | None) -> np.ndarray:
    """``estimates`` as int64 of the batch's length (defaulted when None), capped by max_tokens."""
    if estimates is None:
        return default_output_estimates(batch)
    estimates = np.asarray(estimates, dtype=np.int64)
    if estimates.shape != (len(batch),):
        raise ValueError(f"output estimates have shape {estimates.shape}, expected ({len(batch)},)")
    return np.clip(estimates, 1, np.maximum(batch.max_tokens.astype(np.int64), 1))
