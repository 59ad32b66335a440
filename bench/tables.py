"""Markdown for each bench's result file: its tables, figures and provenance line (used by render.py).
The pieces every section shares are in page_parts.py."""

from __future__ import annotations

import numpy as np

from blendserve.sim.compare import SHARING_COUNTS
from page_parts import (
    image, measured_by, planned_earlier, planned_earlier_note, planner_revision, policy_rows, provenance, table,
    times,
)


def summarize(mixes: list[dict], policies: list[str]) -> dict:
    """BlendServe's means over the mixes, the way the paper averages them, and against the best other policy."""
    rows = [policy_rows(m) for m in mixes]
    others = [p for p in policies if not p.startswith("blendserve")]
    best_other = [min(others, key=lambda p: r[p]["time_s"]) for r in rows]
    vs_best = [r[b]["time_s"] / r["blendserve"]["time_s"] for b, r in zip(best_other, rows)]
    plans = [r["blendserve"]["plan_s"] / r["blendserve"]["time_s"] for r in rows if _waited(r["blendserve"])]
    return {
        "opt": float(np.mean([r["blendserve"]["fraction_of_optimum"] for r in rows])),
        "dfs_opt": float(np.mean([r["dfs"]["fraction_of_optimum"] for r in rows])),
        "speedup": float(np.mean([r["dfs"]["time_s"] / r["blendserve"]["time_s"] for r in rows])),
        "sharing": float(np.mean([r["blendserve"]["sharing_vs_dfs"] for r in rows])),
        "balance_sharing": (float(np.mean([r["balance"]["sharing_vs_dfs"] for r in rows]))
                            if "balance" in policies else None),
        "vs_best_other": float(np.mean(vs_best)), "vs_best_baseline": float(min(vs_best)),
        "best_other": sorted(set(best_other)),
        # the plan's wall time over the simulated run, mean and worst, where every mix waited for it and timed it
        "plan_share": (float(np.mean(plans)), max(plans)) if plans and len(plans) == len(rows) else None,
        "sharing_restarts": restarts_counted(mixes),
        "planned_earlier": planned_earlier(mixes),
    }


def restarts_counted(mixes: list[dict]) -> list[str]:
    """Mixes measured before sharing counted first starts only (``SHARING_COUNTS``): their sharing also counts
    preempted requests finding their own prompts again, which credits dfs with its recomputation."""
    return [m["mix"] for m in mixes if m.get("sharing_counts") != SHARING_COUNTS]


def sharing_label(mixes: list[dict]) -> str:
    """What the per-policy table's sharing counts, naming the mixes measured the older way."""
    old = restarts_counted(mixes)
    before = (f"; {', '.join(old)} measured before 2026-12-03, counting every cache hit, a preempted request's "
              "re-hits of its own prompt included" if old else "")
    return ("Per policy: fraction of optimum / speed-up over dfs / prefix sharing (prompt tokens found cached at "
            f"each request's first start{before}) relative to dfs; in brackets, the candidate blendserve's choice "
            "picked, each plan's in turn where a shard planned again (`keep`: the re-plan kept the running order):")


def lengths_mode(data: dict) -> str:
    """"hidden" or "known"; result files written before the mode existed planned on the known lengths."""
    return data.get("lengths", "known")


def lengths_note(data: dict) -> str:
    """What the policies knew of the output lengths in this result, in one sentence."""
    if lengths_mode(data) == "known":
        others = ("known lengths else max_tokens (no warm-up)" if data.get("estimates") == "default" else
                  "the warm-up sampler's estimates (1% sampled), the sample's time not counted")
        return ("Lengths known (the upper bound): the mixes as built, video lengths known in advance and every "
                f"request's max_tokens its own; the other requests planned on {others}.")
    # policies results hold a cap per mix, grid results one per cell, timeline results one
    caps = sorted({m["max_tokens"] for m in data.get("mixes", []) + data.get("cells", []) if m.get("max_tokens")}
                  | ({data["max_tokens"]} if data.get("max_tokens") else set()))
    cap = " or ".join(f"{c:,}" for c in caps) or "one power of two"
    return (f"Lengths hidden: no output length is known and every request has the same max_tokens ({cap}: the "
            "smallest power of two at least the mix's longest true output, a round cap a user would set); each "
            "policy runs as a pipeline shard runs it, a 1% warm-up sample first (its time counted, random fillers "
            "beside it), then the plan on the sample's estimates; fcfs and balance run bare.")


