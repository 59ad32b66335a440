"""Warm-up sampling in the simulator: BlendServe with lengths from a sample vs true lengths vs max_tokens.

    .venv/bin/python bench/bench_sampling.py [--requests 10000] [--rates 0.001,0.01,0.1,1] [--workloads ...] [--out]

Workloads with real output lengths from ../shared/data:

- ``azure-conv``: the Azure 2023 conversation trace's token counts (the
  workload builder's API pool: a shared system prompt, then random ids),
  ``max_tokens`` 2048.
- ``vbench-rewrite``: VBench prompt-extension calls. The prompt is the
  refiner's fixed system prompt (GPT-4o refiner ~802 tokens, Wan2.1/Qwen
  extender ~920; their text is not in the data, so fixed ids of that length)
  plus the short VBench prompt; the true output is the real rewrite's token
  count. ``max_tokens`` 512.
- ``mix``: both, plus 2% video requests whose length is known in advance.

Each rate's sampled requests run first as their own phase (FCFS, true
lengths: the engine's real answer); the rest is planned with estimates from
those lengths and run with BlendServe's dual scan. ``est-only`` is the same
estimates with no separate phase (the estimator's quality alone); ``+warm-up``
adds a separate phase's time; ``inline warm-up`` runs the sample inside the
job's one engine run (``scheduling.warmup.warmup_controller``: random fillers keep the
engine busy until the sample is back, then the plan takes over). Throughput is (input + output tokens) / time, as the
paper counts it. Llama-3.1-8B on one A100-80G.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from blendserve.batch import UNKNOWN, RequestBatch
from blendserve.costmodel import CostModel
from blendserve.model_prep import cache_root
from blendserve.planner.estimates import default_output_estimates
from blendserve.planner.prefix_tree import build_prefix_tree
from blendserve.scheduling.admission import StaticOrder
from blendserve.scheduling.registry import PolicyContext, make_controller
from blendserve.sampling import estimate_outputs, estimate_report, report_text, select_samples, split_warmup
from blendserve.scheduling.warmup import warmup_controller
from blendserve.sim import SimConfig, simulate
from blendserve.sim.compare import true_outputs
from blendserve.sim.simulator import kv_capacity_tokens
from blendserve.workload import WorkloadSpec, build_workload
from blendserve.workload_sources import data_root, system_prompt
from common import SETUPS, write_result

# (short prompts, rewrites, refiner): line-aligned files of vbench_t2v_prompts/.
REWRITE_PAIRS = (
    ("prompts__all_dimension.txt", "prompts__augmented_prompts__gpt_enhanced_prompts__all_dimension_longer.txt", "gpt"),
    ("prompts__all_category.txt", "prompts__augmented_prompts__gpt_enhanced_prompts__all_category_longer.txt", "gpt"),
    ("VBench-2.0__prompts__VBench2_full_text.txt", "VBench-2.0__prompts__prompt_aug__VBench2_full_text_aug.txt", "gpt"),
    ("prompts__all_dimension.txt", "prompts__augmented_prompts__Wan2.1-T2V-1.3B__all_dimension_aug_wanx_seed42.txt", "wan"),
    ("VBench-2.0__prompts__VBench2_full_text.txt", "VBench-2.0__prompts__prompt_aug__Wanx_full_text_aug.txt", "wan"),
)
REFINER_SYSTEM_TOKENS = {"gpt": 802, "wan": 920}  # from the data README: system prompt + few-shot turns, chars / 4
POLICY = "blendserve"  # default; --policy "blendserve[static]" is the dual scan's static list alone


def _lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines()]


def vbench_rewrite_batch(root: Path, max_tokens: int = 512) -> RequestBatch:
    """Prompt-extension requests whose true output length is the real rewrite's token count."""
    from blendserve.model_prep import load_tokenizer

    tok = load_tokenizer()
    prompts, outputs = [], []
    for short_name, long_name, refiner in REWRITE_PAIRS:
        short, long = _lines(root / "vbench_t2v_prompts" / short_name), _lines(root / "vbench_t2v_prompts" / long_name)
        pairs = [(s, r) for s, r in zip(short, long) if s and r]
        system = system_prompt(f"vbench-{refiner}-refiner", REFINER_SYSTEM_TOKENS[refiner])
        for enc_s, enc_r in zip(tok.encode_batch([s for s, _ in pairs]), tok.encode_batch([r for _, r in pairs])):
            prompts.append(np.concatenate([system, np.asarray(enc_s.ids, dtype=np.int32)]))
            outputs.append(min(len(enc_r.ids) + 1, max_tokens))  # + the end-of-text token that stops it
    return _batch(prompts, np.array(outputs), max_tokens, "vbench")


