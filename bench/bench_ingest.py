"""Ingestion memory: peak RSS stays flat as the input file grows.

Writes JSONL files of the given sizes (chat requests with ~1 KB prompts, 1% bad
rows), ingests each in a fresh process and prints rows, seconds and peak
memory side by side. Usage: python bench/bench_ingest.py [--sizes-mb 50 200 1024]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = "the of and to in is was for on that with as by at from his it an were are which this be".split()


def write_file(path: Path, size_mb: int) -> int:
    rows, written, target = 0, 0, size_mb * 2**20
    with open(path, "w") as f:
        while written < target:
            words = " ".join(WORDS[(rows * 7 + k) % len(WORDS)] for k in range(180))
            record = ({"custom_id": f"r{rows}", "messages": [{"role": "user", "content": words}], "max_tokens": 8}
                      if rows % 100 else {"custom_id": f"r{rows}", "prompt": ""})  # 1% rejects
            line = json.dumps(record) + "\n"
            f.write(line)
            written += len(line)
            rows += 1
    return rows


def ingest_once(path: str, out: str) -> None:
    from blendserve.ingest import ingest
    from blendserve.ingest.normalize import Limits
    from blendserve.ingest.tokenize import PromptTokenizer
    from blendserve.model_prep import ensure_model_dir

    tokenizer = PromptTokenizer(ensure_model_dir())
    started = time.monotonic()
    report = ingest(path, Path(out) / "requests.parquet", Path(out) / "rejects.parquet", tokenizer,
                    Limits(256, 2048, tokenizer.vocab_size))
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"read": report.read, "accepted": report.accepted, "rejected": report.rejected,
                      "seconds": time.monotonic() - started, "peak_rss_mb": peak_mb}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[50, 200, 1024])
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return ingest_once(*args.one)
    print(f"{'file MB':>8} {'rows':>10} {'rejected':>9} {'seconds':>8} {'peak RSS MB':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes_mb:
            path = Path(tmp) / f"in-{size}.jsonl"
            write_file(path, size)
            out = subprocess.run([sys.executable, __file__, "--one", str(path), tmp], check=True,
                                 capture_output=True, text=True).stdout.strip().splitlines()[-1]
            r = json.loads(out)
            print(f"{size:>8} {r['read']:>10,} {r['rejected']:>9,} {r['seconds']:>8.1f} {r['peak_rss_mb']:>12.0f}")
            path.unlink()


if __name__ == "__main__":
    main()
