"""The OpenAI batch files bench_peer.py runs every system on (``/v1/chat/completions`` lines, greedy).

Real text from ../shared/data, every batch shuffled into one arrival order:

- ``mixed``: MMLU questions under one shared 5-shot prefix (answers of 2 tokens at most), VBench prompt
  rewrites (the shared system prompt of bench_warmup, a few hundred output tokens) and short labelling
  of ShareGPT4Video captions (one word out of a fixed list);
- ``locality``: MMLU under many per-subject 5-shot prefixes, more distinct prefix tokens than the KV holds;
- ``duplicates``: short requests (MMLU, labelling), each repeated several times under its own custom_id;
- ``large``: the quick mixed batch ``LARGE_FACTOR`` times over (``LARGE``: 1,600 requests, every label
  task and caption pair once), so the engine start and the pipeline's fixed costs amortise. Ten times the
  full mixed batch would take 25-35 minutes a system a round on 2 cores.

``vllm run-batch`` (0.32) serves only ``/v1/chat/completions`` among the generation endpoints, so every
line is a chat request; both systems render the model's chat template and tokenize the text the same way.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from bench_warmup import SYSTEM as REWRITE_SYSTEM
from blendserve.costmodel.model_spec import DTYPE_BYTES
from blendserve.ingest.tokenize import PromptTokenizer
from blendserve.model_prep import ensure_model_dir
from blendserve.workload_sources import data_root

MODEL_NAME = "smollm2-135m-instruct"  # run-batch's --served-model-name, each body's "model"
MAX_PROMPT_TOKENS = 1800  # under the 2,048 context with room for the answer: no request is refused by either
MIXED_PREFIX_SUBJECT = "miscellaneous"  # the one 5-shot prefix of the mixed batch (questions from every subject)
LARGE_FACTOR = 10
LABELS = {  # labelling tasks over every caption: question, the allowed answers
    "setting": ("Is the video set indoors or outdoors?", "indoors, outdoors"),
    "people": ("How many people appear in the video?", "none, one, two, many"),
    "genre": ("Which genre fits the video best?", "sports, games, cooking, nature, music, vlog, tutorial, other"),
    "mood": ("What is the overall mood of the video?", "calm, joyful, tense, sad, neutral"),
}
CAPTIONS = 100  # captions in sharegpt4video_100.json
LABEL_SYSTEM = "You label videos from their captions. Reply with exactly one word from the list given, nothing else."
Row = dict  # one OpenAI batch line


@dataclass(frozen=True)
class Sizes:
    """Request counts of each batch."""

    mmlu: int  # mixed: MMLU questions under the one shared prefix
    rewrites: int  # mixed: VBench prompt rewrites (long answers)
    rewrite_tokens: int  # their max_tokens
    labels: int  # mixed: caption labelling requests
    locality: int  # locality: MMLU questions
    subjects: int  # locality: distinct per-subject prefixes
    distinct: int  # duplicates: distinct requests
    copies: int  # duplicates: copies of each

    def scaled(self, factor: float) -> "Sizes":
        """Every count times ``factor`` (at least 2 each), the output length kept."""
        n = lambda k: max(2, round(k * factor))  # noqa: E731
        return Sizes(n(self.mmlu), n(self.rewrites), self.rewrite_tokens, n(self.labels), n(self.locality),
                     self.subjects, n(self.distinct), self.copies)


FULL = Sizes(mmlu=240, rewrites=80, rewrite_tokens=256, labels=120, locality=400, subjects=32, distinct=150, copies=3)
QUICK = Sizes(mmlu=96, rewrites=24, rewrite_tokens=128, labels=40, locality=144, subjects=24, distinct=48, copies=3)
LARGE = QUICK.scaled(LARGE_FACTOR)  # the large batch's sizes (only its mixed counts are used)


def chat_row(custom_id: str, messages: list[dict], max_tokens: int) -> Row:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL_NAME, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}}


def prompt_text(row: Row) -> str:
    """What sorting by prompt text sorts on: the messages' contents, in order."""
    return "\n".join(m["content"] for m in row["body"]["messages"])