def policies_section(data: dict) -> str:
    policies, mixes = data["policies"], data["mixes"]
    first = mixes[0]
    intro = (f"{data['setup']}: {data['requests']:,} requests per mix, KV capacity {first['kv_capacity_tokens']:,} "
             f"tokens, token budget {first['token_budget']} per step. {lengths_note(data)} Throughput "
             "in tokens/s (input + output) of every policy from one run per mix, and the optimum `T_opt`:")
    tput = table(["mix", "achieved density / sharing", "tokens in / out", "optimum", *policies],
                 [[m["mix"], f"{m['achieved']['density']:.2f} / {m['achieved']['sharing']:.0%}",
                   f"{m['input_tokens'] / 1e6:.1f}M / {m['output_tokens'] / 1e6:.1f}M",
                   f"{(m['input_tokens'] + m['output_tokens']) / m['t_opt_s']:,.0f}",
                   *[f"{policy_rows(m)[p]['throughput']:,.0f}" for p in policies]] for m in mixes])
    ratio = table(["mix", *policies],
                  [[m["mix"], *[_ratios(policy_rows(m), p) for p in policies]] for m in mixes])
    s = summarize(mixes, policies)
    paper = data.get("paper")  # None on the rare-heavy mixes: the paper has no figure for them

    def said(text: str) -> str:
        return f" (paper {text})" if paper else ""

    paper_opt = f"{paper['opt']:.2%}" if paper else ""
    means = (f"BlendServe, mean over the mixes: {s['opt']:.1%} of optimum{said(paper_opt)}, "
             f"{s['speedup']:.2f}x over dfs{said('1.21x over its best DFS system')}, {s['sharing']:.1%} of dfs "
             f"prefix sharing{said('> 97%')}; dfs alone {s['dfs_opt']:.1%} of optimum. Against the best other policy "
             f"on each mix ({' or '.join(s['best_other'])} here): {times(s['vs_best_other'])} on average, {times(s['vs_best_baseline'])} on "
             "the worst mix.")
    figures = "\n\n".join(image(name, name.removesuffix(".png")) for name in data["pngs"])
    runs = measured_by(data, {m["mix"]: m for m in mixes}, "Mixes")
    return "\n\n".join(p for p in [intro, tput, sharing_label(mixes), ratio,
                                    means + planned_earlier_note(mixes) + _before_plan(mixes),
                                    figures, runs, provenance(data)] if p)


RARE_NOTE = ("The rare-heavy mixes of issue 20 (`workload.RARE_MIXES`), from the same data: short answers (API "
             "trace requests, 28 output tokens on average, and MMLU's 2) with a few video requests whose outputs are "
             "all over 8k tokens (9,065 to 23,865: frames x tokens per frame at the paper's 16k mean; no text output "
             "in the data is that long). rare-0.3 and rare-1: 0.3% and 1% of requests, under a system prompt of "
             "their own (one prefix subtree). shared-sys: 0.5% of requests, every request (the rest API trace "
             "requests) under one system prompt, so no prefix node tells long from short. The few long requests "
             "hold most of the output tokens (counts per source below).")


def rare_section(data: dict) -> str:
    """The policies table on the rare-heavy mixes, after what they are."""
    def counts(mix: dict) -> str:
        return ", ".join(f"{source} {n:,}" for source, n in mix["achieved"]["counts"].items() if n)

    per_source = "; ".join(f"{m['mix']} {counts(m)}" for m in data["mixes"])
    return f"{RARE_NOTE} Requests per source: {per_source}.\n\n{policies_section(data)}"


def _before_plan(mixes: list[dict]) -> str:
    """Hidden mode: how much of blendserve's run went before its plan (the sample and its random fillers)."""
    rows = [policy_rows(m).get("blendserve", {}) for m in mixes]
    if not all(r.get("sampled") for r in rows):
        return ""
    shares = ", ".join(f"{m['mix']} {(r['sampled'] + r['unplanned']) / m['requests']:.0%}"
                       for m, r in zip(mixes, rows))
    return (f" Requests blendserve ran before its plan existed (the warm-up sample and the random fillers beside "
            f"it, until a plan was there): {shares}.{_plan_seconds(mixes, rows)}")