def _batch(prompts: list[np.ndarray], outputs: np.ndarray, max_tokens: int, name: str) -> RequestBatch:
    offsets = np.zeros(len(prompts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in prompts], out=offsets[1:])
    n = len(prompts)
    return RequestBatch(
        request_ids=np.array([f"{name}-{i}" for i in range(n)], dtype=object), token_offsets=offsets,
        tokens=np.concatenate(prompts).astype(np.int32), max_tokens=np.full(n, max_tokens, dtype=np.int32),
        expected_output_tokens=np.full(n, UNKNOWN, dtype=np.int32), sim_output_tokens=outputs.astype(np.int32),
    )


def concat(batches: list[RequestBatch]) -> RequestBatch:
    lens = np.concatenate([b.prompt_lens for b in batches])
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    cat = lambda name: np.concatenate([getattr(b, name) for b in batches])  # noqa: E731
    return RequestBatch(cat("request_ids"), offsets, cat("tokens"), cat("max_tokens"), cat("expected_output_tokens"),
                        cat("sim_output_tokens"))


def built(spec: WorkloadSpec, cost: CostModel) -> RequestBatch:
    """A workload-builder file, cached in .cache/bench/."""
    path = cache_root() / "bench" / f"sampling-{spec.name}-{spec.num_requests}-{spec.seed}.parquet"
    if not path.exists():
        build_workload(spec, path, cost, data_root())
    return RequestBatch.from_parquet(path)


