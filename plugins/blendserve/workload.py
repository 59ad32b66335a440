"""Build paper-style workload files: an API trace, MMLU and video requests mixed to a target.

The mix is solved for a target density (``Comp_eff / sum Mem`` of the whole
file on a model/hardware pair, the root density the planner will see) and a
target sharing ratio (``1 - unique prompt tokens / prompt tokens``: the share
of prompt compute a perfect prefix cache saves). Video requests set the
density, MMLU's shared 5-shot prefixes the sharing (``workload_solve``). Pools are sampled in
cycles of permutations, so a file repeats a question or video prompt only
after using them all (repeats are further samples: other seeds).

The rare-heavy mixes (``RARE_MIXES``, issue 20) fix each source's share of
requests instead (``WorkloadSpec.shares``): a few video requests, whose
outputs are all over 8k tokens, among short API and MMLU answers. Where their
prompts begin is ``WorkloadSpec.system_prompts``: under a system prompt of
their own (a prefix subtree the planner can tell apart), or under the one
system prompt every request of the file starts with (it cannot).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from blendserve import workload_sources as ws
from blendserve.costmodel import CostModel
from blendserve.schema import REQUEST_SCHEMA
from blendserve.workload_solve import prefix_lengths, solve_mix, source_stats
from blendserve.workload_sources import TOKENIZER_NOTE, VOCAB, Pool, system_prompt, video_lengths

MIXES: dict[str, tuple[float, float]] = {  # name: (density, sharing), the paper's four main mixes
    "d1.4-s35": (1.4, 0.35), "d1.4-s5": (1.4, 0.05), "d0.9-s35": (0.9, 0.35), "d0.9-s5": (0.9, 0.05),
}
# name: WorkloadSpec fields. Fixed shares of requests, not solved: 0.3% / 1% heavy requests (video: every
# output 9,065 to 23,865 tokens at the paper's 16k mean, the only outputs over 8k the data supports; the API
# traces' longest is 1,899) among short answers (MMLU: 2 tokens; azure-code: 28 on average). rare-*: the
# heavy family under a system prompt of its own. shared-sys: heavy and short (API) requests all start with
# the same system prompt, so no prefix node separates them; 0.5% of requests, about 3/4 of the output tokens.
RARE_MIXES: dict[str, dict] = {
    "rare-0.3": {"shares": (("api", 0.4985), ("mmlu", 0.4985), ("video", 0.003)), "system_prompts": "families"},
    "rare-1": {"shares": (("api", 0.495), ("mmlu", 0.495), ("video", 0.01)), "system_prompts": "families"},
    "shared-sys": {"shares": (("api", 0.995), ("video", 0.005)), "system_prompts": "shared"},
}
SOURCES = ("api", "mmlu", "video")
# WorkloadSpec.system_prompts: which prompts begin with a system prompt (its system_prompt_tokens long).
#   "api": the API trace's requests only, inside their trace length (the paper mixes);
#   "families": also the video requests, under a video system prompt of their own (one prefix subtree);
#   "shared": every request, under the API trace's one system prompt, prepended (API prompts keep their
#   trace length after it): long and short answers share it.
SYSTEM_PROMPTS = ("api", "families", "shared")
CHUNK_ROWS = 20_000  # rows materialized at once when writing (bounds memory at 400k requests)
# REQUEST_SCHEMA plus ingest's ``custom_id``, so ``blendserve run`` takes the file as is
WORKLOAD_SCHEMA = REQUEST_SCHEMA.insert(0, pa.field("custom_id", pa.string(), nullable=False))


@dataclass(frozen=True)
class WorkloadSpec:
    num_requests: int  # requests in the file
    density: float | None = None  # target density of the mix (None with ``only``)
    sharing: float | None = None  # target sharing ratio of the mix (None with ``only``)
    only: str | None = None  # a single source ("api", "mmlu", "video") instead of a mix
    seed: int = 0  # every random choice derives from it
    api_trace: str = "azure-code"  # "azure-code" or "azure-conv"
    system_prompt_tokens: int = 64  # the API trace's per-trace system prompt
    video_mean_tokens: float = 16_000  # mean video output (frames x tokens per frame), as in the paper
    mmlu_output_tokens: int = 2  # the answer letter and the end-of-text token that stops generation
    name: str = "workload"  # prefix of request ids
    shares: tuple[tuple[str, float], ...] | None = None  # (source, share of requests): fixed, instead of solved
    system_prompts: str = "api"  # which prompts begin with a system prompt (SYSTEM_PROMPTS)


def mix_spec(name: str, requests: int, seed: int = 0) -> WorkloadSpec:
    """The spec of a named mix: a paper mix (MIXES) or a rare-heavy one (RARE_MIXES)."""
    if name in MIXES:
        density, sharing = MIXES[name]
        return WorkloadSpec(requests, density, sharing, seed=seed, name=name)
    return WorkloadSpec(requests, seed=seed, name=name, **RARE_MIXES[name])


def prefix_ids(spec: WorkloadSpec, source: str) -> np.ndarray | None:
    """The system prompt put in front of a source's own prompts (None: none; the API pool's own is inside
    its trace length, except under "shared", where it is prepended like the others')."""
    if spec.system_prompts not in SYSTEM_PROMPTS:
        raise ValueError(f"system_prompts {spec.system_prompts!r}: one of {SYSTEM_PROMPTS}")
    if spec.system_prompts == "shared":
        return system_prompt(spec.api_trace, spec.system_prompt_tokens)
    if spec.system_prompts == "families" and source == "video":
        return system_prompt("video", spec.system_prompt_tokens)
    return None


