"""Scale of the planner: tree, sort and split, dual scan and shards for 10k, 100k and 1M requests.

    .venv/bin/python bench/bench_planner.py [--sizes 10000 100000 1000000] [--shards 8] [--out]

Each size runs in a fresh process (so peak memory is its own): synthetic
requests with a mean prompt of 500 tokens, 60% of it in shared family
prefixes, 30% of families memory-heavy. Prints wall seconds per stage and
peak resident memory, with the request batch itself (2 GB of token ids at
1M) shown apart from the whole process peak. Then, in the same process, the
order one shard builds over all of them with the ``blendserve`` policy (tree,
split, and the model-predictive choice: six candidates in two rounds,
simulated on at most 400k requests) and which candidate it chose.
"""

from __future__ import annotations

import argparse
import json
import time

from common import in_fresh_process, peak_rss_gb, write_result

TARGET_SECONDS, TARGET_GB = 60.0, 4.0


def one(n: int, shards: int) -> dict:
    from blendserve.costmodel import CostModel, get_hardware, get_model
    from blendserve.pipeline.plan import build_plan
    from blendserve.planner.estimates import default_output_estimates
    from synthetic import synthetic_batch
    from blendserve.scheduling.registry import PolicyContext, make_controller
    from blendserve.sim import SimConfig, kv_capacity_tokens

    batch = synthetic_batch(n, mean_prompt=500)
    batch_gb = (batch.tokens.nbytes + batch.token_offsets.nbytes) / 1e9
    cost = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
    started = time.perf_counter()
    plan = build_plan(batch, cost, shards=shards)
    wall = time.perf_counter() - started
    plan_peak_gb = peak_rss_gb()
    started = time.perf_counter()
    context = PolicyContext(batch, default_output_estimates(batch), cost, kv_capacity_tokens(cost, SimConfig()))
    chosen = make_controller("blendserve", context)
    order_s = time.perf_counter() - started
    peak_gb = peak_rss_gb()
    return {
        "order_s": order_s, "order_peak_gb": peak_gb, "choice": chosen.choice.name,  # type: ignore[attr-defined]
        "choice_sample": chosen.choice.sample,  # type: ignore[attr-defined]
        "requests": n, "mean_prompt": float(batch.prompt_lens.mean()), "plan_s": wall, "stages": plan.timings,
        "peak_gb": plan_peak_gb, "batch_gb": batch_gb, "nodes": plan.tree.n_nodes,
        "moved": int(len(plan.split.moved)) if plan.split is not None else 0,
        "sharing_kept": plan.sharing_tokens / max(plan.dfs_sharing_tokens, 1), "imbalance": plan.shards.imbalance,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--out", action="store_true", help="write bench/results/planner.json")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.shards)))
        return
    print(f"{'requests':>10}{'plan s':>9}{'tree':>7}{'split':>7}{'dual':>7}{'shards':>7}"
          f"{'peak GB':>9}{'batch GB':>10}{'moved':>7}{'sharing':>9}{'imbal.':>8}{'order s':>9}{'peak GB':>9}  choice")
    rows = []
    for n in args.sizes:
        r = in_fresh_process(__file__, ["--one", str(n), "--shards", str(args.shards)])
        rows.append(r)
        s = r["stages"]
        print(f"{n:>10,}{r['plan_s']:>9.1f}{s['prefix_tree']:>7.1f}{s['sort_split']:>7.1f}{s['dual_scan']:>7.1f}"
              f"{s['shards']:>7.2f}{r['peak_gb']:>9.2f}{r['batch_gb']:>10.2f}{r['moved']:>7}"
              f"{r['sharing_kept']:>9.2%}{r['imbalance']:>8.3f}{r['order_s']:>9.1f}{r['order_peak_gb']:>9.2f}"
              f"  {r['choice']} on {r['choice_sample']:,}", flush=True)
    print(f"targets at 1M: plan <= {TARGET_SECONDS:.0f} s, peak <= {TARGET_GB:.0f} GB (2 cores)")
    if args.out:
        write_result("planner", {"shards": args.shards, "targets": {"plan_s": TARGET_SECONDS, "peak_gb": TARGET_GB},
                                 "rows": rows})


if __name__ == "__main__":
    main()