def workloads(names: list[str], n: int, cost: CostModel) -> dict[str, RequestBatch]:
    out: dict[str, RequestBatch] = {}
    conv = lambda: built(WorkloadSpec(n, only="api", api_trace="azure-conv", name="azure-conv"), cost)  # noqa: E731
    if "azure-conv" in names:
        out["azure-conv"] = conv()
    if "vbench-rewrite" in names or "mix" in names:
        vbench = vbench_rewrite_batch(data_root())
        if "vbench-rewrite" in names:
            out["vbench-rewrite"] = vbench
        if "mix" in names:
            video = built(WorkloadSpec(max(n // 50, 1), only="video", name="video"), cost)
            out["mix"] = concat([conv(), vbench, video])
    return out


def run_blendserve(batch: RequestBatch, outputs: np.ndarray, estimates: np.ndarray, cost: CostModel,
                   config: SimConfig, policy: str = POLICY) -> float:
    """Simulated seconds of BlendServe over ``batch`` planned with ``estimates``, running ``outputs``."""
    context = PolicyContext(batch, estimates, cost, kv_capacity_tokens(cost, config))
    return simulate(batch, outputs, cost, make_controller(policy, context), config).total_time


def run_sampled(batch: RequestBatch, outputs: np.ndarray, rate: float, cost: CostModel, config: SimConfig,
                seed: int, policy: str = POLICY) -> dict:
    """Warm-up phase (FCFS over the sample), then BlendServe over the rest with estimates from it."""
    tree = build_prefix_tree(batch, cost)
    sampled = select_samples(batch, tree, rate=rate, min_subtree=100, cap=len(batch), seed=seed)
    observed = outputs[sampled]  # what the engine answered: the only true lengths the planner sees
    est = estimate_outputs(batch, tree, sampled, observed)
    parts = split_warmup(tree, sampled)
    warm = batch.take(parts.run)
    t_warm = simulate(warm, outputs[parts.run], cost, StaticOrder(np.arange(len(warm))), config).total_time
    rest = batch.take(parts.rest)
    t_rest = run_blendserve(rest, outputs[parts.rest], est.mean[parts.rest], cost, config, policy) if len(rest) else 0.0
    t_one = run_blendserve(batch, outputs, est.mean, cost, config, policy)
    rows = estimate_report(tree, est, outputs)
    return {"sampled": len(sampled), "warmup_s": t_warm, "phased_s": t_warm + t_rest, "est_only_s": t_one,
            "inline_s": run_inline(batch, outputs, parts.run, parts.rest, cost, config, seed, policy), "report": rows}


def run_inline(batch: RequestBatch, outputs: np.ndarray, run: np.ndarray, rest: np.ndarray, cost: CostModel,
               config: SimConfig, seed: int, policy: str = POLICY) -> float:
    """The warm-up inside one engine run (``warmup_controller``); duplicates of samples are not run."""
    keep = np.union1d(run, rest)
    kept = batch.take(keep)
    tree = build_prefix_tree(kept, cost)
    controller = warmup_controller(kept, tree, np.searchsorted(keep, run), cost, kv_capacity_tokens(cost, config),
                                   policy, seed)
    return simulate(kept, outputs[keep], cost, controller, config).total_time


def bench_workload(name: str, batch: RequestBatch, rates: list[float], cost: CostModel, config: SimConfig,
                   seed: int, policy: str = POLICY) -> dict:
    outputs = true_outputs(batch)
    tokens = float(batch.prompt_lens.sum() + outputs.sum())
    started = time.perf_counter()
    t_oracle = run_blendserve(batch, outputs, outputs, cost, config, policy)
    t_max = run_blendserve(batch, outputs, default_output_estimates(batch), cost, config, policy)
    print(f"\n== {name}: {len(batch):,} requests, {int(batch.prompt_lens.sum()):,} in / {int(outputs.sum()):,} out tokens, "
          f"mean output {outputs.mean():.0f}, max_tokens mean {batch.max_tokens.mean():.0f}")
    print(f"{'estimates':<24} {'sampled':>8} {'time s':>9} {'tok/s':>9} {'vs oracle':>9} {'MAPE':>7} {'bias':>7}")
    rows = [_line("oracle (true lengths)", None, t_oracle, tokens, t_oracle),
            _line("max_tokens (none)", None, t_max, tokens, t_oracle)]
    for rate in rates:
        r = run_sampled(batch, outputs, rate, cost, config, seed, policy)
        overall = r["report"][0]
        for label, key in (("est-only", "est_only_s"), ("+warm-up", "phased_s"), ("inline warm-up", "inline_s")):
            rows.append(_line(f"{rate:.1%} {label}", r["sampled"], r[key], tokens, t_oracle, overall.mape, overall.bias))
        if rate == 0.01:
            print("   1% estimate error by source subtree (largest 5):")
            print("   " + report_text(r["report"][:6]).replace("\n", "\n   "))
    print(f"   (bench wall {time.perf_counter() - started:.0f} s)")
    return {"workload": name, "requests": len(batch), "input_tokens": int(batch.prompt_lens.sum()),
            "output_tokens": int(outputs.sum()), "rows": rows}


def _line(label: str, sampled: int | None, t: float, tokens: float, t_oracle: float, mape: float | None = None,
          bias: float | None = None) -> dict:
    """Print one row of the table and return it."""
    err = f"{mape:>7.1%} {bias:>+7.1%}" if mape is not None else f"{'':>7} {'':>7}"
    shown = "-" if sampled is None else str(sampled)
    print(f"{label:<24} {shown:>8} {t:>9.1f} {tokens / t:>9.0f} {t_oracle / t:>9.1%} {err}")
    return {"estimates": label, "sampled": sampled, "time_s": t, "throughput": tokens / t, "vs_oracle": t_oracle / t,
            "mape": mape, "bias": bias}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000, help="Azure conversation requests (the mix adds VBench and video)")
    ap.add_argument("--rates", default="0.001,0.01,0.1,1")
    ap.add_argument("--workloads", default="azure-conv,vbench-rewrite,mix")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy", default=POLICY, help="blendserve (the choice) or blendserve[static] (the dual"
                                                      " scan's static list alone)")
    ap.add_argument("--out", action="store_true", help="write bench/results/sampling.json")
    args = ap.parse_args()
    cost = SETUPS["8b"].cost()
    config = SimConfig()
    rates = [float(r) for r in args.rates.split(",") if r]
    results = [bench_workload(name, batch, rates, cost, config, args.seed, args.policy)
               for name, batch in workloads(args.workloads.split(","), args.requests, cost).items()]
    if args.out:
        write_result("sampling", {"setup": SETUPS["8b"].label, "policy": args.policy, "rates": rates,
                                  "workloads": results})


if __name__ == "__main__":
    main()
