"""The theoretical optimum ``T_opt`` of a workload: a lower bound of every schedule.

``T_opt = f(C*, M*)`` with the same ``f`` as the engine's step time, where

- ``C*`` is the compute no schedule can avoid: every distinct prompt token
  (a node of the prompts' prefix trie) computed once, plus the ``d - 1``
  output tokens each request feeds back (the first output token comes out of
  the prompt's last forward pass, the last one is never fed);
- ``M*`` is the memory traffic no schedule can avoid: the forward pass that
  yields output token ``j`` attends over all ``p + j - 1`` tokens before it, so a
  request reads at least ``p * d + d * (d - 1) / 2`` tokens of KV (cache hits
  save compute, not reads); and every engine step streams the weights once,
  with at least ``S_min`` steps (below).

``S_min``, the fewest steps any order can take, is the larger of ``max(d)`` (a
request's output tokens come from distinct steps: the critical path) and,
when the engine's KV capacity ``K`` is given, ``sum d (d - 1) / 2 / K``: the
step yielding output ``j`` reads the ``j - 1`` earlier outputs' KV, which is
never shared (only prompts are cached), so at most ``K`` such tokens are read
in one step. This is what makes long decodes cost weight reads: 150 video
requests of 15k tokens cannot all decode in the same steps.

Why it bounds the simulator: each step costs ``f(c_s, m_s)``, and both
``sum_s max(c_s, m_s) >= max(sum c, sum m)`` and ``sum_s (c_s + m_s) = sum c + sum m``;
the simulator's ``sum c >= C*`` and ``sum m >= M*`` for any order (recomputation,
preemption and cache misses only add). The per-request formulas in ``cost.py``
(the design's ``p + d`` and ``p d + d (d + 1) / 2``) count one token more per
request, so they are not used here, to keep the bound strict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from blendserve.costmodel.cost import CostModel, combine
from blendserve.planner.lcp import sort_prompts  # the planner's exact LCP sort

if TYPE_CHECKING:  # only a hint here: the DAG files' parse imports this package, and batch imports pyarrow
    from blendserve.batch import RequestBatch


@dataclass(frozen=True)
class Optimum:
    comp: float  # C*: seconds of unavoidable compute
    mem: float  # M*: seconds of unavoidable memory traffic (KV reads + one weight read per step)
    time: float  # T_opt = f(C*, M*) + S_min * step overhead
    overlap: str  # f: "max" or "sum"
    min_steps: float = 0.0  # S_min: steps every order takes at least (each reads the weights once)


def unique_prompt_tokens(batch: RequestBatch) -> int:
    """Distinct prompt tokens of the batch: the nodes of its prompts' prefix trie.

    Sorted by prefix, the trie has ``sum p - sum LCP(neighbours)`` nodes.
    """

    if len(batch) == 0:
        return 0
    _, lcp = sort_prompts(batch.tokens, batch.token_offsets, starts=batch.token_starts)
    return int(batch.prompt_lens.sum() - lcp.sum())


def t_opt(
    cost_model: CostModel,
    prompt_lens: np.ndarray,
    output_tokens: np.ndarray,
    unique_prompt: int,
    overlap: str = "max",
    kv_capacity_tokens: float | None = None,
) -> Optimum:
    """``T_opt`` of requests with these lengths whose prompts hold ``unique_prompt`` distinct tokens.

    ``kv_capacity_tokens`` (the engine's ``K``) tightens the step count; without it the bound
    holds for any capacity.
    """
    p = np.asarray(prompt_lens, dtype=np.float64)
    d = np.maximum(np.asarray(output_tokens, dtype=np.float64), 1.0)
    comp = float(cost_model.comp_time(unique_prompt + np.sum(d - 1.0)))
    kv_reads = float(np.sum(p * d + d * (d - 1.0) / 2.0))
    steps = min_steps(d, kv_capacity_tokens)
    mem = float(cost_model.kv_read_time(kv_reads)) + steps * cost_model.weight_read_time
    # every one of those steps also pays the device's fixed overhead (0 on the catalog GPUs)
    time = float(combine(comp, mem, overlap)) + steps * cost_model.hardware.step_overhead
    return Optimum(comp, mem, time, overlap, steps)


def min_steps(output_tokens: np.ndarray, kv_capacity_tokens: float | None = None) -> float:
    """S_min: engine steps no order can avoid (critical path, and output KV read per step within K)."""
    d = np.asarray(output_tokens, dtype=np.float64)
    steps = float(d.max(initial=0.0))
    if kv_capacity_tokens is not None and kv_capacity_tokens > 0:
        steps = max(steps, float(np.ceil(np.sum(d * (d - 1.0) / 2.0) / float(kv_capacity_tokens))))
    return steps


def batch_t_opt(
    cost_model: CostModel,
    batch: RequestBatch,
    output_tokens: np.ndarray,
    overlap: str = "max",
    kv_capacity_tokens: float | None = None,
) -> Optimum:
    """``T_opt`` of a request batch with the given true output lengths (and the engine's KV capacity)."""
    return t_opt(cost_model, batch.prompt_lens, output_tokens, unique_prompt_tokens(batch), overlap, kv_capacity_tokens)