def _waited(row: dict) -> bool:
    """Whether the run timed a plan its engine waited for (planner revision 3): the simulated time leaves it out."""
    return row.get("plan_s") is not None and row.get("plan_latency_s") is None


def _plan_seconds(mixes: list[dict], rows: list[dict]) -> str:
    """The plan's wall time on the bench's machine, where measured; and whether the simulated time counts it."""
    waited = [(m, r) for m, r in zip(mixes, rows) if _waited(r)]
    charged = [(m, r) for m, r in zip(mixes, rows) if r.get("plan_latency_s") is not None]
    text = ""
    if waited:
        each = ", ".join(f"{m['mix']} {r['plan_s']:,.0f} s ({r['plan_s'] / r['time_s']:.1%} of its simulated run)"
                         for m, r in waited)
        text += (f" The plan (mostly the choice's simulations) took, on the machine below: {each}. A shard's engine "
                 "waited for it, and the simulated times above do not count it.")
    if charged:
        each = ", ".join(f"{m['mix']} {r['plan_s']:,.0f} s, charged {r['plan_latency_s']:,.0f} s "
                         f"({r['admitted_while_planning']:,} requests admitted meanwhile)" for m, r in charged)
        text += (" The plan is made beside the engine, which meanwhile runs the rest in a quick plan's order "
                 "(`warmup.QUICK`; random fillers for a policy without one) until it lands (`scheduling.plan_worker`); "
                 f"the simulated times count that: {each}. The first seconds are this machine's; the simulated run "
                 "held the plan back for its modelled time (`plan_latency`).")
    return text


def _ratios(rows: dict[str, dict], name: str) -> str:
    r = rows[name]
    return (f"{r['fraction_of_optimum']:.1%} / {rows['dfs']['time_s'] / r['time_s']:.2f} / {r['sharing_vs_dfs']:.0%}"
            f"{chose_label(r)}")


def chose_label(row: dict) -> str:
    """" (candidate, predicted x%)": the admission blendserve picked by prediction and what the prediction said."""
    if not row.get("chosen"):
        return ""
    predicted = f", predicted {row['predicted_fraction']:.1%}" if row.get("predicted_fraction") else ""
    return f" ({row['chosen']}{predicted})"


def timeline_section(data: dict) -> str:
    rows = [[r["policy"], f"{r['time_s']:,.0f}", f"{r['mean_compute_util']:.1%}", f"{r['mean_memory_util']:.1%}"]
            for r in data["rows"]]
    intro = (f"{data['mix']}, {data['requests']:,} requests, {data['setup']}: compute and memory-bandwidth "
             "utilization per time bin (busy seconds of the resource over the bin), dfs above, blendserve below. "
             + lengths_note(data))
    return "\n\n".join([intro, image(data["png"], "utilization over time, dfs and blendserve"),
                        table(["policy", "time s", "mean compute", "mean memory"], rows), provenance(data)])


def grid_section(data: dict) -> str:
    cells = data["cells"]
    densities = sorted({c["density"] for c in cells})
    sharings = sorted({c["sharing"] for c in cells})
    at = {(c["density"], c["sharing"]): c for c in cells}
    rows = [[f"{d:.2f}", *[f"{at[d, s]['speedup']:.2f}" for s in sharings]] for d in densities]
    speedups = [c["speedup"] for c in cells]
    drift = max(abs(c["achieved_density"] - c["density"]) for c in cells)
    intro = (f"{data['setup']}, {len(cells)} mixes of {data['requests']:,} requests each (the paper: 40,000; "
             f"quick mode uses fewer). Speed-up of blendserve over dfs; mean {times(sum(speedups) / len(speedups))}, "
             f"min {times(min(speedups))}, max {times(max(speedups))}. Cells are labelled by the target density and "
             f"sharing; the achieved density drifts from its target by up to {drift:.2f} at this size "
             "(both are in the JSON)." + _over_baselines(cells) + " " + lengths_note(data))
    return "\n\n".join([intro, image(data["png"], "speed-up heatmap"),
                        table(["density \\ sharing", *[f"{s:.0%}" for s in sharings]], rows), provenance(data)])


