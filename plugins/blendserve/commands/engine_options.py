"""The engine settings ``run`` and ``calibrate`` share: a profile fitted with some settings is found
again (``--hardware auto``) by a run with the same ones, so both commands take them the same way."""

from __future__ import annotations

import argparse

from blendserve import ENGINES
from blendserve.config import DTYPES, RunConfig, default_dtype


def add_engine_arguments(p: argparse.ArgumentParser, engines: tuple[str, ...] = ENGINES) -> None:
    defaults = RunConfig(run_id="defaults", input="", db="defaults.duckdb")
    p.add_argument("--engine", default="vllm", choices=engines)
    p.add_argument("--model", default="", help="model folder (default: the prepared SmolLM2-135M-Instruct)")
    p.add_argument("--max-model-len", type=int, default=defaults.max_model_len,
                   help="context length; longer prompts are rejected")
    p.add_argument("--kv-cache-gb", type=float, default=defaults.kv_cache_gb, help="KV cache size in GiB")
    p.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs, help="engine's running-sequence limit")
    p.add_argument("--dtype", default=None, choices=DTYPES,  # resolved in the command: a bad variable is its error
                   help="vLLM weight and activation dtype (RunConfig.extra['vllm']['dtype']); default: bfloat16 on a"
                        " GPU or a CPU with bf16 instructions, else float32 (BLENDSERVE_DTYPE overrides)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="vLLM's token budget per step (default: vLLM's for its LLM class; 4096 on a CPU)")


def engine_settings(args: argparse.Namespace) -> dict:
    """RunConfig keywords of the engine flags."""
    return {"engine": args.engine, "model": args.model, "max_model_len": args.max_model_len,
            "kv_cache_gb": args.kv_cache_gb, "max_num_seqs": args.max_num_seqs,
            "extra": {"vllm": vllm_options(args)} if args.engine == "vllm" else {}}


def vllm_options(args: argparse.Namespace) -> dict:
    """EngineArgs keywords from the flags (RunConfig.extra["vllm"], passed through to vLLM)."""
    options = {"dtype": args.dtype or default_dtype()}  # the run records the dtype it ran in
    if args.max_num_batched_tokens is not None:
        options["max_num_batched_tokens"] = args.max_num_batched_tokens
    return options
