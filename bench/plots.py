"""The benchmark figures, one function each; they share the report's figure setup (Agg backend, size, DPI)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from blendserve.report.plots import _figure, _save

# The paper's colours are not ours to copy; a fixed order keeps a policy's colour the same in every figure.
POLICY_COLORS = {"fcfs": "tab:gray", "balance": "tab:olive", "density": "tab:purple", "dfs": "tab:blue",
                 "blendserve-nosplit": "tab:cyan", "blendserve[static]": "tab:olive",
                 "blendserve[spread]": "tab:brown", "blendserve": "tab:orange"}


def policy_bars(mixes: list[dict], policies: list[str], metric: str, setup: str, path: Path) -> Path:
    """Grouped bars: one group per mix, one bar per policy, ``metric`` from compare_policies' rows."""
    fig, axes = _figure(height=3.8)
    ax = axes[0][0]
    width = 0.8 / len(policies)
    for i, name in enumerate(policies):
        values = [100 * next(r[metric] for r in m["policies"] if r["policy"] == name) for m in mixes]
        ax.bar(np.arange(len(mixes)) + (i - len(policies) / 2 + 0.5) * width, values, width, label=name,
               color=POLICY_COLORS.get(name))
    ax.set_xticks(np.arange(len(mixes)), [m["mix"] for m in mixes])
    label = {"fraction_of_optimum": "throughput, % of optimum", "sharing_vs_dfs": "prefix sharing, % of dfs"}[metric]
    ax.set_ylabel(label)
    ax.axhline(100, color="black", linewidth=0.8)
    ax.set_title(f"{label} per policy and mix ({setup})", fontsize=10)
    # the legend sits in headroom above the 100% line, clear of the bars
    ax.set_ylim(0, max(125.0, ax.get_ylim()[1] + 15))
    ax.legend(fontsize=7, ncol=6, loc="upper center")
    return _save(fig, path)


def heatmap(values: np.ndarray, rows: list[float], cols: list[float], title: str, path: Path) -> Path:
    """values[i, j] at density rows[i], sharing cols[j], with the number written in each cell."""
    fig, axes = _figure(height=6.0)
    ax = axes[0][0]
    span = max(float(np.nanmax(np.abs(values - 1.0))), 0.05)
    image = ax.imshow(values, cmap="RdYlGn", vmin=1 - span, vmax=1 + span, origin="lower", aspect="auto")
    for (i, j), v in np.ndenumerate(values):
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(cols)), [f"{c:.0%}" for c in cols])
    ax.set_yticks(range(len(rows)), [f"{r:.2f}" for r in rows])
    ax.set_xlabel("target prefix sharing")
    ax.set_ylabel("target density")
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, label="speed-up over dfs")
    return _save(fig, path)


def utilization_timeline(series: dict[str, dict[str, np.ndarray]], title: str, path: Path) -> Path:
    """Compute and memory utilization over simulated time, one panel per policy (the paper's Figure 10)."""
    fig, axes = _figure(rows=len(series), height=2.4)
    end = max(float(s["t"][-1]) for s in series.values())
    for ax, (name, s) in zip(axes[:, 0], series.items()):
        ax.plot(s["t"], 100 * s["comp"], label="compute", color="tab:red", linewidth=1)
        ax.plot(s["t"], 100 * s["mem"], label="memory bandwidth", color="tab:blue", linewidth=1)
        ax.set_xlim(0, end)
        ax.set_ylim(0, 105)
        ax.set_ylabel(f"{name}\nutilization %", fontsize=8)
        ax.axvline(float(s["t"][-1]), color="black", linewidth=0.8, linestyle="--")
    axes[0, 0].set_title(title, fontsize=10)
    axes[0, 0].legend(fontsize=7, loc="lower left")
    axes[-1, 0].set_xlabel("simulated seconds (dashed: the policy's end)")
    return _save(fig, path)
