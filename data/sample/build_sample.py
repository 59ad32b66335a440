"""Rebuild the bundled sample dataset (requests.jsonl) from the shared workload data.

Usage: python data/sample/build_sample.py [--data ../shared/data]

Mixes the two kinds of request BlendServe blends:
- compute-heavy: MMLU 5-shot prompts (long, sharing a per-subject few-shot
  prefix) with 1-token answers, in our plain JSONL fields;
- memory-heavy: VBench text-to-video prompts to be extended into detailed
  shot descriptions (short prompts sharing one system prompt, long answers),
  in the OpenAI batch format.
Deterministic: same data, same file.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUBJECTS = ["anatomy", "astronomy", "college_biology", "computer_security",
            "high_school_geography", "marketing", "nutrition", "world_religions"]
QUESTIONS_PER_SUBJECT = 20
REWRITES, SCRIPTS = 64, 32
LETTERS = "ABCD"
REWRITE_SYSTEM = (
    "You are a prompt engineer for a text-to-video model. Rewrite the user's short video idea into one "
    "vivid paragraph of about 120 words: describe the subject, setting, lighting, camera angle and motion. "
    "Do not add a title or any commentary."
)
SCRIPT_SYSTEM = (
    "You are a storyboard artist. Turn the user's video idea into a numbered shot list of six shots; for "
    "each shot give the framing, the action and the sound. Be concrete and visual."
)


def mmlu_rows(data: Path) -> list[dict]:
    rows = []
    for subject in SUBJECTS:
        dev = _csv(data / "mmlu" / "dev" / f"{subject}_dev.csv")[:5]
        prefix = f"The following are multiple choice questions (with answers) about  {subject.replace('_', ' ')}.\n\n"
        prefix += "".join(_question(r) + f" {LETTERS[int(r['answer'])]}\n\n" for r in dev)
        for i, r in enumerate(_csv(data / "mmlu" / "test" / f"{subject}_test.csv")[:QUESTIONS_PER_SUBJECT]):
            rows.append({
                "custom_id": f"mmlu-{subject}-{i:03d}",
                "prompt": prefix + _question(r),
                "max_tokens": 1,
                "temperature": 0.0,
                "metadata": {"task": "mmlu", "subject": subject, "answer": LETTERS[int(r["answer"])]},
            })
    return rows


def video_rows(data: Path) -> list[dict]:
    lines = (data / "vbench_t2v_prompts" / "prompts__all_dimension.txt").read_text(encoding="utf-8").splitlines()
    ideas = [line.strip() for line in lines if line.strip()][:: 7][: REWRITES + SCRIPTS]
    rows = []
    for i, idea in enumerate(ideas):
        task, system, max_tokens = ("rewrite", REWRITE_SYSTEM, 192) if i < REWRITES else ("shotlist", SCRIPT_SYSTEM, 384)
        rows.append({
            "custom_id": f"video-{task}-{i:03d}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "smollm2-135m-instruct",
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": idea}],
                "max_tokens": max_tokens,
                "temperature": 0.0,
            },
            "metadata": {"task": f"video-{task}", "source_line": lines.index(idea) + 1},
        })
    return rows


def _question(row: dict) -> str:
    text = row["question"] + "".join(f"\n{LETTERS[i]}. {row[f'choice{i}']}" for i in range(4))
    return text + "\nAnswer:"


def _csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def interleave(a: list[dict], b: list[dict]) -> list[dict]:
    """Input order alternates kinds in runs, as a user's file might: FCFS neither groups nor blends on purpose."""
    out, step = [], max(1, len(a) // max(1, len(b)))
    ai = bi = 0
    while ai < len(a) or bi < len(b):
        out.extend(a[ai : ai + step])
        ai += step
        if bi < len(b):
            out.append(b[bi])
            bi += 1
    return out


SMALL_ROWS = 24  # requests-small.jsonl: what the README's Airflow trigger and the live tests run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=HERE.parents[2] / "shared" / "data")
    parser.add_argument("--out", type=Path, default=HERE / "requests.jsonl")
    args = parser.parse_args()
    rows = interleave(mmlu_rows(args.data), video_rows(args.data))
    with open(args.out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    small = args.out.with_name(args.out.stem + "-small.jsonl")  # a quick first run: the first SMALL_ROWS rows
    small.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows[:SMALL_ROWS]), encoding="utf-8")
    print(f"wrote {len(rows)} requests to {args.out}, the first {SMALL_ROWS} to {small}")


if __name__ == "__main__":
    main()