def _over_baselines(cells: list[dict]) -> str:
    """The over-fcfs (and over-balance, in results that ran it) sentence of the grid's intro."""
    parts = []
    for key, name in (("vs_fcfs", "fcfs"), ("vs_balance", "balance")):
        if not all(key in c for c in cells):  # results written before the policy was in the grid
            continue
        over = [c[key] for c in cells]
        below = sum(v < 1 for v in over)
        parts.append(f" Over {name}: mean {times(sum(over) / len(over))}, min {times(min(over))}; {below} of "
                     f"{len(cells)} cells below {name}.")
    return "".join(parts)


def sampling_section(data: dict) -> str:
    parts = [f"{data['setup']}, policy {data['policy']}. Each rate: `est-only` plans with the sample's estimates "
             "and runs everything in one batch; `+warm-up` runs the sample first as its own phase (its time "
             "added); `inline warm-up` runs it inside the job's one engine run. `vs oracle`: throughput "
             "relative to planning with the true lengths."]
    for w in data["workloads"]:
        rows = [[r["estimates"], "-" if r["sampled"] is None else f"{r['sampled']:,}", f"{r['throughput']:,.0f}",
                 f"{r['vs_oracle']:.1%}", "" if r["mape"] is None else f"{r['mape']:.1%}",
                 "" if r["bias"] is None else f"{r['bias']:+.1%}"] for r in w["rows"]]
        parts.append(f"**{w['workload']}**: {w['requests']:,} requests, {w['input_tokens']:,} tokens in, "
                     f"{w['output_tokens']:,} out.")
        parts.append(table(["estimates", "sampled", "tokens/s", "vs oracle", "MAPE", "bias"], rows))
    return "\n\n".join(parts + [provenance(data)])


def planner_section(data: dict) -> str:
    rows = [[f"{r['requests']:,}", f"{r['plan_s']:.1f}", f"{r['stages']['prefix_tree']:.1f}",
             f"{r['stages']['sort_split']:.1f}", f"{r['stages']['dual_scan']:.1f}", f"{r['stages']['shards']:.2f}",
             f"{r['peak_gb']:.2f}", f"{r['batch_gb']:.2f}", f"{r['sharing_kept']:.1%}", f"{r['imbalance']:.3f}",
             _shard_order(r)] for r in data["rows"]]
    t = data["targets"]
    intro = (f"Synthetic requests (mean prompt 500 tokens, 60% in shared family prefixes), {data['shards']} shards, "
             f"each size in a fresh process. Targets at 1M: plan <= {t['plan_s']:.0f} s, peak <= {t['peak_gb']:.0f} GB. "
             "Last column: the order a shard builds over all the requests with `blendserve` (tree, split and the "
             "model-predictive choice on at most 400k of them), its seconds, the process peak after it, and the "
             "candidate chosen.")
    header = ["requests", "plan s", "tree", "sort+split", "dual scan", "shards", "peak GB", "token ids GB",
              "sharing kept", "shard imbalance", "shard order: s / peak GB / chose"]
    return "\n\n".join([intro, table(header, rows), provenance(data)])


def _shard_order(row: dict) -> str:
    if "order_s" not in row:  # results written before the choice existed
        return "-"
    return f"{row['order_s']:.1f} / {row['order_peak_gb']:.2f} / {row['choice']}"


def pipeline_section(data: dict) -> str:
    steps = list(data["rows"][0]["steps"]) if data["rows"] else []
    rows = [[f"{r['requests']:,}", f"{r['answered']:,}", f"{r['token_gb']:.2f}",
             *(f"{r['steps'][s]['wall_s']:.0f} / {r['steps'][s]['peak_gb']:.1f}" for s in steps),
             f"**{r['wall_s']:.0f}**", f"**{r['peak_gb']:.2f}**", f"{r['load_avg'][0]:.0f} .. {r['load_avg'][1]:.0f}"]
            for r in data["rows"]]
    targets = ", ".join(f"{int(n) // 1000}k: under {s / 60:.0f} min and {gb:.0f} GB" for n, (s, gb) in data["targets"].items())
    intro = (f"`blendserve run --engine simulator` on `blendserve workload --mix {data['mix']}` files (the rows past the "
             "2,048-token context are rejected at ingest), each size in a fresh process, the run's steps timed one by "
             "one: seconds / peak GB inside the step. Token ids: the accepted prompt tokens as int32. The machine is "
             f"shared (2 cores): the load average at the start and end of each size is in the last column. Targets: {targets}.")
    header = ["requests", "accepted (one output each)", "token ids GB", *(f"{s} s / GB" for s in steps), "run s",
              "peak GB", "load"]
    return "\n\n".join([intro, table(header, rows), provenance(data)])


