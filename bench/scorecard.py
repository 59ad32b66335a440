"""Issue 20's "done when", read off the stored hidden-length results: every run where blendserve is slower than
``fcfs``, ``balance`` or ``dfs``, its sharing against dfs's, and its mean fraction of T_opt on the paper mixes.

Nothing is computed here but ratios of stored seconds; ``render.py`` places the section under the headline.
"""

from __future__ import annotations

from dataclasses import dataclass

from page_parts import is_current, policy_rows, table, times
from tables import SEED_BASELINES, seed_ratios

BASELINES = ("fcfs", "balance", "dfs")
# What the issue asks of the paper mixes' mean at 40k requests (fraction of T_opt).
OPT_FLOOR = 0.85
# What the issue asks of blendserve's prefix sharing, as a share of dfs's.
SHARING_FLOOR = 0.97


@dataclass
class Run:
    """One hidden-length run of blendserve beside the baselines it ran with."""

    name: str  # the mix, "mix seed N" or the grid cell
    vs: dict[str, float]  # baseline -> its seconds over blendserve's (below 1: blendserve is slower)
    sharing: float | None  # blendserve's prefix sharing over dfs's; None where dfs did not run
    current: bool  # planned by this checkout's planner revision

    @property
    def worst(self) -> str:
        """The baseline blendserve fares worst against (the lowest ratio)."""
        return min(self.vs, key=self.vs.get)


def policy_runs(data: dict) -> list[Run]:
    """The runs of a ``bench_policies.py`` result (paper or rare-heavy mixes)."""
    runs = []
    for mix in data["mixes"]:
        rows = policy_rows(mix)
        blend = rows["blendserve"]
        runs.append(Run(mix["mix"], {b: rows[b]["time_s"] / blend["time_s"] for b in BASELINES if b in rows},
                        blend["sharing_vs_dfs"] if "dfs" in rows else None,
                        is_current(mix.get("provenance", data["provenance"]), True, blend.get("chosen"))))
    return runs


def seed_runs(data: dict) -> list[Run]:
    """The runs of a ``bench_seeds.py`` result, one per mix and seed (it runs no dfs)."""
    return [Run(f"{mix} seed {seed}", seed_ratios(run), None,
                is_current(run["provenance"], True, run["blendserve"].get("chosen")))
            for mix, seeds in data["mixes"].items() for seed, run in sorted(seeds.items(), key=lambda s: int(s[0]))]


def seed_totals(data: dict) -> list[Run]:
    """A ``bench_seeds.py`` result judged over its seeds: one run per mix, each policy's seconds summed over the
    seeds (the paper's figures are such means; a per-seed miss can be the job's luck)."""
    runs = []
    for mix, seeds in data["mixes"].items():
        total = {p: sum(run[p]["time_s"] for run in seeds.values()) for p in (*SEED_BASELINES, "blendserve")}
        runs.append(Run(f"{mix} ({len(seeds)} seeds)", {b: total[b] / total["blendserve"] for b in SEED_BASELINES},
                        None, all(is_current(run["provenance"], True, run["blendserve"].get("chosen"))
                                  for run in seeds.values())))
    return runs


def over_seeds(results: list[tuple[str, str, dict | None]]) -> str:
    """One clause per seed table: how many mixes are at or ahead of both baselines over the seeds, and the
    closest."""
    clauses = []
    for label, kind, data in results:
        if kind != "seeds" or data is None:
            continue
        runs = seed_totals(data)
        closest = min(runs, key=lambda r: r.vs[r.worst])
        clauses.append(f"{label.removeprefix('seed by seed, ')}: {len(runs) - len(misses(runs))} of {len(runs)} "
                       f"mixes, the closest {closest.name} {times(closest.vs[closest.worst])} `{closest.worst}`")
    return "; ".join(clauses)


def grid_runs(data: dict) -> list[Run]:
    """The cells of a ``bench_grid.py`` result."""
    return [Run(f"{c['density']:g}/{c['sharing']:g}", {"fcfs": c["vs_fcfs"], "balance": c["vs_balance"],
                                                        "dfs": c["speedup"]}, c["sharing_vs_dfs"],
                is_current(data["provenance"], True, c.get("chose")))
            for c in data["cells"]]


def misses(runs: list[Run]) -> list[str]:
    """"run: 0.984x balance" for each run slower than a baseline, against the fastest baseline it lost to."""
    out = []
    for run in runs:
        if run.vs[run.worst] < 1.0:
            out.append(f"{run.name} {times(run.vs[run.worst])} `{run.worst}`"
                       + ("" if run.current else " (earlier planner)"))
    return out


def scorecard_row(label: str, runs: list[Run]) -> list[str]:
    lost = misses(runs)
    shared = [r.sharing for r in runs if r.sharing is not None]
    lowest = f"{min(shared):.1%}" if shared else "-"
    earlier = sum(not r.current for r in runs)
    return [label, str(len(runs)), f"{len(runs) - len(lost)} of {len(runs)}", "; ".join(lost) or "none",
            lowest + ("" if not shared or min(shared) >= SHARING_FLOOR else f" (below {SHARING_FLOOR:.0%})"),
            f"{earlier} of {len(runs)}" if earlier else "none"]


def scorecard_section(results: list[tuple[str, str, dict | None]], opt_at_40k: list[tuple[str, float]]) -> str:
    """The section: one row per stored result ``(label, kind, data)`` (kind "policies", "seeds" or "grid"),
    then the paper mixes' mean fraction of T_opt at 40k requests per setup."""
    make = {"policies": policy_runs, "seeds": seed_runs, "grid": grid_runs}
    rows = [scorecard_row(label, make[kind](data)) for label, kind, data in results if data is not None]
    if not rows:
        return ""
    means = ", ".join(f"{setup} {opt:.1%}" + ("" if opt >= OPT_FLOOR else " (below)") for setup, opt in opt_at_40k)
    intro = ("Issue 20 asks, with lengths hidden, that blendserve is never slower than `fcfs`, `balance` or `dfs` on "
             "any paper mix, rare-heavy mix or grid cell at 20k, 40k and 400k requests; that its mean over the paper "
             f"mixes at 40k is at least {OPT_FLOOR:.0%} of T_opt; and that its prefix sharing stays at least "
             f"{SHARING_FLOOR:.0%} of `dfs`'s. Each row reads one result below; a miss names the baseline it lost to "
             "by most. \"earlier planner\": planned by an earlier planner revision, not rerun since.")
    header = ["result", "runs", "at or ahead of every baseline", "slower than a baseline", "lowest sharing vs dfs",
              "earlier planner"]
    seeds = over_seeds(results)
    seeds = seeds and ("\n\nJudged over the seeds instead of seed by seed (each mix's seconds summed over its seeds), "
                       f"mixes at or ahead of both baselines: {seeds}.")
    return (f"## Where blendserve stands against its baselines (lengths hidden)\n\n{intro}\n\n{table(header, rows)}"
            f"\n\nPaper mixes' mean fraction of T_opt at 40k requests (asked: at least {OPT_FLOOR:.0%}): {means}.{seeds}")
