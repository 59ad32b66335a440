"""Markdown pieces every section of docs/BENCHMARKS.md uses: tables, ratios, images, and the lines that say
which run, machine and planner revision made a result (used by tables.py, scorecard.py and render.py)."""

from __future__ import annotations

from blendserve.scheduling import (BASELINE_PICK_REVISION, HIDDEN_LENGTHS_REVISION, KNOWN_LENGTHS_REVISION,
                                   PLANNER_REVISION)
from blendserve.scheduling.choice import BASELINES


def planner_revision(provenance: dict) -> int:
    """The planner revision a run had (results written before revisions were stored: 0)."""
    return int(provenance.get("planner", 0))


def is_current(provenance: dict, hidden: bool, chosen: str | None = None) -> bool:
    """Whether a run's planner revision orders as this checkout's would: from ``HIDDEN_LENGTHS_REVISION`` with
    lengths hidden, ``KNOWN_LENGTHS_REVISION`` with them known (no warm-up); from ``BASELINE_PICK_REVISION``
    where blendserve's picks (``chosen``: "first → re-plan") took a baseline, the one change since then."""
    revision = planner_revision(provenance)
    if picked_baseline(chosen):
        return revision >= BASELINE_PICK_REVISION
    return revision >= (HIDDEN_LENGTHS_REVISION if hidden else KNOWN_LENGTHS_REVISION)


def picked_baseline(chosen: str | None) -> bool:
    """Whether a run's recorded picks ("deadline-1", "deadline-1 → keep") include a baseline."""
    return chosen is not None and any(part.strip() in BASELINES for part in chosen.split("→"))


def policy_rows(mix: dict) -> dict[str, dict]:
    """A mix's runs by policy name (none for a mix that lists no policies)."""
    return {r["policy"]: r for r in mix.get("policies", [])}


def blendserve_pick(mix: dict) -> str | None:
    """The candidate a table row's ``blendserve`` run chose (None without one)."""
    return policy_rows(mix).get("blendserve", {}).get("chosen")


def planned_earlier(mixes: list[dict], hidden: bool | None = None) -> list[str]:
    """Mixes whose plans an earlier planner revision made: not what the planner does now (``is_current``). With
    ``hidden`` None, a mix with a uniform ``max_tokens`` ran with lengths hidden."""
    return [m["mix"] for m in mixes if not is_current(
        m.get("provenance", {}), m.get("max_tokens") is not None if hidden is None else hidden, blendserve_pick(m))]


def planned_earlier_note(mixes: list[dict], hidden: bool | None = None) -> str:
    """A sentence naming the mixes an earlier planner revision planned, or nothing."""
    old = planned_earlier(mixes, hidden)
    return (f" Planned by an earlier planner revision than this checkout's ({PLANNER_REVISION}), not rerun since: "
            f"{', '.join(old)}." if old else "")


def provenance(data: dict) -> str:
    """Machine, versions and the command, under every table."""
    p = data["provenance"]
    dirty = f", uncommitted: {', '.join(p['uncommitted'])}" if p["uncommitted"] else ""
    return (f"<sub>Machine: {p['cpu']}, {p['cores']} cores, no GPU. Python {p['python']}, numpy {p['numpy']}, "
            f"blendserve {p['commit']}{dirty}, planner revision {planner_revision(p)}. Run {p['date']}: "
            f"`{p['command']}`</sub>")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def times(ratio: float) -> str:
    """A speed ratio to three decimals: the misses are within a few tenths of a percent, and "1.00x" hides them;
    to four where three would round a miss up to "1.000x"."""
    return f"{ratio:.4f}x" if 0.9995 <= ratio < 1.0 else f"{ratio:.3f}x"


def image(name: str, alt: str) -> str:
    return f"![{alt}](img/{name})"


def measured_by(data: dict, entries: dict[str, dict], what: str) -> str:
    """Which run measured each of ``entries`` (``what``: "Batches", "Mixes"), when they were not all measured by
    the run the file's provenance names (benches that keep the parts a run did not measure)."""
    runs = {name: e["provenance"] for name, e in entries.items() if "provenance" in e}
    same = lambda p: (p["commit"], p["command"]) == (data["provenance"]["commit"], data["provenance"]["command"])  # noqa: E731
    if all(same(p) for p in runs.values()):
        return ""
    return f"<sub>{what} measured by different runs: " + "; ".join(
        f"{name}: blendserve {p['commit']}, {p['date']}, `{p['command']}`" for name, p in runs.items()) + ".</sub>"