def simulator_section(data: dict) -> str:
    rows = [[f"{r['requests']:,}", f"{r['input_tokens'] / 1e6:,.1f}M / {r['output_tokens'] / 1e6:,.1f}M",
             f"{r['simulated_s']:,.0f}", f"{r['steps']:,}", f"{r['segments']:,}", f"{r['wall_s']:.1f}",
             f"{r['peak_gb']:.2f}", f"{r['batch_gb']:.2f}"] for r in data["rows"]]
    intro = (f"Workload `{data['workload']}` in input order on Llama-3.1-8B / A100-80G, each size in a fresh "
             f"process, wall time the median of {data['runs']} run(s).")
    header = ["requests", "tokens in / out", "simulated s", "engine steps", "timeline segments", "wall s",
              "peak GB", "token ids GB"]
    return "\n\n".join([intro, table(header, rows), provenance(data)])


PEER_SYSTEMS = {"run-batch": "vllm run-batch", "run-batch-sorted": "vllm run-batch, file sorted by prompt",
                "blendserve": "blendserve run (CLI)", "airflow": "blendserve through Airflow (trigger to success)"}


def peer_section(data: dict) -> str:
    """bench_peer.py: each system's whole-process wall and throughput per batch, blendserve over run-batch."""
    rows = []
    for name, b in data["batches"].items():
        systems = b["systems"]
        base, by_sorted = systems.get("run-batch"), systems.get("run-batch-sorted")
        for system, s in systems.items():
            ratio = lambda other: "-" if other is None or system.startswith("run-batch") else (  # noqa: E731
                f"**{other['wall_s'] / s['wall_s']:.2f}x**")
            stage = " / ".join(f"{s[k]:.0f}" if k in s else "-" for k in ("job_s", "inference_s"))
            same = b["identical_vs_run_batch"].get(system)
            replay = f"{s['replay_s']:.0f} ({s['replay_error']:+.0%})" if "replay_s" in s else "-"
            rows.append([name if system == next(iter(systems)) else "", PEER_SYSTEMS.get(system, system),
                         f"{s['wall_s']:.1f} ({s['wall_min_s']:.1f} .. {s['wall_max_s']:.1f})",
                         f"{s['tokens_per_s']:.0f}", f"{s['prefix_hit_rate']:.1%}", ratio(base), ratio(by_sorted),
                         "-" if same is None else f"{same:.1%}", stage, replay, str(s["errors"])])
    facts = "; ".join(f"{name}: {b['requests']:,} requests, {b['prompt_tokens']:,} prompt tokens, up to "
                      f"{b['max_output_tokens']:,} output, KV {b['kv_gb']:g} GiB = {b['kv_tokens']:,} tokens"
                      + (f" (distinct 5-shot prefixes {b['distinct_prefix_tokens']:,} tokens)"
                         if name == "locality" else "") for name, b in data["batches"].items())
    st = data["settings"]
    size = "Quick size" if data["quick"] else "Full size"
    size += f", counts x{data['scale']:g}" if data["scale"] != 1 else ""
    intro = (f"The same OpenAI batch file through each system, each a whole process from start to exit (engine "
             f"start, reading, writing included). Same engine settings for all: {st['dtype']}, max_num_seqs "
             f"{st['max_num_seqs']}, max_model_len {st['max_model_len']}, max_num_batched_tokens "
             f"{st.get('max_num_batched_tokens', '-')}, prefix caching, chunked prefill, "
             f"enforce_eager, seed 0. Medians of {_peer_rounds(data)} interleaved round(s) (min .. max). "
             "Speed-up = run-batch wall / blendserve wall (above 1: blendserve faster). tok/s = (prompt + output "
             "tokens of every request) / wall. Prefix hits: run-batch's `usage.prompt_tokens_details.cached_tokens` "
             "over `prompt_tokens`; blendserve's summary `prefix_hit_rate` (the requests it served; duplicates it "
             "answered from a twin are not in it). Identical answers: greedy answers equal to run-batch's, joined "
             f"on custom_id. Predicted inference s: the report's replay of what ran on this machine's calibrated "
             f"profile (`blendserve calibrate`, run first with the same settings; `--hardware auto`), against "
             f"the measured inference seconds. blendserve runs vLLM-CPU's engine core and worker inside its own "
             f"process (its synchronous `LLM` engine, `VLLM_ENABLE_V1_MULTIPROCESSING=0`); `vllm run-batch` "
             f"cannot (its asynchronous engine needs the processes) and pays their start. {size}. "
             f"Batches: {facts}. Command: `.venv/bin/python bench/bench_peer.py [--quick] [--airflow] --out`.")
    header = ["batch", "system", "wall s", "tok/s", "prefix hits", "speed-up vs run-batch",
              "speed-up vs run-batch sorted", "identical answers vs run-batch", "blendserve job / inference s",
              "predicted inference s (error)", "errors"]
    return "\n\n".join(p for p in [intro, table(header, rows), data.get("environment", ""),
                                    measured_by(data, data["batches"], "Batches"),
                                    provenance(data)] if p)


