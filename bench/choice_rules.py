"""Pick rules scored offline on ``bench_choice.py``'s stored runs: each rule's candidate's time on the truth.

    .venv/bin/python bench/choice_rules.py [bench/results/choice-8b.json ...]

A rule sees what the choice saw (every candidate's seconds on the warm-up's
draws, and on the estimates' means) and names one candidate; its regret in a
run is that candidate's time for the rest on the true lengths over the
fastest candidate's. With no files named, every ``choice-*.json`` in
bench/results is read. Rules fitted to these runs are fitted to them: the
summary splits by setup so a rule that only wins on one model shows it. Most
stored runs are 20k and 40k plans: the means' rule that scores best on them ran
6% behind `balance` on the 8B 400k d1.4-s5 mix (docs/PLANNER_NOTES.md,
"2026-12-03 (later)"), so a rule needs 400k plans in its evidence before it
lands; choice-8b-400k.json holds the first ("2026-12-03 (fifth)").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

import numpy as np

from blendserve.scheduling import choice
from common import RESULTS

Candidates = dict[str, dict]  # a run's candidates: name -> {"draws": [...], "means": s, "truth": s}
Rule = Callable[[Candidates], str]


def _fastest(times: dict[str, float]) -> str:
    return min(times, key=times.get)


def _constant(name: str) -> Rule:
    return lambda c: name


def _relative(c: Candidates) -> dict[str, np.ndarray]:
    """Every candidate's seconds on each draw over that draw's fastest: the long draw, whose seconds are
    twice the others', then weighs no more than they do."""
    draws = np.array([c[n]["draws"] for n in c], dtype=np.float64)
    return dict(zip(c, draws / draws.min(axis=0)))


def _means_guarded(c: Candidates) -> str:
    """The means' fastest, unless ``fcfs`` or ``balance`` is faster on every draw: the uncertainty as a guard
    against losing to the orders blendserve must beat, not as the score."""
    chosen = _fastest({n: t["means"] for n, t in c.items()})
    beats = [b for b in ("fcfs", "balance") if b in c
             and all(x < y for x, y in zip(c[b]["draws"], c[chosen]["draws"]))]
    return _fastest({b: c[b]["means"] for b in beats}) if beats else chosen


MAIN_RULE = "main's `pick` (a blend unless beaten on every draw)"
RULES: dict[str, Rule] = {
    MAIN_RULE: lambda c: choice.pick(
        {n: tuple(t["draws"]) for n, t in c.items()}, prefer=choice.BLENDS),
    "fastest mean over the draws": lambda c: _fastest({n: float(np.mean(t["draws"])) for n, t in c.items()}),
    "fastest on the means (no draws)": lambda c: _fastest({n: t["means"] for n, t in c.items()}),
    "fastest on the means, unless `fcfs`/`balance` wins every draw": _means_guarded,
    "fastest on the first (short) draw": lambda c: _fastest({n: t["draws"][0] for n, t in c.items()}),
    "fastest on the middle draw": lambda c: _fastest({n: t["draws"][len(t["draws"]) // 2] for n, t in c.items()}),
    "fastest worst draw": lambda c: _fastest({n: max(t["draws"]) for n, t in c.items()}),
    "least mean regret over the draws": lambda c: _fastest({n: float(r.mean()) for n, r in _relative(c).items()}),
    "least worst regret over the draws": lambda c: _fastest({n: float(r.max()) for n, r in _relative(c).items()}),
    "always `static`": _constant("static"),
    "always `deadline-1`": _constant(choice.deadline_name(1.0)),
    "always `fcfs`": _constant("fcfs"),
    "always `balance`": _constant("balance"),
}


def load_runs(paths: list[Path]) -> list[tuple[str, Candidates]]:
    """Every stored run as (its label, its candidates)."""
    runs = []
    for path in paths:
        stored = json.loads(path.read_text())
        size = path.stem.removeprefix("choice-")
        for mix, seeds in stored["mixes"].items():
            for seed, run in seeds.items():
                runs.append((f"{size} {mix} seed {seed}", run["candidates"]))
    return runs


def setup_of(label: str) -> str:
    """The model of a run's label ("8b-20k d1.4-s5 seed 1" -> "8b")."""
    return label.split()[0].split("-")[0]


def regret(rule: Rule, candidates: Candidates) -> float:
    truth = {n: t["truth"] for n, t in candidates.items()}
    return truth[rule(candidates)] / min(truth.values())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*", type=Path)
    args = ap.parse_args()
    runs = load_runs(args.files or sorted(RESULTS.glob("choice-*.json")))
    print(f"{'run':32s} {'pick':14s} {'fastest on truth':18s} regret of pick")
    for label, c in runs:
        picked = RULES[MAIN_RULE](c)
        print(f"{label:32s} {picked:14s} {_fastest({n: t['truth'] for n, t in c.items()}):18s} "
              f"{regret(lambda _: picked, c):.3f}")
    setups = sorted({setup_of(label) for label, _ in runs})
    print(f"\n| rule, over {len(runs)} runs | mean regret | worst |"
          + "".join(f" {s} mean / worst |" for s in setups))
    print("|---|---|---|" + "---|" * len(setups))
    for name, rule in RULES.items():
        r = {label: regret(rule, c) for label, c in runs}
        by_setup = [[v for k, v in r.items() if setup_of(k) == s] for s in setups]
        print(f"| {name} | {np.mean(list(r.values())):.3f} | {max(r.values()):.3f} |"
              + "".join(f" {np.mean(v):.3f} / {max(v):.3f} |" for v in by_setup))


if __name__ == "__main__":
    main()
