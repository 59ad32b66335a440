"""A run's report: Markdown with PNG figures in ``<db folder>/reports/<run_id>/``, rebuilt from DuckDB alone.

Each section reads one part of the run; a section whose data is missing (no
warm-up sample, an engine that reports no KV use) says so instead of failing.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import pandas as pd

from blendserve.report import plots
from blendserve.report.data import RunData, load_run
from blendserve.report.prediction import Prediction, prediction_for

log = logging.getLogger(__name__)

# Section headings in report order (tests and readers look for these).
SECTIONS = (
    "Throughput: achieved against predicted",
    "Prefix cache",
    "Output length: estimate against actual",
    "Shard balance",
    "Utilization timeline",
    "Rejects and errors",
    "Validation",
)
TOP_SUBTREES = 12  # subtrees shown in the per-subtree error figure and table
TOP_REASONS = 25  # reject and error reasons listed, most requests first


def report_dir(db: str | Path, run_id: str) -> Path:
    return Path(db).resolve().parent / "reports" / run_id


def build_report(db: str | Path, run_id: str, out_dir: str | Path | None = None) -> Path:
    """Write ``report.md`` and its PNGs for ``run_id`` of ``db``; returns the Markdown path."""
    out = Path(out_dir) if out_dir is not None else report_dir(db, run_id)
    out.mkdir(parents=True, exist_ok=True)
    data = load_run(db, run_id)
    prediction, why_not = prediction_for(data)
    sections: list[Callable[[], list[str]]] = [
        lambda: _throughput(data, prediction, why_not, out),
        lambda: _prefix_cache(data, prediction, out),
        lambda: _lengths(data, out),
        lambda: _shards(data, out),
        lambda: _utilization(data, out),
        lambda: _reasons(data),
        lambda: _validation(data),
    ]
    lines = _header(data)
    for heading, section in zip(SECTIONS, sections):
        lines += ["", f"## {heading}", "", *section()]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    log.info("run report: %s", path)
    return path


def _header(data: RunData) -> list[str]:
    t, run = data.totals, data.run
    return [
        f"# Run report: {data.run_id}",
        "",
        f"- engine **{run['engine']}**, policy **{run['policy']}**, status **{run['status']}**",
        f"- input `{run['input']}`; started {run['started_at']}, finished {run['finished_at'] or '-'}",
        f"- {t['requests']:,} requests answered ({t['errors']:,} errors), {t['rejected']:,} rejected at ingest;"
        f" {t['prompt_tokens']:,} tokens in, {t['output_tokens']:,} out",
        f"- rebuilt from `{data.db}` (`blendserve report {data.run_id} --db {data.db}`)",
    ]


def _image(path: Path | None, alt: str) -> list[str]:
    return [f"![{alt}]({path.name})"] if path is not None else []


def _num(x: float | None, unit: str = "") -> str:
    if x is None or pd.isna(x):
        return "-"
    return (f"{x:,.1f}" if abs(x) >= 100 else f"{x:.3g}") + unit


def _table(frame: pd.DataFrame) -> list[str]:
    """A Markdown table (pandas' to_markdown needs tabulate, which the stack does not ship)."""
    cells = frame.astype(object).where(frame.notna(), "-")
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    for row in cells.itertuples(index=False):
        lines.append("| " + " | ".join(str(v).replace("|", "\\|").replace("\n", " ") for v in row) + " |")
    return lines


def _throughput(data: RunData, prediction: Prediction | None, why_not: str, out: Path) -> list[str]:
    policy, achieved = data.run["policy"], data.metrics.get("tokens_per_second")
    lines = [f"Achieved: **{_num(achieved)} tokens/s** (input + output) over {_num(data.metrics.get('wall_seconds'))}"
             " s of inference (the slowest shard, its warm-up sample included)."]
    if prediction is None:
        return lines + ["", f"No prediction: {why_not}."]
    predicted = prediction.tokens_per_second.get(policy)
    lines += [f"Predicted for {policy}: {_num(predicted)} tokens/s, {_num(prediction.seconds.get(policy))} s"
              f" on {prediction.hardware} ({prediction.source})."]
    lines += _replay(data)
    if prediction.comparable and predicted and achieved is not None:
        clock = ("the simulator engine runs on the cost model's clock" if data.run["engine"] == "simulator" else
                 f"{prediction.hardware} is this machine's calibrated profile of the {data.run['engine']} engine")
        lines.append(f"Achieved / predicted: **{achieved / predicted:.2f}** ({clock}, so seconds compare directly;"
                     " the prediction plans on the warm-up's estimates from the start, the run learnt them during"
                     " its first answers).")
    elif not prediction.comparable:
        lines.append(f"The {data.run['engine']} engine did not run on the {prediction.hardware} profile the"
                     " prediction is costed on, so seconds do not compare; what compares is the order of"
                     " policies below and the prefix sharing in the next section.")
    ranking = sorted(prediction.seconds, key=prediction.seconds.get)
    lines.append("Predicted order, fastest first: " + ", ".join(
        f"**{p}**" if p == policy else p for p in ranking) + ".")
    figure = plots.throughput(prediction.tokens_per_second, achieved if prediction.comparable else None, policy,
                              out / "throughput.png")
    return lines + [""] + _image(figure, "predicted throughput per policy")


def _replay(data: RunData) -> list[str]:
    """The cost model's seconds for what ran (its order, the true output lengths) against the measured ones."""
    replay, measured = data.metrics.get("replay_seconds"), data.metrics.get("replay_measured_seconds")
    if replay is None or not measured:
        return []
    return [f"Replay on the calibrated profile (the order that ran, with the true output lengths):"
            f" **{_num(replay)} s predicted** vs {_num(measured)} s of inference measured,"
            f" error **{replay / measured - 1:+.1%}**."]


def _prefix_cache(data: RunData, prediction: Prediction | None, out: Path) -> list[str]:
    rate = data.metrics.get("prefix_hit_rate")
    predicted = prediction.prefix_hit_rate.get(data.run["policy"]) if prediction else None
    lines = [f"Hit rate achieved: **{_num(None if rate is None else 100 * rate, '%')}** of prompt tokens served"
             f" from the prefix cache; predicted {_num(None if predicted is None else 100 * predicted, '%')}."]
    sharing = data.metrics.get("predicted_shared_prompt_share")
    if sharing is not None:
        lines.append(f"The plan's order shares {sharing:.1%} of prompt tokens with a neighbour"
                     f" ({data.metrics.get('predicted_sharing_kept', 1.0):.1%} of the depth-first order's sharing).")
    figure = plots.prefix_hits(data.shards, predicted, out / "prefix_hits.png")
    if figure is None:
        return lines + ["", "The engine reported no prefix-cache counters, so there is no per-shard figure."]
    frame = data.shards.assign(hit_rate=data.shards["prefix_hits"] / data.shards["prefix_queries"])
    return lines + [""] + _image(figure, "prefix cache hit rate per shard") + [""] + _table(
        frame[["shard", "prefix_queries", "prefix_hits", "hit_rate"]].round(3))


def subtree_errors(lengths: pd.DataFrame) -> pd.DataFrame:
    """Per subtree whose samples gave the estimates: requests, mean estimate and actual, MAPE and bias."""
    frame = lengths.dropna(subset=["subtree"])
    if frame.empty:
        return pd.DataFrame(columns=["subtree", "requests", "estimate", "actual", "mape", "bias"])
    rel = (frame["estimate"] - frame["actual"]) / frame["actual"].clip(lower=1)
    n = frame["requests"]
    weighted = frame.assign(estimate=frame["estimate"] * n, actual=frame["actual"] * n, mape=rel.abs() * n, bias=rel * n)
    table = weighted.groupby("subtree")[["requests", "estimate", "actual", "mape", "bias"]].sum().reset_index()
    for column in ("estimate", "actual", "mape", "bias"):  # sums of request-weighted values: means per request
        table[column] /= table["requests"]
    return table.sort_values("requests", ascending=False).head(TOP_SUBTREES).round(3)


def _lengths(data: RunData, out: Path) -> list[str]:
    lengths = data.lengths
    if lengths.empty:
        return ["No answered request has a planned estimate (empty plan or every request failed)."]
    n = lengths["requests"]
    rel = (lengths["estimate"] - lengths["actual"]).abs() / lengths["actual"].clip(lower=1)
    lines = [f"{n.sum():,} requests: mean absolute error {(rel * n).sum() / n.sum():.1%} of the actual length,"
             f" mean estimate {(lengths['estimate'] * n).sum() / n.sum():.1f} tokens against"
             f" {(lengths['actual'] * n).sum() / n.sum():.1f} actual."]
    lines += [""] + _image(plots.length_scatter(lengths, out / "lengths.png"), "estimate against actual")
    if not data.has_samples:
        return lines + ["", "No warm-up sample for this run (the samples table is empty): estimates are the"
                            " planner's defaults (a known length, else max_tokens), so there is no per-subtree error."]
    errors = subtree_errors(lengths)
    lines += ["", "Error per subtree (the prefix-tree node whose sampled requests gave the estimate; bias > 0:"
                  " the plan expected longer answers):", ""]
    return lines + _image(plots.subtree_error(errors, out / "subtree_error.png"), "error per subtree") + [""] + \
        _table(errors)


def _shards(data: RunData, out: Path) -> list[str]:
    shards = data.shards
    if shards.empty:
        return ["No shard produced outputs."]
    served = shards[shards["shard"] >= 0]
    seconds = served["seconds"].dropna()
    lines = []
    if len(seconds):
        lines.append(f"Largest shard / mean: **{seconds.max() / seconds.mean():.3f}** in engine seconds"
                     f" ({len(served)} shard(s)); the plan expected"
                     f" {_num(data.metrics.get('predicted_shard_imbalance'))}.")
    else:
        lines.append("The engine timeline has no times, so the balance is shown in tokens only.")
    figure = plots.shard_balance(shards, out / "shards.png")
    return lines + [""] + _image(figure, "shard balance") + [""] + _table(
        shards[["shard", "requests", "prompt_tokens", "output_tokens", "seconds"]].round(4))


def _utilization(data: RunData, out: Path) -> list[str]:
    timeline = data.timeline
    if timeline.empty:
        return ["The engine reported no statistics for this run (engine_timeline is empty)."]
    lines = [f"{len(timeline):,} intervals of engine statistics over {timeline['shard'].nunique()} shard(s)."]
    if timeline["kv_used_tokens"].isna().all():
        lines.append("The engine reports no KV cache use, so that panel is left out.")
    if timeline[["prefill_tokens", "decode_tokens"]].isna().all().all():
        lines.append("The engine reports no per-interval token counts, so the tokens/s panel is left out.")
    figure = plots.utilization(timeline, out / "utilization.png")
    return lines + [""] + _image(figure, "engine utilization over time")


def _reasons(data: RunData) -> list[str]:
    if data.reasons.empty:
        return ["No request was rejected at ingest and none failed in the engine."]
    shown, rest = data.reasons.head(TOP_REASONS), data.reasons.iloc[TOP_REASONS:]
    # a reason may name a count (a prompt's length): a million requests can bring thousands of them
    more = [] if rest.empty else ["", f"... and {len(rest):,} more reasons ({int(rest['requests'].sum()):,} requests):"
                                      " the `rejects` table and the `outputs` errors hold them all."]
    return _table(shown) + more


def _validation(data: RunData) -> list[str]:
    frame = data.validation
    if frame.empty:
        return ["No validation results are stored for this run."]
    failed = int((~frame["success"]).sum())
    summary = f"{len(frame)} checks, **{failed} failed**." if failed else f"{len(frame)} checks, all passed."
    shown = frame.assign(success=frame["success"].map({True: "pass", False: "**FAIL**"}))
    return [summary, ""] + _table(shown)
