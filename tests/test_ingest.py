"""Ingestion: every bad record is rejected with a reason naming its row; nothing is lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blendserve import files
from blendserve.ingest import ingest
from blendserve.ingest.normalize import Limits

GOOD = {"custom_id": "ok-1", "prompt": "What is 2 + 2?", "max_tokens": 8}
CHAT = {"custom_id": "ok-2", "messages": [{"role": "user", "content": "Hi"}]}
BATCH = {"custom_id": "ok-3", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}}

# (case, JSONL line, expected words in the reason)
BAD_LINES = [
    ("malformed json", '{"custom_id": "x", "prompt": "hi"', "malformed JSON"),
    ("not an object", '["custom_id", "x"]', "JSON object"),
    ("missing id", json.dumps({"prompt": "hi"}), "missing custom_id"),
    ("empty id", json.dumps({"custom_id": " ", "prompt": "hi"}), "missing custom_id"),
    ("id wrong type", json.dumps({"custom_id": ["a"], "prompt": "hi"}), "custom_id must be a string"),
    ("no prompt", json.dumps({"custom_id": "x"}), "exactly one of prompt, messages"),
    ("empty prompt", json.dumps({"custom_id": "x", "prompt": "   "}), "prompt is empty"),
    ("prompt wrong type", json.dumps({"custom_id": "x", "prompt": 42}), "prompt must be a string"),
    ("two prompt kinds", json.dumps({"custom_id": "x", "prompt": "a", "messages": [{"role": "user", "content": "b"}]}),
     "exactly one of"),
    ("empty messages", json.dumps({"custom_id": "x", "messages": []}), "non-empty list"),
    ("bad role", json.dumps({"custom_id": "x", "messages": [{"role": "robot", "content": "b"}]}), "messages[0].role"),
    ("empty content", json.dumps({"custom_id": "x", "messages": [{"role": "user", "content": ""}]}), "messages[0].content"),
    ("no user message", json.dumps({"custom_id": "x", "messages": [{"role": "system", "content": "s"}]}), "no user message"),
    ("image part", json.dumps({"custom_id": "x", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
     "non-text parts"),
    ("token ids out of vocab", json.dumps({"custom_id": "x", "prompt_token_ids": [1, 99999999]}), "prompt_token_ids[1]"),
    ("token ids not ints", json.dumps({"custom_id": "x", "prompt_token_ids": ["a"]}), "prompt_token_ids[0]"),
    ("max_tokens string", json.dumps({"custom_id": "x", "prompt": "a", "max_tokens": "ten"}), "max_tokens must be an integer"),
    ("max_tokens zero", json.dumps({"custom_id": "x", "prompt": "a", "max_tokens": 0}), "max_tokens = 0 is out of range"),
    ("max_tokens bool", json.dumps({"custom_id": "x", "prompt": "a", "max_tokens": True}), "max_tokens must be an integer"),
    ("temperature high", json.dumps({"custom_id": "x", "prompt": "a", "temperature": 5}), "temperature = 5"),
    ("top_p zero", json.dumps({"custom_id": "x", "prompt": "a", "top_p": 0}), "top_p = 0"),
    ("negative seed", json.dumps({"custom_id": "x", "prompt": "a", "seed": -1}), "seed = -1"),
    ("bad stop", json.dumps({"custom_id": "x", "prompt": "a", "stop": [1]}), "stop must be"),
    ("bad endpoint", json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/embeddings", "body": {"input": "a"}}),
     "unsupported endpoint"),
    ("bad method", json.dumps({"custom_id": "x", "method": "GET", "url": "/v1/completions", "body": {"prompt": "a"}}),
     "unsupported method"),
    ("chat url with prompt", json.dumps({"custom_id": "x", "url": "/v1/chat/completions", "body": {"prompt": "a"}}),
     "needs messages"),
    ("n > 1", json.dumps({"custom_id": "x", "url": "/v1/completions", "body": {"prompt": "a", "n": 2}}), "n must be 1"),
    ("body not object", json.dumps({"custom_id": "x", "url": "/v1/completions", "body": "a"}), "body must be"),
    ("prompt too long", json.dumps({"custom_id": "x", "prompt": "word " * 3000}), "the model's context is 2048"),
    ("negative expected length", json.dumps({"custom_id": "x", "prompt": "a", "expected_output_tokens": -3}),
     "expected_output_tokens = -3"),
]


def run_ingest(out: Path | str, tokenizer, pattern: str):
    """Ingest into ``out``, a local folder or an object-storage URL."""
    limits = Limits(default_max_tokens=16, max_model_len=2048, vocab_size=tokenizer.vocab_size)
    report = ingest(pattern, f"{out}/requests.parquet", f"{out}/rejects.parquet", tokenizer, limits)
    return report, *(files.read_parquet([f"{out}/{name}.parquet"]) for name in ("requests", "rejects"))


@pytest.mark.parametrize("case,line,reason", BAD_LINES, ids=[c[0] for c in BAD_LINES])
def test_bad_record_is_rejected_with_its_reason_and_row(tmp_path, tokenizer, case, line, reason):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join([json.dumps(GOOD), line, json.dumps(CHAT)]) + "\n")
    report, accepted, rejects = run_ingest(tmp_path, tokenizer, str(path))
    assert report.read == 3 and report.accepted == 2 and report.rejected == 1
    row = rejects.to_pylist()[0]
    assert reason in row["reason"], row["reason"]
    assert row["source_row"] == 2 and row["source_file"] == str(path)
    assert sorted(accepted.column("request_id").to_pylist()) == ["ok-1", "ok-2"]


def test_invalid_utf8_line_is_rejected_and_the_rest_goes_on(tmp_path, tokenizer):
    path = tmp_path / "in.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b'\n{"custom_id": "bad", "prompt": "\xff\xfe"}\n' + json.dumps(CHAT).encode())
    report, accepted, rejects = run_ingest(tmp_path, tokenizer, str(path))
    assert (report.accepted, report.rejected) == (2, 1)
    assert "not valid UTF-8" in rejects.column("reason")[0].as_py()


def test_duplicate_ids_across_files_keep_the_first(tmp_path, tokenizer):
    (tmp_path / "a.jsonl").write_text(json.dumps(GOOD) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({**GOOD, "prompt": "other"}) + "\n" + json.dumps(BATCH) + "\n")
    report, accepted, rejects = run_ingest(tmp_path, tokenizer, str(tmp_path / "*.jsonl"))
    assert (report.files, report.read, report.accepted, report.rejected) == (2, 3, 2, 1)
    assert "duplicate custom_id 'ok-1'" in rejects.column("reason")[0].as_py()
    assert rejects.column("source_file")[0].as_py().endswith("b.jsonl")


@pytest.mark.parametrize("where", ["local", "object storage"])
def test_csv_and_parquet_inputs(tmp_path, tokenizer, bucket, where):
    import pyarrow as pa

    root = str(tmp_path) if where == "local" else bucket
    files.atomic_write_bytes(
        b"custom_id,prompt,max_tokens,temperature\nc1,Hello there,5,0.5\nc2,,5,0\nc3,Hi,lots,0\n", f"{root}/in.csv")
    files.atomic_write_parquet(pa.table({"custom_id": ["p1"], "prompt": ["Name a colour."], "max_tokens": [3]}),
                                 f"{root}/in.parquet")
    report, accepted, rejects = run_ingest(root, tokenizer, f"{root}/in.*")
    assert (report.read, report.accepted, report.rejected) == (4, 2, 2)
    assert sorted(accepted.column("source_file").to_pylist()) == [f"{root}/in.csv", f"{root}/in.parquet"]
    rows = {r["request_id"]: r for r in accepted.to_pylist()}
    assert rows["c1"]["max_tokens"] == 5 and rows["c1"]["temperature"] == pytest.approx(0.5)
    assert rows["p1"]["endpoint"] == "completion"
    reasons = sorted(rejects.column("reason").to_pylist())
    assert "column 'max_tokens' has 'lots'" in reasons[0] and "exactly one of" in reasons[1]


def test_chat_template_and_openai_batch_shapes(tmp_path, tokenizer):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(CHAT) + "\n" + json.dumps(BATCH) + "\n")
    _, accepted, _ = run_ingest(tmp_path, tokenizer, str(path))
    rows = {r["request_id"]: r for r in accepted.to_pylist()}
    assert rows["ok-3"]["endpoint"] == "chat" and rows["ok-3"]["max_tokens"] == 4
    assert rows["ok-2"]["max_tokens"] == 16  # the default
    text = tokenizer.tokenizer.decode(rows["ok-2"]["prompt_token_ids"])
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    assert rows["ok-2"]["num_prompt_tokens"] == len(rows["ok-2"]["prompt_token_ids"])


def test_empty_file_and_missing_input(tmp_path, tokenizer):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    report, accepted, rejects = run_ingest(tmp_path, tokenizer, str(tmp_path / "empty.jsonl"))
    assert (report.read, accepted.num_rows, rejects.num_rows) == (0, 0, 0)
    with pytest.raises(FileNotFoundError, match="no input files match"):
        run_ingest(tmp_path, tokenizer, str(tmp_path / "nothing-*.jsonl"))


def test_long_raw_record_is_truncated_in_rejects(tmp_path, tokenizer):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"custom_id": "x", "prompt": "", "pad": "y" * 50_000}) + "\n")
    _, _, rejects = run_ingest(tmp_path, tokenizer, str(path))
    assert len(rejects.column("raw")[0].as_py()) < 2100


def test_plain_parquet_rows_take_the_columnar_path_with_the_row_path_results(tmp_path, tokenizer, monkeypatch):
    """Plain token-id rows skip normalize; the files must be what normalize and the row sink write."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    import blendserve.ingest as ingest_module

    rows = [
        {"custom_id": "a", "prompt_token_ids": [1, 2, 3], "max_tokens": 5, "temperature": 0.5, "seed": 7},
        {"custom_id": "b", "prompt_token_ids": [4] * 3000, "max_tokens": 5},  # too long
        {"custom_id": "g", "prompt_token_ids": [5, 6], "sim_output_tokens": 9},
        {"custom_id": "a", "prompt_token_ids": [7]},  # duplicate
        {"custom_id": "c", "prompt_token_ids": [99999999]},  # out of the vocabulary: the row path words it
        {"custom_id": "d", "prompt_token_ids": [8, 9], "max_tokens": 99999},  # out of range: the row path
        {"custom_id": "e", "prompt_token_ids": [10], "top_p": 0.0},  # top_p = 0: the row path
        {"custom_id": " ", "prompt_token_ids": [11]},  # blank id: the row path
        {"custom_id": "f", "prompt_token_ids": [12, 13], "max_tokens": 2047},  # capped to the context
    ]
    columns = list(dict.fromkeys(k for r in rows for k in r))  # from_pylist would take the first row's keys
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in columns} for r in rows]), tmp_path / "in.parquet")
    limits = Limits(default_max_tokens=16, max_model_len=2048, vocab_size=tokenizer.vocab_size)
    plain = ingest_module.plain_rows(pq.read_table(tmp_path / "in.parquet").to_batches()[0], limits)
    assert plain.tolist() == [True, True, True, True, False, False, False, False, True]
    fast = run_ingest(tmp_path / "fast", tokenizer, str(tmp_path / "in.parquet"))
    monkeypatch.setattr(ingest_module, "plain_rows", lambda batch, limits: np.zeros(batch.num_rows, dtype=bool))
    slow = run_ingest(tmp_path / "slow", tokenizer, str(tmp_path / "in.parquet"))
    assert (fast[0].read, fast[0].accepted, fast[0].rejected) == (9, 3, 6)
    assert fast[1].equals(slow[1])
    assert fast[2].sort_by("source_row").equals(slow[2].sort_by("source_row"))
    assert fast[1].column("request_id").to_pylist() == ["a", "g", "f"]
    assert fast[1].column("max_tokens").to_pylist() == [5, 16, 2046]
