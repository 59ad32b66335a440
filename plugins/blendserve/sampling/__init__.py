"""Warm-up sampling: learn output lengths from a small real sample before planning.

The planner's densities need every request's output length, which nobody
knows before generation. BlendServe samples about 1% of the requests (at
least one per large prefix subtree), runs them first on the real engine,
and estimates the rest from their subtree's sampled lengths. The sampled
outputs are final results: they are stored like any other and never run
again.

API for the pipeline (each infer shard's first answers, ``pipeline.shard``):

``select_samples(batch, tree, rate=0.01, min_subtree=100, cap=5000, seed=0) -> np.ndarray``
    Sorted batch indices to run in the warm-up phase. ``tree`` is the
    planner's ``build_prefix_tree(batch, cost_model)`` (estimates do not
    matter for selection). Known-length requests are never sampled.
``estimate_outputs(batch, tree, sampled_idx, observed_lengths, min_samples=3, quantile=0.9) -> Estimates``
    ``observed_lengths`` are the warm-up results' ``num_output_tokens``,
    aligned with ``sampled_idx``. ``Estimates.mean`` goes to
    ``build_plan(..., output_estimates=...)``; ``Estimates.high`` is a high
    quantile for KV budgeting; ``kind`` and ``source_node`` say where each
    estimate came from. The plan should then leave the sampled requests out
    (``batch.take(unsampled)``) or skip them at run time: they already
    have results.
``draw_outputs(estimates, draws, seed=0) -> list[np.ndarray]``
    Output lengths resampled from the samples behind each estimate: what
    the estimates leave uncertain, for a choice that must not bet on a mean.
``estimate_table(batch, estimates, actual) -> pyarrow.Table``
    One row per request (``ESTIMATE_SCHEMA``): estimate, high quantile,
    source, actual (null when no result): the ``samples`` table.
``estimate_report(tree, estimates, actual, top=None) -> list[ErrorRow]``
    MAPE and bias overall and per source subtree; ``report_text`` prints it.
``split_warmup(tree, sampled_idx) -> WarmupSplit``
    ``run`` (the warm-up phase), ``fanned`` (duplicates a warm-up result
    answers) and ``rest`` (planned after it): every request in exactly one.
The warm-up inside one engine run (samples first, fillers beside them, then the policy on
the learnt lengths) is ``blendserve.scheduling.warmup``.
"""

from blendserve.sampling.estimator import KIND_NAMES, Estimates, draw_outputs, estimate_outputs, estimates_from
from blendserve.sampling.report import ESTIMATE_SCHEMA, ErrorRow, estimate_report, estimate_table, report_text
from blendserve.sampling.select import WarmupSplit, eligible_leaves, select_samples, shard_sample, split_warmup

__all__ = [
    "ESTIMATE_SCHEMA",
    "ErrorRow",
    "Estimates",
    "draw_outputs",
    "WarmupSplit",
    "KIND_NAMES",
    "eligible_leaves",
    "estimate_outputs",
    "estimates_from",
    "estimate_report",
    "estimate_table",
    "report_text",
    "select_samples",
    "shard_sample",
    "split_warmup",
]
