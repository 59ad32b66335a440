"""Quality of every policy in the simulator on the paper's four mixes, or on the rare-heavy ones.

    .venv/bin/python bench/bench_policies.py [--requests 40000] [--setup 8b|70b] [--lengths hidden|known]
        [--mixes ...] [--out]

Builds each mix from ../shared/data once for the setup (its density solved on
that model and hardware; cached in .cache/bench/), runs all policies from one
process on the engine's resource-aware token budget (the same for every
policy; ``--token-budget`` overrides it), and prints the fraction of T_opt
(with the KV-capacity step bound, docs/COST_MODEL.md), the speed-up over dfs
and the prefix sharing kept relative to dfs, side by side, then the averages
against the paper's.

``--lengths hidden`` (the default, the headline): no length is known, every
request has the mix's one round ``max_tokens`` (printed), and each policy runs
as a pipeline shard runs it: a 1% warm-up sample first, its time counted, then
the plan on the estimates it gives (``as_shard.py``). ``--lengths known``: the
upper bound, planning on the mix as built (video lengths known, per-request
caps) with the warm-up sampler's estimates and no warm-up time; there
``--estimates default`` plans with known lengths else max_tokens instead.
``--out`` writes bench/results/policies-<setup>[-known][-<size>].json and two
PNGs under docs/img/ (fraction of optimum, and sharing per policy as the
paper's Figure 9), after every mix. It keeps the stored mixes a run does not
measure when they were run with the same setup, size, lengths and policies, so
the mixes of a 400k table (up to an hour each, lengths hidden, on 2 cores) can
be run one ``--mixes`` at a time, or an interrupted run resumed; each mix
carries the provenance of the run that measured it.

``--mixes rare-0.3 rare-1 shared-sys`` runs the rare-heavy mixes of issue 20
(``workload.RARE_MIXES``: a few requests with outputs over 8k tokens among
short answers); their results go to rare-<setup>[-known][-<size>].json, beside
the paper mixes' rather than over them.
"""

from __future__ import annotations

import argparse
import time

from as_shard import run_policies
from blendserve.sim import SimConfig
from blendserve.workload import MIXES, RARE_MIXES
from common import (
    LENGTHS, SETUPS, earlier_result, img_path, lengths_suffix, load_mix, provenance, size_suffix, write_result,
)
from plots import policy_bars
from page_parts import times
from tables import chose_label, summarize

POLICIES = ["fcfs", "balance", "density", "dfs", "blendserve-nosplit", "blendserve[static]", "blendserve[spread]",
            "blendserve"]
# The paper's averages (docs: ../shared/DESIGN.md section 10); the 70B figure is its 8-GPU result.
PAPER = {"8b": {"opt": 0.8655, "speedup": 1.2084, "sharing": 0.97, "dfs_opt": 0.717},
         "70b": {"opt": 0.908, "speedup": 1.2084, "sharing": 0.97, "dfs_opt": None}}


def describe_lengths(lengths: str, cap: int | None, report: dict) -> str:
    """How the policies saw the lengths, for the mix's header line."""
    if lengths == "known":
        return "known (upper bound: video lengths known, per-request caps, sample's time not counted)"
    sampled = max((r.get("sampled", 0) for r in report["policies"]), default=0)
    return f"hidden (max_tokens {cap:,} for every request, warm-up sample {sampled:,})"


def unplanned_label(row: dict, requests: int) -> str:
    """Hidden mode: the requests that ran before the plan existed (the sample and the fillers beside it)."""
    if not row.get("sampled"):
        return ""
    plan = f", plan {row['plan_s']:.0f} s" if row.get("plan_s") is not None else ""
    return f"  [{(row['sampled'] + row['unplanned']) / requests:.0%} ran before the plan{plan}]"


def print_mix(mix: str, report: dict, policies: list[str]) -> None:
    rows = {row["policy"]: row for row in report["policies"]}
    print(f"\n{mix}: {report['requests']:,} requests, T_opt {report['t_opt_s']:,.1f} s "
          f"(C* {report['c_star_s']:,.1f}, M* {report['m_star_s']:,.1f}, S_min {report['min_steps']:,.0f} steps), "
          f"token budget {report['token_budget']}, KV {report['kv_capacity_tokens']:,} tokens")
    print(f"  {'policy':<20}{'time s':>10}{'of T_opt':>10}{'vs dfs':>9}{'sharing/dfs':>13}{'prefix hits':>13}")
    for name in policies:
        r = rows[name]
        print(f"  {name:<20}{r['time_s']:>10,.1f}{r['fraction_of_optimum']:>10.1%}"
              f"{rows['dfs']['time_s'] / r['time_s']:>8.2f}x{r['sharing_vs_dfs']:>13.1%}{r['prefix_hit_ratio']:>13.1%}"
              + chose_label(r) + unplanned_label(r, report["requests"]))