def fewshot() -> ModuleType:
    """The shared data's own 5-shot builder (mmlu/build_fewshot_prompts.py), as bench_engines loads it."""
    spec = importlib.util.spec_from_file_location("fewshot", data_root() / "mmlu" / "build_fewshot_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mmlu_one_prefix(n: int, rng: np.random.Generator, tag: str = "mmlu") -> list[Row]:
    """``n`` questions from every subject's test set under one subject's 5-shot prefix."""
    fs, root = fewshot(), data_root() / "mmlu"
    dev = fs.load(root / "dev" / f"{MIXED_PREFIX_SUBJECT}_dev.csv")[:5]
    prefix = ("The following are multiple choice questions (with answers) about "
              f"{fs.fmt_subject(MIXED_PREFIX_SUBJECT)}.\n\n" + "".join(fs.fmt_example(r) for r in dev))
    questions = [(p.name[: -len("_test.csv")], i, r) for p in sorted((root / "test").glob("*_test.csv"))
                 for i, r in enumerate(fs.load(p))]
    picked = [questions[k] for k in rng.choice(len(questions), size=min(n, len(questions)), replace=False)]
    return [chat_row(f"{tag}-{s}-{i}", [{"role": "user", "content": prefix + fs.fmt_example(r, False)}], 2)
            for s, i, r in picked]


def mmlu_per_subject(n: int, subjects: int, rng: np.random.Generator) -> list[Row]:
    """``n`` questions over ``subjects`` subjects, each under its own subject's 5-shot prefix."""
    fs = fewshot()
    every = sorted(p.name[: -len("_test.csv")] for p in (data_root() / "mmlu" / "test").glob("*_test.csv"))
    chosen = {every[k] for k in rng.choice(len(every), size=min(subjects, len(every)), replace=False)}
    per_subject = -(-n // len(chosen))
    rows = [r for r in fs.iter_prompts(5) if r["subject"] in chosen and r["idx"] < per_subject]
    return [chat_row(f"mmlu-{r['subject']}-{r['idx']}", [{"role": "user", "content": r["prompt"]}], 2)
            for r in rows][:n]


def rewrites(n: int, max_tokens: int, rng: np.random.Generator, tag: str = "rewrite") -> list[Row]:
    """VBench prompt rewrites: the shared system prompt, the short prompt as the user turn."""
    root = data_root() / "vbench_t2v_prompts"
    lines = [x.strip() for f in ("prompts__all_dimension.txt", "prompts__all_category.txt")
             for x in (root / f).read_text().splitlines() if x.strip()]
    lines = list(dict.fromkeys(lines))  # a prompt in both suites once
    picked = rng.choice(len(lines), size=min(n, len(lines)), replace=False)
    return [chat_row(f"{tag}-{k}", [{"role": "system", "content": REWRITE_SYSTEM},
                                    {"role": "user", "content": lines[i]}], max_tokens) for k, i in enumerate(picked)]


def labels(n: int, rng: np.random.Generator, tag: str = "label") -> list[Row]:
    """Caption labelling: one of LABELS' questions about one ShareGPT4Video caption, a one-word answer
    (at most the distinct pairs, ``len(LABELS) * CAPTIONS``)."""
    captions = json.loads((data_root() / "sharegpt4video_captions" / "sharegpt4video_100.json").read_text())["caption"]
    tasks = [(name, c) for name in LABELS for c in range(len(captions))]
    picked = [tasks[k] for k in rng.choice(len(tasks), size=min(n, len(tasks)), replace=False)]
    rows = []
    for k, (name, c) in enumerate(picked):
        question, allowed = LABELS[name]
        user = f"Caption: {captions[c]}\n\n{question} Answer with one of: {allowed}."
        rows.append(chat_row(f"{tag}-{name}-{c}-{k}", [{"role": "system", "content": LABEL_SYSTEM},
                                                       {"role": "user", "content": user}], 4))
    return rows


def mixed(sizes: Sizes, rng: np.random.Generator) -> list[Row]:
    """The three kinds; labelling past the distinct (task, caption) pairs becomes MMLU, so nothing repeats."""
    n_labels = min(sizes.labels, len(LABELS) * CAPTIONS)
    n_mmlu = sizes.mmlu + sizes.labels - n_labels
    return mmlu_one_prefix(n_mmlu, rng) + rewrites(sizes.rewrites, sizes.rewrite_tokens, rng) + labels(n_labels, rng)


def duplicates(sizes: Sizes, rng: np.random.Generator) -> list[Row]:
    """Short requests, each ``copies`` times under ids of its own: identical greedy twins."""
    half = sizes.distinct // 2
    distinct = mmlu_one_prefix(half, rng) + labels(sizes.distinct - half, rng)
    return [{**row, "custom_id": f"{row['custom_id']}-copy{c}"} for row in distinct for c in range(sizes.copies)]


def build(name: str, sizes: Sizes, seed: int) -> list[Row]:
    """Batch ``name`` at ``sizes`` (the large batch: ``LARGE``'s), its rows over the prompt limit dropped,
    shuffled into one arrival order."""
    rng = np.random.default_rng(seed)
    rows = {"mixed": lambda: mixed(sizes, rng), "large": lambda: mixed(sizes, rng),
            "locality": lambda: mmlu_per_subject(sizes.locality, sizes.subjects, rng),
            "duplicates": lambda: duplicates(sizes, rng)}[name]()
    lengths = prompt_lengths(rows)
    rows = [r for r, n in zip(rows, lengths) if n <= MAX_PROMPT_TOKENS]
    return [rows[k] for k in rng.permutation(len(rows))]


def write(rows: list[Row], path: Path, by_prompt: bool = False) -> Path:
    """The batch file; ``by_prompt``: its lines sorted by prompt text (what a user can do for locality)."""
    ordered = sorted(rows, key=prompt_text) if by_prompt else rows
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ordered), encoding="utf-8")
    return path


def prompt_ids(rows: list[Row]) -> list[list[int]]:
    """Each row's prompt tokens with the chat template applied, as blendserve's ingest and vLLM tokenize them."""
    return PromptTokenizer(ensure_model_dir()).encode_chats([r["body"]["messages"] for r in rows])


def prompt_lengths(rows: list[Row]) -> list[int]:
    return [len(p) for p in prompt_ids(rows)]


def distinct_prefix_tokens(rows: list[Row]) -> int:
    """Tokens of the distinct 5-shot prefixes (MMLU rows, grouped by their prompt's first line, which names
    the prefix's subject): what the KV cache must hold at once for every question to hit, whatever the order."""
    by_prefix: dict[str, list[list[int]]] = {}
    mmlu = [r for r in rows if r["custom_id"].startswith("mmlu-")]
    for row, ids in zip(mmlu, prompt_ids(mmlu)):
        by_prefix.setdefault(row["body"]["messages"][-1]["content"].split("\n", 1)[0], []).append(ids)
    return sum(len(os.path.commonprefix(p)) for p in by_prefix.values() if len(p) > 1)


def kv_capacity_tokens(kv_gb: float, dtype: str) -> int:
    """Tokens a KV cache of ``kv_gb`` GiB holds for the model (keys and values of every layer)."""
    config = json.loads((ensure_model_dir() / "config.json").read_text())
    heads = config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
    width = DTYPE_BYTES[dtype]
    return int(kv_gb * (1 << 30)) // (2 * config["num_hidden_layers"] * heads * head_dim * width)
