"""Estimate versus actual after a run: one row per request, and errors per subtree and overall.

Errors are reported only for requests whose length was estimated (sampled
and known lengths are exact by construction and would flatter the numbers).
MAPE is the mean of |estimate - actual| / actual; bias is the signed total
error over the total actual (positive: the estimates were too long, so the
plan thought the job more memory-heavy than it was).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

from blendserve.batch import RequestBatch
from blendserve.planner.prefix_tree import PrefixTree
from blendserve.sampling.estimator import KIND_NAMES, KNOWN, SAMPLED, Estimates

ESTIMATE_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # sampled, known, subtree, sibling, ancestor, no_sample
        pa.field("source_node", pa.int64(), nullable=False),  # prefix-tree node whose samples made it, -1 if none
        pa.field("est_output_tokens", pa.int32(), nullable=False),  # mean estimate the planner used
        pa.field("est_high_tokens", pa.int32(), nullable=False),  # high quantile (KV budget)
        pa.field("actual_output_tokens", pa.int32(), nullable=True),  # what the engine produced; null if no result
    ]
)


@dataclass
class ErrorRow:
    group: str  # "overall" or "node <id>" (the subtree whose samples made the estimates)
    depth: int  # prompt tokens of the subtree's shared prefix (-1 for overall)
    requests: int  # estimated requests in the group with an actual length
    mean_estimate: float  # mean estimated output tokens
    mean_actual: float  # mean actual output tokens
    mape: float  # mean absolute percentage error, as a fraction
    bias: float  # sum(estimate - actual) / sum(actual), signed


def estimate_table(batch: RequestBatch, estimates: Estimates, actual: np.ndarray) -> pa.Table:
    """One row per request: what was estimated, from where, and what came out (``actual`` < 0: no result)."""
    actual = np.asarray(actual, dtype=np.int64)
    return pa.table(
        {
            "request_id": pa.array(batch.request_ids.astype(object), pa.string()),
            "kind": pa.array([KIND_NAMES[k] for k in estimates.kind], pa.string()),
            "source_node": pa.array(estimates.source_node, pa.int64()),
            "est_output_tokens": pa.array(estimates.mean, pa.int32()),
            "est_high_tokens": pa.array(estimates.high, pa.int32()),
            "actual_output_tokens": pa.array(actual, pa.int32(), mask=actual < 0),
        },
        schema=ESTIMATE_SCHEMA,
    )


def estimate_report(tree: PrefixTree, estimates: Estimates, actual: np.ndarray, top: int | None = None) -> list[ErrorRow]:
    """Overall errors, then one row per source subtree (most requests first; ``top`` of them if given)."""
    actual = np.asarray(actual, dtype=np.float64)
    scored = (estimates.kind != SAMPLED) & (estimates.kind != KNOWN) & (actual > 0)
    est, act, source = estimates.mean[scored].astype(np.float64), actual[scored], estimates.source_node[scored]
    rows = [_row("overall", -1, est, act)]
    nodes, counts = np.unique(source, return_counts=True)
    for node in nodes[np.argsort(-counts, kind="stable")][:top]:
        at = source == node
        depth = int(tree.depth[node]) if node >= 0 else -1
        rows.append(_row(f"node {int(node)}" if node >= 0 else "no samples", depth, est[at], act[at]))
    return rows


def _row(group: str, depth: int, est: np.ndarray, act: np.ndarray) -> ErrorRow:
    if not len(act):
        return ErrorRow(group, depth, 0, 0.0, 0.0, 0.0, 0.0)
    return ErrorRow(
        group=group,
        depth=depth,
        requests=len(act),
        mean_estimate=float(est.mean()),
        mean_actual=float(act.mean()),
        mape=float(np.mean(np.abs(est - act) / act)),
        bias=float((est - act).sum() / act.sum()),
    )


def report_text(rows: list[ErrorRow]) -> str:
    """The report as an aligned text table."""
    lines = [f"{'group':<14} {'depth':>6} {'requests':>9} {'est':>8} {'actual':>8} {'MAPE':>7} {'bias':>7}"]
    for r in rows:
        lines.append(f"{r.group:<14} {r.depth:>6} {r.requests:>9} {r.mean_estimate:>8.1f} {r.mean_actual:>8.1f} "
                     f"{r.mape:>7.1%} {r.bias:>+7.1%}")
    return "\n".join(lines)


def report_dicts(rows: list[ErrorRow]) -> list[dict]:
    """The report as plain dicts, for JSON or a DuckDB insert."""
    return [asdict(r) for r in rows]
