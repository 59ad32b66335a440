"""One small function per report figure. Each writes a PNG and returns its path, or None without data.

matplotlib is imported inside the functions with the Agg backend: the report
runs in Airflow workers and CLI sessions that have no display, and importing
this module must stay cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

DPI = 110
SHARD_NAMES = {-1: "warm-up"}  # the warm-up task of runs before 2026-11-29


def _figure(rows: int = 1, height: float = 3.6) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(rows, 1, figsize=(7.5, height * rows), squeeze=False)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _shard_label(shard: int) -> str:
    return SHARD_NAMES.get(int(shard), f"shard {int(shard)}")


def throughput(predicted: dict[str, float], achieved: float | None, policy: str, path: Path) -> Path | None:
    """Predicted tokens/s of every policy; the run's policy highlighted; achieved as a line when comparable."""
    if not predicted:
        return None
    fig, axes = _figure()
    ax = axes[0][0]
    names = sorted(predicted, key=predicted.get, reverse=True)
    colors = ["tab:orange" if n == policy else "tab:blue" for n in names]
    ax.barh(names, [predicted[n] for n in names], color=colors)
    ax.invert_yaxis()
    if achieved is not None:
        ax.axvline(achieved, color="black", linestyle="--", label=f"achieved ({policy}): {achieved:,.0f}")
        ax.legend(loc="lower right")
    ax.set_xlabel("tokens per second (input + output)")
    ax.xaxis.set_major_formatter(lambda x, _: f"{x:,.0f}")
    ax.set_title(f"Predicted throughput per policy (orange: this run's policy, {policy})")
    return _save(fig, path)


def prefix_hits(shards: pd.DataFrame, predicted: float | None, path: Path) -> Path | None:
    """Prefix-cache hit rate per shard, from the engine's counters, against the predicted rate."""
    rates = shards["prefix_hits"] / shards["prefix_queries"].replace(0, np.nan)
    if rates.isna().all():
        return None
    fig, axes = _figure()
    ax = axes[0][0]
    labels = [_shard_label(s) for s in shards["shard"]]
    ax.bar(labels, rates.fillna(0).to_numpy() * 100, color="tab:green")
    if predicted is not None:
        ax.axhline(predicted * 100, color="black", linestyle="--", label=f"predicted {predicted:.1%}")
        ax.legend()
    ax.set_ylabel("prompt tokens from cache (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Prefix cache hit rate per shard")
    return _save(fig, path)


def length_scatter(lengths: pd.DataFrame, path: Path) -> Path | None:
    """Estimated against actual output length, one dot per distinct pair (its area grows with its requests),
    coloured by where the estimate came from."""
    if lengths.empty:
        return None
    fig, axes = _figure(height=4.5)
    ax = axes[0][0]
    rng = np.random.default_rng(0)
    for kind, group in lengths.groupby("kind"):
        # a little jitter: pairs of other subtrees may share one estimate and one length (1-token answers)
        jitter = rng.uniform(-0.04, 0.04, size=(2, len(group)))
        ax.scatter(group["estimate"] * (1 + jitter[0]), group["actual"] * (1 + jitter[1]),
                   s=14 * np.sqrt(group["requests"]), alpha=0.7, label=f"{kind} ({int(group['requests'].sum())})")
    top = float(max(lengths["estimate"].max(), lengths["actual"].max(), 2))
    ax.plot([1, top], [1, top], color="grey", linewidth=1, label="estimate = actual")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("estimated output tokens (plan)")
    ax.set_ylabel("actual output tokens")
    ax.set_title("Output length: estimate against actual")
    ax.legend(fontsize=8)
    return _save(fig, path)


def subtree_error(errors: pd.DataFrame, path: Path) -> Path | None:
    """Mean absolute percentage error of the estimate per prefix-tree subtree (the largest subtrees)."""
    if errors.empty:
        return None
    fig, axes = _figure()
    ax = axes[0][0]
    labels = [f"{s} ({int(n)})" for s, n in zip(errors["subtree"], errors["requests"])]
    ax.barh(labels, errors["mape"] * 100, color="tab:purple")
    ax.invert_yaxis()
    ax.set_xlabel("mean absolute error (% of actual length)")
    ax.set_title("Estimate error per subtree whose samples gave the estimate (requests)")
    return _save(fig, path)


def shard_balance(shards: pd.DataFrame, path: Path) -> Path | None:
    """Per shard: engine seconds and tokens, to see whether one shard held the run up."""
    if shards.empty:
        return None
    fig, axes = _figure(rows=2, height=2.8)
    labels = [_shard_label(s) for s in shards["shard"]]
    tokens = shards["prompt_tokens"].fillna(0) + shards["output_tokens"].fillna(0)
    axes[0][0].bar(labels, shards["seconds"].fillna(0), color="tab:blue")
    axes[0][0].set_ylabel("engine seconds")
    axes[0][0].set_title("Shard balance")
    axes[1][0].bar(labels, tokens, color="tab:cyan")
    axes[1][0].set_ylabel("tokens (in + out)")
    return _save(fig, path)


def utilization(timeline: pd.DataFrame, path: Path) -> Path | None:
    """The engine's statistics over time per shard: running and waiting requests, KV use, tokens per second."""
    if timeline.empty or timeline["t"].isna().all():
        return None
    frame = timeline.assign(
        kv_share=100 * timeline["kv_used_tokens"] / timeline["kv_total_tokens"].replace(0, np.nan),
        tokens=timeline["prefill_tokens"].fillna(0) + timeline["decode_tokens"].fillna(0))
    panels = [("running", "requests running"), ("waiting", "requests waiting"), ("kv_share", "KV cache used (%)"),
              ("tokens_per_s", "tokens / s")]
    # a panel the engine cannot fill (None in every row) is left out rather than drawn empty
    has_tokens = timeline[["prefill_tokens", "decode_tokens"]].notna().any().any()
    panels = [p for p in panels if (has_tokens if p[0] == "tokens_per_s" else frame[p[0]].notna().any())]
    fig, axes = _figure(rows=len(panels), height=2.2)
    for shard, rows in frame.groupby("shard"):
        # each row covers the interval that ends at t; the first one starts at 0
        t = np.concatenate([[0.0], rows["t"].to_numpy(dtype=float)])
        rows = rows.assign(tokens_per_s=rows["tokens"] / np.diff(t))
        for ax, (column, _) in zip(axes[:, 0], panels):
            values = rows[column].to_numpy(dtype=float)
            ax.step(t, np.concatenate([values[:1], values]), where="pre", marker=".", label=_shard_label(shard))
    for ax, (_, label) in zip(axes[:, 0], panels):
        ax.set_ylabel(label, fontsize=8)
    axes[0, 0].set_title("Engine utilization over time (each point: the end of one statistics interval)")
    axes[0, 0].legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the shard started")
    return _save(fig, path)