def with_prefix(pool: Pool, ids: np.ndarray) -> Pool:
    """``pool`` with ``ids`` in front of every prompt. The API pool has no ids (they are generated at write
    time, the system prompt first): its prompts only grow by the prefix."""
    lens = pool.prompt_lens + len(ids)
    if not len(pool.offsets):
        return replace(pool, prompt_lens=lens)
    offsets = np.zeros(len(pool) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    tokens = np.empty(int(offsets[-1]), dtype=np.int32)
    tokens[(offsets[:-1, None] + np.arange(len(ids))).ravel()] = np.tile(ids, len(pool))
    rows = np.repeat(np.arange(len(pool)), pool.prompt_lens)
    tokens[np.arange(len(pool.tokens)) + (rows + 1) * len(ids)] = pool.tokens
    return replace(pool, offsets=offsets, tokens=tokens, prompt_lens=lens)


def spec_pools(spec: WorkloadSpec, pools: dict[str, Pool]) -> dict[str, Pool]:
    """The pools as ``spec`` draws from them: system prompts put in front where ``spec.system_prompts`` says."""
    out = {}
    for name, pool in pools.items():
        ids = prefix_ids(spec, name)
        out[name] = pool if ids is None else with_prefix(pool, ids)
    return out


@dataclass
class MixReport:
    counts: dict[str, int]  # requests per source
    density: float  # achieved Comp_eff / sum Mem of the file
    sharing: float  # achieved 1 - unique / total prompt tokens
    input_tokens: int  # sum of prompt tokens
    output_tokens: int  # sum of true output tokens
    unique_prompt_tokens: int  # distinct prompt tokens (shared prefixes once)
    tokenizer: str = TOKENIZER_NOTE  # how text became token ids
    notes: list[str] = field(default_factory=list)  # choices a reader should know

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def draw_rows(rng: np.random.Generator, pool_size: int, n: int) -> np.ndarray:
    """``n`` pool rows in cycles of permutations: no repeat before every row has been used."""
    cycles = -(-n // pool_size) if n else 0
    return np.concatenate([rng.permutation(pool_size) for _ in range(cycles)])[:n] if n else np.zeros(0, np.int64)


@dataclass
class Plan:
    """Which pool row each request is, in file order."""

    source: np.ndarray  # (n,) index into SOURCES
    row: np.ndarray  # (n,) row of that source's pool
    output: np.ndarray  # (n,) true output tokens
    frames: np.ndarray  # (n,) video frames (0 for other sources)
    tokens_per_frame: int  # video tokens per frame
    counts: dict[str, int]  # requests per source


def request_counts(spec: WorkloadSpec, pools: dict[str, Pool], cost: CostModel) -> dict[str, int]:
    """Requests per source: one source, fixed shares (the API trace takes the rounding), or solved."""
    if spec.only:
        return {name: (spec.num_requests if name == spec.only else 0) for name in SOURCES}
    if spec.shares:
        shares = dict(spec.shares)
        counts = {name: int(round(spec.num_requests * shares.get(name, 0.0))) for name in SOURCES}
        counts["api"] += spec.num_requests - sum(counts.values())
        return counts
    stats = {name: source_stats(pools[name], spec, np.random.default_rng(spec.seed)) for name in SOURCES}
    return solve_mix(stats, spec, cost)


def plan_requests(spec: WorkloadSpec, pools: dict[str, Pool], cost: CostModel) -> Plan:
    rng = np.random.default_rng(spec.seed)
    counts = request_counts(spec, pools, cost)
    source = np.repeat(np.arange(len(SOURCES)), [counts[s] for s in SOURCES])
    row = np.concatenate([draw_rows(rng, len(pools[s]), counts[s]) if counts[s] else np.zeros(0, np.int64)
                          for s in SOURCES])
    output = np.zeros(len(source), dtype=np.int64)
    frames = np.zeros(len(source), dtype=np.int64)
    for i, name in enumerate(SOURCES):
        at = source == i
        if name != "video" and at.any():
            output[at] = pools[name].outputs[row[at]]
    video = source == SOURCES.index("video")
    output[video], frames[video], tpf = video_lengths(rng, int(video.sum()), spec.video_mean_tokens)
    order = rng.permutation(len(source))  # file order interleaves the sources
    return Plan(source[order], row[order], output[order], frames[order], tpf, counts)


def unique_prompt_tokens(plan: Plan, pools: dict[str, Pool], spec: WorkloadSpec) -> int:
    """Distinct prompt tokens of the planned file (shared prefixes and repeated rows once).

    ``pools`` as ``spec_pools`` gives them: a system prompt put in front of a source counts once for it
    (once for the whole file under "shared", where every source has the same one).
    """
    unique = used = 0
    for i, name in enumerate(SOURCES):
        rows = np.unique(plan.row[plan.source == i])
        if not len(rows):
            continue
        used += 1
        pool = pools[name]
        added = 0 if prefix_ids(spec, name) is None or name == "api" else spec.system_prompt_tokens
        if name == "api":
            p = pool.prompt_lens[plan.row[plan.source == i]]
            unique += spec.system_prompt_tokens + int(np.sum(p - np.minimum(spec.system_prompt_tokens, p - 1)))
        elif name == "mmlu":
            # each subject's prefix holds the added system prompt: once for the source, not once per subject
            prefix = prefix_lengths(pool)
            subjects = prefix[np.unique(pool.group[rows])] - added
            unique += added + int(subjects.sum() + np.sum(pool.prompt_lens[rows] - prefix[pool.group[rows]]))
        else:
            unique += added + int(np.sum(pool.prompt_lens[rows] - added))
    if spec.system_prompts == "shared":
        unique -= spec.system_prompt_tokens * (used - 1)
    return unique


def mix_report(plan: Plan, pools: dict[str, Pool], spec: WorkloadSpec, cost: CostModel) -> MixReport:
    used = [(i, s) for i, s in enumerate(SOURCES) if plan.counts[s]]
    p = np.concatenate([pools[s].prompt_lens[plan.row[plan.source == i]] for i, s in used])
    d = np.concatenate([plan.output[plan.source == i] for i, _ in used])
    unique = unique_prompt_tokens(plan, pools, spec)
    group = cost.group_cost(p, d, unique)
    notes = [
        f"model/hardware for density: {cost.model.name} on {cost.hardware.name} (tp={cost.hardware.tp})",
        f"API trace {spec.api_trace}: token counts only; prompt ids = a {spec.system_prompt_tokens}-token "
        "per-trace system prompt + random ids",
        f"MMLU: 5-shot prompts, {spec.mmlu_output_tokens} output tokens (answer letter + end-of-text)",
        f"video: output = frames x {plan.tokens_per_frame} tokens/frame, frames drawn from "
        "49/81/129 (CogVideoX/Wan2.1/HunyuanVideo), mean scaled to "
        f"{spec.video_mean_tokens:.0f}; the length is known in advance (expected_output_tokens)",
    ]
    if spec.shares:
        notes.append("shares of requests fixed, not solved: "
                     + ", ".join(f"{name} {share:.2%}" for name, share in spec.shares))
    if spec.system_prompts == "families":
        notes.append(f"video prompts begin with a {spec.system_prompt_tokens}-token video system prompt of their "
                     "own (one prefix subtree)")
    elif spec.system_prompts == "shared":
        notes.append(f"every prompt begins with the same {spec.system_prompt_tokens}-token system prompt (API "
                     "prompts: their trace length after it)")
    return MixReport(plan.counts, group.density, 1.0 - unique / float(p.sum()), int(p.sum()), int(d.sum()),
                     unique, notes=notes)


def load_pools(spec: WorkloadSpec, root: Path) -> dict[str, Pool]:
    """The pools the spec draws from (all three for a solved mix, those with a share for fixed shares)."""

    loaders = {"api": lambda: ws.load_api(root, spec.api_trace), "mmlu": lambda: ws.load_mmlu(root, spec.mmlu_output_tokens),
               "video": lambda: ws.load_video(root)}
    if spec.only:
        names = [spec.only]
    elif spec.shares:
        names = [name for name, share in spec.shares if share > 0]
    else:
        names = list(SOURCES)
    return {name: loaders[name]() for name in names}


def build_workload(spec: WorkloadSpec, path: Path, cost: CostModel, root: Path) -> MixReport:
    """Plan, write and describe one workload file."""
    if spec.only is None and spec.shares is None and (spec.density is None or spec.sharing is None):
        raise ValueError("a mix needs a target density and sharing (or pass only=<source> or shares)")
    pools = spec_pools(spec, load_pools(spec, root))
    plan = plan_requests(spec, pools, cost)
    write_workload(plan, pools, spec, path)
    return mix_report(plan, pools, spec, cost)


def write_workload(plan: Plan, pools: dict[str, Pool], spec: WorkloadSpec, path: Path) -> None:
    """Parquet with WORKLOAD_SCHEMA, written in chunks so 400k-request files fit in memory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, WORKLOAD_SCHEMA) as writer:
        for start in range(0, len(plan.source), CHUNK_ROWS):
            stop = min(start + CHUNK_ROWS, len(plan.source))
            writer.write_table(_chunk_table(plan, pools, spec, start, stop))


def _prompt_ids(plan: Plan, pools: dict[str, Pool], spec: WorkloadSpec, i: int, rng: np.random.Generator,
                system: np.ndarray) -> np.ndarray:
    pool, row = pools[SOURCES[plan.source[i]]], plan.row[i]
    if pool.name != "api":
        return pool.tokens[pool.offsets[row] : pool.offsets[row + 1]]
    p = int(pool.prompt_lens[row])
    s = min(spec.system_prompt_tokens, p - 1)
    return np.concatenate([system[:s], rng.integers(0, VOCAB, size=p - s, dtype=np.int32)])


def _chunk_table(plan: Plan, pools: dict[str, Pool], spec: WorkloadSpec, start: int, stop: int) -> pa.Table:
    rng = np.random.default_rng([spec.seed, start])  # per chunk, so a chunk's ids do not depend on the others
    system = system_prompt(spec.api_trace, spec.system_prompt_tokens)
    idx = range(start, stop)
    prompts = [_prompt_ids(plan, pools, spec, i, rng, system) for i in idx]
    lens = np.array([len(t) for t in prompts], dtype=np.int32)
    offsets = np.zeros(len(prompts) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    names = [SOURCES[s] for s in plan.source[start:stop]]
    pool_rows = [(pools[name], int(r)) for name, r in zip(names, plan.row[start:stop])]
    out = plan.output[start:stop]
    video = np.array([n == "video" for n in names])
    ids = [f"{spec.name}-{i:07d}" for i in idx]
    columns = {
        "custom_id": ids,
        "request_id": ids,
        # every row gives its ids (ingest takes one of text and ids); source_file/source_row name the text
        "endpoint": ["tokens"] * len(names),
        "prompt": [None] * len(names),
        "messages_json": [None] * len(names),
        "prompt_token_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(prompts))),
        "num_prompt_tokens": lens,
        "max_tokens": np.where(names_is(names, "mmlu"), spec.mmlu_output_tokens, np.where(video, out, 2048)),
        "temperature": np.where(names_is(names, "mmlu"), 0.0, 1.0).astype(np.float32),
        "top_p": np.ones(len(names), dtype=np.float32),
        "seed": np.arange(start, stop, dtype=np.int64),
        "stop_json": [None] * len(names),
        "expected_output_tokens": pa.array(np.where(video, out, 0), mask=~video, type=pa.int32()),
        "sim_output_tokens": out.astype(np.int32),
        "metadata_json": [_metadata(n, pool, r, f) for n, (pool, r), f in zip(names, pool_rows, plan.frames[start:stop])],
        "source_file": [pool.source_file[r] for pool, r in pool_rows],
        "source_row": np.array([pool.source_row[r] for pool, r in pool_rows], dtype=np.int64),
    }
    return pa.table({k: pa.array(v, type=WORKLOAD_SCHEMA.field(k).type) if not isinstance(v, pa.Array) else v
                     for k, v in columns.items()}, schema=WORKLOAD_SCHEMA)


def names_is(names: list[str], source: str) -> np.ndarray:
    return np.array([n == source for n in names])


def _metadata(name: str, pool: Pool, row: int, frames: int) -> str:
    meta: dict[str, object] = {"source": name}
    if name == "mmlu":
        meta["subject"] = pool.source_file[row].split("/")[-1].removesuffix("_test.csv")
    if name == "video":
        meta["frames"] = int(frames)
    return json.dumps(meta)