def print_summary(summary: dict, paper: dict | None) -> None:
    """The means over the mixes; beside the paper's figures when the mixes are the paper's (``paper``)."""
    def said(text: str) -> str:
        return f"  (paper {text})" if paper else ""

    print("\nblendserve, mean over mixes" + (" (paper):" if paper else ":"))
    print(f"  fraction of optimum  {summary['opt']:.1%}" + said(f"{paper['opt']:.2%}" if paper else ""))
    print(f"  speed-up over dfs    {summary['speedup']:.2f}x"
          + said(f"{paper['speedup']:.2f}x over its best DFS system" if paper else ""))
    print(f"  sharing vs dfs       {summary['sharing']:.1%}" + said(f"> {paper['sharing']:.0%}" if paper else ""))
    print(f"  over the best other policy on each mix  {times(summary['vs_best_other'])} "
          f"(worst mix {times(summary['vs_best_baseline'])})")


def result_family(mixes: list[str]) -> str:
    """The result file's first word: "policies" for the paper mixes, "rare" for the rare-heavy ones (a file
    holds one kind, so a rare run never overwrites the paper mixes' results)."""
    if all(m in RARE_MIXES for m in mixes):
        return "rare"
    if any(m in RARE_MIXES for m in mixes):
        raise SystemExit("run the paper mixes and the rare-heavy mixes separately (their results are separate files)")
    return "policies"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=40_000)
    ap.add_argument("--setup", choices=sorted(SETUPS), default="8b")
    ap.add_argument("--mixes", nargs="+", default=list(MIXES), choices=[*MIXES, *RARE_MIXES],
                    help="paper mixes (default: all four) or rare-heavy ones, not both")
    ap.add_argument("--policies", nargs="+", default=POLICIES, help="a subset, in table order (default: all)")
    ap.add_argument("--token-budget", type=int, default=None, help="tokens per step; default: resource-aware")
    ap.add_argument("--lengths", choices=LENGTHS, default="hidden",
                    help="hidden: one round max_tokens, run as a shard (default); known: plan on true lengths")
    ap.add_argument("--estimates", choices=["warmup", "default"], default="warmup", help="known mode only")
    ap.add_argument("--out", action="store_true",
                    help="write bench/results/{policies,rare}-<setup>[-known][-<size>].json and PNGs")
    args = ap.parse_args()
    family = result_family(args.mixes)
    setup, config = SETUPS[args.setup], SimConfig(token_budget=args.token_budget)
    cost = setup.cost()
    name = f"{family}-{setup.key}{lengths_suffix(args.lengths)}{size_suffix(args.requests)}"
    mixes = []
    for mix in args.mixes:
        batch, built = load_mix(mix, args.requests, setup)
        started = time.perf_counter()
        report, cap = run_policies(batch, cost, config, args.policies, args.lengths, args.estimates)
        print(f"\n{mix}: achieved density {built['density']:.2f}, sharing {built['sharing']:.1%}, "
              f"requests per source {built['counts']}, lengths {describe_lengths(args.lengths, cap, report)}, "
              f"{time.perf_counter() - started:.0f} s wall", end="")
        print_mix(mix, report, args.policies)
        mixes.append({"mix": mix, "achieved": {k: built[k] for k in ("density", "sharing", "counts")},
                      "max_tokens": cap, **report, "provenance": provenance()})
        if args.out:  # after every mix: a 400k mix takes up to an hour, and an interrupted run keeps the rest
            write_mixes(name, args, family, mixes)
    print_summary(summarize(mixes, args.policies), PAPER[setup.key] if family == "policies" else None)


# What a stored result must share with a run for the run to keep its other mixes (``with_earlier``).
SETTINGS = ("setup", "requests", "lengths", "estimates", "policies")


def write_mixes(name: str, args: argparse.Namespace, family: str, mixes: list[dict]) -> None:
    """The result file with ``mixes`` and the stored mixes this run did not measure, its summary and PNGs."""
    setup = SETUPS[args.setup]
    estimates = "warm-up sample run first (1%), as a shard" if args.lengths == "hidden" else args.estimates
    data = with_earlier(name, {"setup": setup.label, "requests": args.requests, "lengths": args.lengths,
                               "estimates": estimates, "policies": args.policies, "mixes": mixes})
    label = f"{setup.label}, lengths {args.lengths}"
    pngs = [policy_bars(data["mixes"], args.policies, metric, label, img_path(f"{name}-{metric}.png")).name
            for metric in ("fraction_of_optimum", "sharing_vs_dfs")]
    write_result(name, {**data, "summary": summarize(data["mixes"], args.policies),
                        "paper": PAPER[setup.key] if family == "policies" else None, "pngs": pngs})


def with_earlier(name: str, data: dict) -> dict:
    """``data`` plus the mixes that the stored result ``name`` holds and this run did not measure, when it was
    measured with the same ``SETTINGS``: the mixes of a 400k table can then be run one at a time, or resumed.
    Each mix keeps the provenance of the run that measured it."""
    earlier = earlier_result(name, data, SETTINGS) or {"mixes": []}
    measured = {m["mix"] for m in data["mixes"]}
    kept = [{"provenance": earlier["provenance"], **m} for m in earlier["mixes"] if m["mix"] not in measured]
    order = [*MIXES, *RARE_MIXES]
    return {**data, "mixes": sorted(kept + data["mixes"], key=lambda m: order.index(m["mix"]))}


if __name__ == "__main__":
    main()