def _peer_rounds(data: dict) -> str:
    """The rounds, or each batch's where batches were measured by different runs."""
    rounds = {name: b.get("rounds", data["rounds"]) for name, b in data["batches"].items()}
    if len(set(rounds.values())) == 1:
        return str(next(iter(rounds.values())))
    return ", ".join(f"{n} ({name})" for name, n in rounds.items())


SEED_BASELINES = ("fcfs", "balance")  # what bench_seeds.py runs blendserve against


def seed_ratios(run: dict[str, dict]) -> dict[str, float]:
    """One seed's speed-up of blendserve over each baseline: the baseline's seconds / blendserve's."""
    return {base: run[base]["time_s"] / run["blendserve"]["time_s"] for base in SEED_BASELINES}


def seed_speedups(seeds: dict[str, dict[str, dict]]) -> dict[str, dict[str, float]]:
    """Per baseline: blendserve's speed-up over it (``seed_ratios``), median and worst over the seeds."""
    ratios = [seed_ratios(run) for run in seeds.values()]
    return {base: {"median": float(np.median([r[base] for r in ratios])), "worst": float(min(r[base] for r in ratios))}
            for base in SEED_BASELINES}


def seeds_section(data: dict) -> str:
    """blendserve against fcfs and balance seed by seed (bench_seeds.py), each mix's median and worst below."""
    rows = []
    for mix, seeds in data["mixes"].items():
        for seed in sorted(seeds, key=int):
            run = seeds[seed]
            rows.append([mix, seed, *(f"{run[p]['time_s']:,.1f}" for p in (*SEED_BASELINES, "blendserve")),
                         run["blendserve"]["chosen"] or "-", *(times(r) for r in seed_ratios(run).values())])
        spread = seed_speedups(seeds)
        rows.append([f"**{mix}**", "median / worst", "", "", "", "",
                     *(f"{times(spread[b]['median'])} / {times(spread[b]['worst'])}" for b in SEED_BASELINES)])
    # Each mix once, at its oldest seed's run: a mix is stale when any of its seeds is.
    oldest = [{"mix": mix, "provenance": min((run["provenance"] for run in seeds.values()), key=planner_revision)}
              for mix, seeds in data["mixes"].items()]
    intro = (f"{data['setup']}, {data['requests']:,} requests, lengths hidden, one max_tokens cap for every "
             "request. Each row is one whole shard at one seed: its warm-up sample, its fillers' order, the "
             "choice's subsample and `balance`'s permutation (`fcfs`, the file's order, has none). The tables above "
             "run seed 0; a miss there smaller than the spread here is a draw, not a rank. pick: each plan's "
             "choice in turn (`keep`: the re-plan kept the running order)."
             + planned_earlier_note(oldest, hidden=True))
    header = ["mix", "seed", "fcfs s", "balance s", "blendserve s", "pick", *(f"x {b}" for b in SEED_BASELINES)]
    runs = [run["provenance"] for seeds in data["mixes"].values() for run in seeds.values()]
    latest = max(runs, key=lambda p: p["date"])
    return f"{intro}\n\n{table(header, rows)}\n\n{provenance({'provenance': latest})}"
