"""A step simulator of a continuous-batching engine, costed by the cost model.

Each step: every decoding sequence feeds one token; the rest of the token
budget goes to prefill chunks (running prefills first, then new requests).
Step time is ``f(compute of the step's tokens, weight read + KV read)``.
Prompts go through an LRU radix prefix cache: a hit skips the prefill compute
of the cached tokens, not the reads of their KV. As in vLLM, a prompt's full
KV blocks are cached when its chunk is scheduled, so a request started later
in the same step hits them, and hits are whole blocks (``block_size``). When
KV runs out the newest sequence is preempted and later recomputed (prompt and
output so far).

Admission goes only through the ``AdmissionController`` protocol: the engine
asks ``next_request`` whenever it has room (a free sequence slot and nothing
waiting) and reports ``on_progress`` (when a request's output reaches 16, 32,
64, ... tokens) and ``on_finish``. Runs of identical decode-only steps are
costed at once (``timeline.sum_linear_steps``), up to the next finish or KV
exhaustion; admission is not asked again inside such a run, because nothing
that frees room (a finish) happens in it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel
from blendserve.scheduling.admission import AdmissionController
from blendserve.sim.engine_core import EngineCore, step_overlap
from blendserve.sim.timeline import Timeline

GIB = float(1 << 30)


@dataclass(frozen=True)
class SimConfig:
    # tokens per step (decodes + prefill chunks), vLLM's max_num_batched_tokens; None: resource-aware,
    # the budget whose compute matches one step's weight read plus a full KV read (balanced_token_budget)
    token_budget: int | None = None
    max_running: int = 256  # sequences holding KV at once: vLLM's max_num_seqs
    gpu_memory_utilization: float = 0.9  # share of device memory the engine may use
    reserve_bytes: float = 2 * GIB  # per device: activations, CUDA graphs, allocator slack
    kv_capacity_tokens: int | None = None  # override the KV capacity computed from memory
    overlap: str | None = None  # f of a step: "max" (compute and memory overlap), "sum"; None: the hardware's
    attention_flops: bool | None = None  # add attention FLOPs (QK^T, AV) to each step's compute; None: the hardware's
    prefix_cache: bool = True  # reuse cached prompt prefixes (radix cache)
    # KV block in tokens: prefix hits are whole blocks; None: the calibrated engine's
    # (``HardwareSpec.block_size``), else vLLM's default on GPUs (sim.budget.DEFAULT_BLOCK_SIZE)
    block_size: int | None = None
    progress_first: int = 16  # first output count reported by on_progress (then doubling)


@dataclass
class SimResult:
    total_time: float  # simulated seconds for the whole batch
    throughput: float  # (input + output tokens) / total_time
    input_tokens: int  # sum of prompt tokens
    output_tokens: int  # sum of output tokens
    prefix_hit_ratio: float  # prompt tokens served by the prefix cache / prompt tokens looked up
    hit_tokens: int  # prompt tokens served by the prefix cache (restarts included)
    shared_tokens: int  # prompt tokens each request's first start found cached: the sharing its order earned
    computed_tokens: int  # tokens put through the model (prefill, recomputation, decode)
    preemptions: int  # sequences evicted from KV and recomputed later
    steps: int  # engine steps
    kv_capacity_tokens: int  # KV capacity the run had
    token_budget: int  # tokens per step the run had (resolved when the config left it to the cost model)
    comp_time: float  # sum of the steps' compute-bound seconds
    mem_time: float  # sum of the steps' memory-bound seconds (weights + KV)
    timeline: Timeline  # per-step (or per run of decode steps) compute and memory use
    cached_tokens: np.ndarray  # per request, prompt tokens its first start found cached (vLLM's num_cached_tokens)

    def summary(self) -> dict[str, float | int]:
        """The scalar fields, for printing or JSON."""
        return {k: v for k, v in self.__dict__.items() if k not in ("timeline", "cached_tokens")}


def kv_capacity_tokens(cost_model: CostModel, config: SimConfig) -> int:
    """KV slots in tokens: usable device memory minus weights minus the reserve, over KV bytes a token."""
    if config.kv_capacity_tokens is not None:
        return int(config.kv_capacity_tokens)
    hw, model = cost_model.hardware, cost_model.model
    free = hw.total_mem_bytes * config.gpu_memory_utilization - model.weight_bytes - config.reserve_bytes * hw.tp
    return max(int(free // model.kv_bytes_per_token), 0)


def simulate(
    batch: RequestBatch,
    output_tokens: np.ndarray,
    cost_model: CostModel,
    controller: AdmissionController,
    config: SimConfig = SimConfig(),
) -> SimResult:
    """Run ``batch`` to completion; ``output_tokens`` are the true lengths (the model's behaviour)."""
    outputs = np.maximum(np.asarray(output_tokens, dtype=np.int64), 1)
    if outputs.shape != (len(batch),):
        raise ValueError(f"output_tokens has shape {outputs.shape}, expected ({len(batch)},)")
    capacity = kv_capacity_tokens(cost_model, config)
    needed = batch.prompt_lens + outputs
    if len(batch) and needed.max() > capacity:
        worst = int(np.argmax(needed))
        raise ValueError(f"request {batch.request_ids[worst]} needs {needed[worst]} KV tokens, capacity is {capacity}")
    if len(batch) and batch.prompt_lens.min() < 1:
        raise ValueError("every request needs at least one prompt token")
    core = EngineCore(batch, outputs, cost_model, controller, config, capacity)
    core.run()
    input_tokens, output_total = int(batch.prompt_lens.sum()), int(outputs.sum())
    return SimResult(
        total_time=core.clock,
        throughput=(input_tokens + output_total) / core.clock if core.clock > 0 else 0.0,
        input_tokens=input_tokens,
        output_tokens=output_total,
        prefix_hit_ratio=core.hit_tokens / core.lookup_tokens if core.lookup_tokens else 0.0,
        hit_tokens=core.hit_tokens,
        # a preempted request that finds its own prompt again at restart shares nothing with another one
        shared_tokens=int(np.maximum(core.first_hit, 0).sum()),
        computed_tokens=core.computed_tokens,
        preemptions=core.preemptions,
        steps=core.step,
        kv_capacity_tokens=capacity,
        token_budget=core.token_budget,
        comp_time=core.comp_total,
        mem_time=core.mem_total,
        timeline=core.timeline,
        cached_tokens=core.first_hit,
    )
