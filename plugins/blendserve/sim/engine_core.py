"""The simulator's engine loop: scheduling, KV accounting, prefix cache, preemption.

Decoding sequences are not touched step by step: a sequence that entered
decode after step ``s0`` with ``ctx`` KV tokens and ``gen`` outputs has
``ctx + (t - s0)`` and ``gen + (t - s0)`` after step ``t``, so a step costs
O(prefills + finishes), and the sums the step time needs are kept as totals.
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from blendserve.batch import RequestBatch
from blendserve.costmodel import CostModel
from blendserve.scheduling.admission import AdmissionController, EngineState
from blendserve.sim.budget import block_size, counts_attention, token_budget
from blendserve.sim.radix_cache import RadixCache, RadixNode
from blendserve.sim.timeline import Timeline, sum_linear_steps


class Seq:
    __slots__ = ("idx", "p", "d", "gen", "ctx", "locked", "node", "left", "s0", "uid")

    def __init__(self, idx: int, p: int, d: int) -> None:
        self.idx, self.p, self.d = idx, p, d  # request index, prompt and true output length
        self.gen = 0  # output tokens produced (as of step s0 while decoding)
        self.ctx = 0  # KV tokens held, cache hits included (as of step s0 while decoding)
        self.locked = 0  # of those, tokens held (locked) in the radix tree
        self.node: RadixNode | None = None  # radix node whose path this sequence locks
        self.left = 0  # tokens still to prefill (prompt, or prompt + outputs after preemption)
        self.s0 = 0  # step after which decoding started (gen and ctx are as of then)
        self.uid = 0  # bumped on each state change, so stale heap entries are skipped


def step_overlap(cost_model: CostModel, config) -> str:  # type: ignore[no-untyped-def]
    """f of a step: the config's (``SimConfig.overlap``) when it sets one, else the hardware's own."""
    return config.overlap or cost_model.hardware.overlap


class EngineCore:
    def __init__(self, batch: RequestBatch, outputs: np.ndarray, cost_model: CostModel,
                 controller: AdmissionController, config, capacity: int) -> None:
        self.batch, self.outputs, self.controller, self.config = batch, outputs, controller, config
        self.capacity = capacity
        self.token_budget = token_budget(cost_model, config, capacity)  # resolved once: config or resource-aware
        self.block_size = block_size(cost_model, config)
        self.prompt_lens = batch.prompt_lens
        self.tree = RadixCache() if config.prefix_cache else None
        self.running: dict[int, Seq] = {}  # by request index, in start order (newest last)
        self.prefilling: dict[int, Seq] = {}  # running sequences still prefilling, in start order
        self.waiting: deque[Seq] = deque()  # admitted (or preempted), holding no KV
        self.n_dec = 0  # decoding sequences
        self.dec_base = 0  # sum of (ctx - s0) over decoding sequences: their KV is dec_base + n_dec * t
        self.private = 0  # KV tokens held outside the radix tree
        self.finishes: list[tuple[int, int, Seq]] = []  # (step of last output, uid, seq)
        self.progress: list[tuple[int, int, int, Seq]] = []  # (step, uid, output count to report, seq)
        self.step, self.clock, self.uid = 0, 0.0, 0
        self.comp_total = self.mem_total = 0.0
        self.hit_tokens = self.lookup_tokens = self.computed_tokens = self.preemptions = 0
        # per request, the prefix hit at its first start (-1: not started), as vLLM's num_cached_tokens
        self.first_hit = np.full(len(batch), -1, dtype=np.int64)
        self.timeline = Timeline()
        self.per_token_comp = float(cost_model.comp_time(1))
        self.per_kv_read = float(cost_model.kv_read_time(1))
        self.per_attn = float(cost_model.attention_comp_time(1, 1)) if counts_attention(cost_model, config) else 0.0
        self.weight_read = cost_model.weight_read_time
        self.overhead = cost_model.hardware.step_overhead  # seconds each step pays beyond compute and memory
        self.overlap = step_overlap(cost_model, config)

    # -- KV accounting -------------------------------------------------------------------------
    @property
    def used(self) -> int:
        return self.private + (self.tree.size if self.tree else 0)

    def _available(self) -> int:
        """Free KV plus what eviction could free."""
        return self.capacity - self.used + (self.tree.evictable if self.tree else 0)

    def _ensure(self, tokens: int) -> bool:
        """Evict until ``tokens`` KV slots are free; False if even eviction cannot."""
        short = tokens - (self.capacity - self.used)
        if short > 0 and self.tree:
            self.tree.evict(short)
        return self.capacity - self.used >= tokens

    def _new_uid(self, seq: Seq) -> int:
        self.uid += 1
        seq.uid = self.uid
        return self.uid

    # -- main loop ------------------------------------------------------------------------------
    def run(self) -> None:
        while True:
            if not self._step():
                if self.running:
                    self._preempt(next(reversed(self.running.values())))  # stalled prefills: free the newest
                    continue
                if self.waiting:
                    raise RuntimeError(f"request {self.waiting[0].idx} cannot start on an idle engine")
                if self.controller.remaining() == 0:
                    return
                raise RuntimeError("the admission controller declined every request while the engine was idle")

    def _step(self) -> bool:
        while self.n_dec and not self._ensure(self.n_dec):
            self._preempt(next(reversed(self.running.values())))
        n_dec = self.n_dec
        self.private += n_dec  # this step's decode slots
        budget = self.token_budget - n_dec
        chunks: list[tuple[Seq, int]] = []
        budget = self._schedule_prefills(budget, chunks)
        self._start_waiting(budget, chunks)
        if chunks:
            self._mixed_step(n_dec, chunks)
        elif n_dec:
            self._decode_run(n_dec)
        else:
            return False
        self._finish_due()
        self._report_progress()
        return True

    # -- scheduling -----------------------------------------------------------------------------
    def _schedule_prefills(self, budget: int, chunks: list[tuple[Seq, int]]) -> int:
        for seq in self.prefilling.values():
            if budget <= 0:
                break
            c = min(seq.left, budget)
            self._ensure(c)
            c = min(c, self.capacity - self.used)
            if c <= 0:
                break
            self._allocate_chunk(seq, c, chunks)
            budget -= c
        return budget

    def _start_waiting(self, budget: int, chunks: list[tuple[Seq, int]]) -> None:
        config = self.config
        while budget > 0 and len(self.running) < config.max_running:
            if not self.waiting and not self._admit_one():
                return
            seq = self.waiting[0]
            total = seq.p + seq.gen  # tokens whose KV must exist before the next output
            hit, node = 0, None
            if self.tree:
                tokens = self.batch.prompt(seq.idx)
                # at least the last token is computed, for its logits (vLLM's max_cache_hit_length)
                hit, node = self.tree.match_prefix(tokens, min(seq.p, total - 1), self.block_size)
                self.tree.lock(node)
            if not self._ensure(total - hit):  # room for the whole prompt, allocated chunk by chunk
                if node is not None:
                    self.tree.unlock(node)
                return
            self.waiting.popleft()
            self.running[seq.idx] = self.prefilling[seq.idx] = seq
            seq.node, seq.locked, seq.ctx, seq.left = node, hit, hit, total - hit
            self.hit_tokens += hit
            if self.first_hit[seq.idx] < 0:
                self.first_hit[seq.idx] = hit
            self.lookup_tokens += seq.p
            c = min(seq.left, budget)
            self._allocate_chunk(seq, c, chunks)
            budget -= c

    def _admit_one(self) -> bool:
        state = EngineState(len(self.running), len(self.waiting), self.used, self.capacity, self.clock)
        idx = self.controller.next_request(state)
        if idx is None:
            return False
        self.waiting.append(Seq(idx, int(self.prompt_lens[idx]), int(self.outputs[idx])))
        return True

    def _allocate_chunk(self, seq: Seq, c: int, chunks: list[tuple[Seq, int]]) -> None:
        seq.ctx += c
        seq.left -= c
        self.private += c
        chunks.append((seq, c))
        if self.tree:
            self._cache_scheduled(seq)

    def _cache_scheduled(self, seq: Seq) -> None:
        """Put the prompt KV scheduled so far in the tree: the whole prompt once all of it is, else its full blocks.

        vLLM caches a request's full blocks when it allocates them for a step
        (``KVCacheManager.allocate_slots``), so a request scheduled later in the
        same step already hits them; waiting for the prefill to finish would
        make siblings admitted together all miss.
        """
        n = seq.p if seq.ctx >= seq.p else seq.ctx - seq.ctx % self.block_size
        if n <= seq.locked:
            return
        _, node = self.tree.extend(seq.node, seq.locked, self.batch.prompt(seq.idx)[:n])
        self.tree.relock(seq.node, node)
        self.private += seq.locked - n  # those tokens' KV now lives in the tree (duplicates freed)
        seq.node, seq.locked = node, n

    # -- costing --------------------------------------------------------------------------------
    def _mixed_step(self, n_dec: int, chunks: list[tuple[Seq, int]]) -> None:
        """One step: decodes plus prefill chunks, each chunk reading the KV up to its end."""
        dec_reads = self.dec_base + n_dec * (self.step + 1)
        chunk_tokens = sum(c for _, c in chunks)
        chunk_reads = sum(seq.ctx for seq, _ in chunks)
        comp = (n_dec + chunk_tokens) * self.per_token_comp
        if self.per_attn:
            comp += self.per_attn * (dec_reads + sum(c * (s.ctx - (c - 1) / 2.0) for s, c in chunks))
        mem = self.weight_read + (dec_reads + chunk_reads) * self.per_kv_read
        self._advance(1, comp, mem, self.overhead + (comp + mem if self.overlap == "sum" else max(comp, mem)))
        self.computed_tokens += n_dec + chunk_tokens
        for seq, _ in chunks:
            if seq.left == 0:
                self._prefill_done(seq)

    def _decode_run(self, n_dec: int) -> None:
        """k identical decode-only steps, up to the next finish or until KV runs out."""
        k_finish = self.finishes[0][0] - self.step if self.finishes else 1
        k = max(1, min(k_finish, 1 + self._available() // n_dec))
        self._ensure((k - 1) * n_dec)
        self.private += (k - 1) * n_dec
        base = self.dec_base + n_dec * self.step  # KV of decoding sequences before the run
        c0, c1 = n_dec * self.per_token_comp + self.per_attn * base, self.per_attn * n_dec
        m0, m1 = self.weight_read + self.per_kv_read * base, self.per_kv_read * n_dec
        duration = k * self.overhead + sum_linear_steps(c0, c1, m0, m1, k, self.overlap)
        reads = k * base + n_dec * k * (k + 1) / 2.0
        comp = k * n_dec * self.per_token_comp + self.per_attn * reads
        self._advance(k, comp, k * self.weight_read + reads * self.per_kv_read, duration)
        self.computed_tokens += k * n_dec

    def _advance(self, steps: int, comp: float, mem: float, duration: float) -> None:
        self.timeline.add(self.clock, duration, steps, comp, mem)
        self.clock += duration
        self.comp_total += comp
        self.mem_total += mem
        self.step += steps

    # -- state changes --------------------------------------------------------------------------
    def _prefill_done(self, seq: Seq) -> None:
        """The prompt is in (and already cached, when its last chunk was scheduled): take its output token,
        then decode or finish."""
        del self.prefilling[seq.idx]
        seq.gen += 1
        seq.s0 = self.step
        uid = self._new_uid(seq)
        if seq.gen >= seq.d:
            self._finish(seq)
            return
        self.n_dec += 1
        self.dec_base += seq.ctx - seq.s0
        heapq.heappush(self.finishes, (seq.s0 + seq.d - seq.gen, uid, seq))
        self._queue_progress(seq)

    def _finish_due(self) -> None:
        while self.finishes and self.finishes[0][0] <= self.step:
            _, uid, seq = heapq.heappop(self.finishes)
            if uid != seq.uid:
                continue
            self.n_dec -= 1
            self.dec_base -= seq.ctx - seq.s0
            seq.ctx += self.step - seq.s0
            seq.gen = seq.d
            self._finish(seq)

    def _finish(self, seq: Seq) -> None:
        self._release(seq)
        self.controller.on_finish(seq.idx, seq.d)

    def _release(self, seq: Seq) -> None:
        self.private -= seq.ctx - seq.locked
        if seq.node is not None:
            self.tree.unlock(seq.node)
        del self.running[seq.idx]
        self.prefilling.pop(seq.idx, None)
        seq.ctx = seq.locked = seq.left = 0
        seq.node = None
        self._new_uid(seq)

    def _preempt(self, seq: Seq) -> None:
        """Drop the sequence's KV; it waits at the front and recomputes prompt and outputs so far."""
        if seq.idx not in self.prefilling:  # decoding: bring gen and ctx up to date first
            self.n_dec -= 1
            self.dec_base -= seq.ctx - seq.s0
            seq.gen += self.step - seq.s0
            seq.ctx += self.step - seq.s0
        self._release(seq)
        self.waiting.appendleft(seq)
        self.preemptions += 1

    def _queue_progress(self, seq: Seq) -> None:
        """Schedule the next on_progress report: the first power-of-two multiple of progress_first above gen."""
        target = self.config.progress_first
        while target <= seq.gen:
            target *= 2
        if target < seq.d:
            heapq.heappush(self.progress, (seq.s0 + target - seq.gen, seq.uid, target, seq))

    def _report_progress(self) -> None:
        while self.progress and self.progress[0][0] <= self.step:
            step, uid, count, seq = heapq.heappop(self.progress)
            if uid != seq.uid:
                continue
            self.controller.on_progress(seq.idx, count)
            target = count * 2
            if target < seq.d:
                heapq.heappush(self.progress, (step + count, uid, target, seq))
