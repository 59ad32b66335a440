"""Inputs a hostile (or unlucky) user gives: each must end in a reject naming the row and the reason,
or a one-line error, never a crash, a lost row or a run left ``running``. Future cases join the tables.

``INPUTS``: files run through ingest and through the whole pipeline (simulator engine): every accepted
request is answered exactly once, every other row is in ``rejects``, read = accepted + rejected.
``PATHS``: settings that must not reach outside the data roots. The CLI cases follow.
"""

from __future__ import annotations

import decimal
import io
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from blendserve import files
from blendserve.config import RunConfig
from blendserve.data_roots import PathOutsideRoots, resolve_in_roots
from blendserve.ingest import ingest
from blendserve.ingest.normalize import Limits
from blendserve.pipeline import database
from blendserve.pipeline.steps import run_pipeline
from blendserve.report.data import load_run
from conftest import jsonl, run_cli, subprocess_env

GOOD = json.dumps({"custom_id": "good", "prompt": "Name a colour.", "max_tokens": 4}) + "\n"


def parquet(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


@dataclass(frozen=True)
class Case:
    name: str
    file: str  # its suffix picks the reader
    content: bytes | Callable[[], bytes]
    accepted: list[str]  # request ids that must be answered
    reasons: list[str] = field(default_factory=list)  # words in each reject's reason, in row order

    def write(self, folder: Path) -> Path:
        path = folder / self.file
        path.write_bytes(self.content() if callable(self.content) else self.content)
        return path


def decimal_and_timestamp_columns() -> bytes:
    when = datetime(2026, 11, 30, 12, 0)
    return parquet(pa.table({
        "custom_id": ["a", "b"], "prompt": ["hi", "ho"],
        "seed": pa.array([None, decimal.Decimal("3.50")], pa.decimal128(5, 2)),
        "metadata": pa.array([{"at": when, "price": decimal.Decimal("1.25")}] * 2,
                             pa.struct([("at", pa.timestamp("us")), ("price", pa.decimal128(5, 2))])),
    }))


INPUTS = [
    Case("empty jsonl", "in.jsonl", b"", []),
    Case("blank lines only", "in.jsonl", b"\n \n", []),
    Case("empty csv", "in.csv", b"", []),
    Case("header-only csv", "in.csv", b"custom_id,prompt\n", []),
    Case("0-row parquet", "in.parquet",
         lambda: parquet(pa.table({"custom_id": pa.array([], pa.string()), "prompt": pa.array([], pa.string())})), []),
    Case("all rows bad", "in.jsonl", jsonl({"prompt": "no id"}, "{oops\n"), [], ["missing custom_id", "malformed JSON"]),
    Case("lone surrogate in a prompt", "in.jsonl", b'{"custom_id": "s", "prompt": "a\\ud800b"}\n' + GOOD.encode(),
         ["good"], ["prompt has a lone surrogate"]),
    Case("lone surrogate in a message", "in.jsonl",
         b'{"custom_id": "s", "messages": [{"role": "user", "content": "\\udfff"}]}\n' + GOOD.encode(),
         ["good"], ["messages[0].content has a lone surrogate"]),
    Case("lone surrogate in metadata", "in.jsonl", b'{"custom_id": "s", "prompt": "x", "metadata": "\\ud800"}\n',
         [], ["metadata has a lone surrogate"]),
    Case("5,000-digit integer", "in.jsonl", b'{"custom_id": "n", "prompt": "x", "seed": ' + b"9" * 5000 + b"}\n"
         + GOOD.encode(), ["good"], ["4300 digits"]),
    Case("NaN temperature", "in.jsonl", b'{"custom_id": "x", "prompt": "y", "temperature": NaN}\n', [],
         ["temperature = NaN"]),
    Case("integer beyond any float", "in.jsonl", jsonl({"custom_id": "t", "prompt": "x", "temperature": 10**400}),
         [], ["temperature = "]),
    Case("metadata nested 100k deep", "in.jsonl",
         b'{"custom_id": "d", "prompt": "x", "metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n" + GOOD.encode(),
         ["good"], ["nested too deeply"]),
    Case("unhashable role and url", "in.jsonl",
         jsonl({"custom_id": "r", "messages": [{"role": ["user"], "content": "x"}]},
               {"custom_id": "u", "url": ["/v1/completions"], "body": {"prompt": "x"}}),
         [], ["messages[0].role", "unsupported endpoint"]),
    Case("csv field over 131,072 characters", "in.csv",
         b"custom_id,prompt,note\nlong,hi," + b"x" * 200_000 + b"\nshort,ho,\n", ["long", "short"]),
    Case("unclosed quote in csv", "in.csv", b'custom_id,prompt\na,hi\nb,"oops\nc,hi\nd,hi\ne,hi\n',
         ["a", "c", "d", "e"], ["unclosed quote starting on line 3"]),
    Case("quoted newlines still work", "in.csv", b'custom_id,prompt\na,"two\nlines"\nb,hi\n', ["a", "b"]),
    Case("stray quote inside a csv cell", "in.csv", b'custom_id,prompt\na,"hi"x\nb,ok\n', ["b"],
         ["malformed CSV on line 2"]),
    Case("old Mac line endings", "in.csv", b"custom_id,prompt\ra,hi\rb,ok\r", ["a", "b"]),
    Case("invalid utf-8 in one csv row", "in.csv", b"custom_id,prompt\na,hi\nb,\xff\xfe\nc,ho\n",
         ["a", "c"], ["(line 3) is not valid UTF-8"]),
    Case("bom at the start of a csv", "in.csv", b"\xef\xbb\xbfcustom_id,prompt\na,hi\n", ["a"]),
    Case("bom at the start of a jsonl", "in.jsonl", b"\xef\xbb\xbf" + GOOD.encode(), ["good"]),
    Case("too-long row then a valid one with its id", "in.jsonl",
         jsonl({"custom_id": "x", "prompt": "word " * 3000}, {"custom_id": "x", "prompt": "short"}),
         ["x"], ["the model's context is 2048"]),
    Case("duplicate id after a valid one", "in.jsonl", jsonl({"custom_id": "x", "prompt": "a"},
                                                             {"custom_id": "x", "prompt": "b"}),
         ["x"], ["duplicate custom_id 'x'"]),
    Case("decimal and timestamp parquet columns", "in.parquet", decimal_and_timestamp_columns,
         ["a"], ['seed must be an integer, got "3.50"']),
    Case("custom_id holding NUL", "in.jsonl", jsonl({"custom_id": "a\0", "prompt": "x"}, {"custom_id": "a", "prompt": "y"},
                                                    {"custom_id": "\0b", "prompt": "z"}), ["a\0", "a", "\0b"]),
    Case("corrupt parquet", "in.parquet", b"PAR1 this is not parquet PAR1", [], ["Parquet: the file cannot be read"]),
]


def check_ingest(case: Case, folder: Path, tokenizer) -> None:
    path = case.write(folder)
    limits = Limits(default_max_tokens=4, max_model_len=2048, vocab_size=tokenizer.vocab_size)
    report = ingest(str(path), folder / "requests.parquet", folder / "rejects.parquet", tokenizer, limits)
    accepted = files.read_parquet([folder / "requests.parquet"]).column("request_id").to_pylist()
    rejects = files.read_parquet([folder / "rejects.parquet"]).to_pylist()
    assert sorted(accepted) == sorted(case.accepted)
    assert len(rejects) == len(case.reasons) and report.read == len(accepted) + len(rejects)
    for reject, words in zip(sorted(rejects, key=lambda r: r["source_row"]), case.reasons):
        assert words in reject["reason"], reject
        assert reject["source_file"] == str(path)


@pytest.mark.parametrize("case", INPUTS, ids=[c.name for c in INPUTS])
def test_ingest_rejects_each_bad_row_and_keeps_the_rest(case: Case, tmp_path: Path, tokenizer):
    check_ingest(case, tmp_path, tokenizer)


@pytest.mark.parametrize("case", [c for c in INPUTS if c.name in (
    "empty jsonl", "header-only csv", "0-row parquet", "all rows bad", "custom_id holding NUL", "corrupt parquet",
    "lone surrogate in a prompt")], ids=lambda c: c.name)
def test_the_whole_run_finishes_with_one_output_per_accepted_request(case: Case, tmp_path: Path, make_config):
    """Nothing accepted is a finished run with no outputs (ingest logs a warning), not a crash."""
    config = make_config(input=str(case.write(tmp_path)), engine="simulator", explain=False, sample_rate=0)
    summary = run_pipeline(config)
    assert (summary["requests"], summary["rejected"]) == (len(case.accepted), len(case.reasons))
    with database.connect(config.db, read_only=True) as con:
        status = con.execute("SELECT status FROM runs WHERE run_id = ?", [config.run_id]).fetchone()[0]
        answered = [r[0] for r in con.execute("SELECT request_id FROM outputs WHERE run_id = ?",
                                              [config.run_id]).fetchall()]
    assert status == "finished" and sorted(answered) == sorted(case.accepted)


def test_a_failing_step_marks_the_run_failed(tmp_path: Path, make_config, monkeypatch):
    from blendserve.pipeline import steps

    (tmp_path / "in.jsonl").write_text(GOOD)
    config = make_config(input=str(tmp_path / "in.jsonl"), engine="simulator", explain=False, sample_rate=0)

    def broken_plan(_config):
        raise RuntimeError("planner exploded")

    monkeypatch.setattr(steps, "plan_step", broken_plan)
    with pytest.raises(RuntimeError, match="planner exploded"):
        run_pipeline(config)
    with database.connect(config.db, read_only=True) as con:
        assert con.execute("SELECT status FROM runs WHERE run_id = ?", [config.run_id]).fetchone()[0] == "failed"


# -- paths --------------------------------------------------------------------------------------------
@pytest.fixture
def roots(tmp_path: Path) -> list[Path]:
    """data/ and out/ under tmp_path are the roots; outside/ holds what must stay out of reach."""
    for folder in ("data/in", "data/i1", "out/runs", "outside"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "outside" / "secret.jsonl").write_text(GOOD)
    (tmp_path / "data" / "in" / "ok.jsonl").write_text(GOOD)
    (tmp_path / "data" / "in" / "escape.jsonl").symlink_to(tmp_path / "outside" / "secret.jsonl")
    (tmp_path / "data" / "escape-dir").symlink_to(tmp_path / "outside")
    (tmp_path / "data" / "in" / "esc[a].jsonl").symlink_to(tmp_path / "outside" / "secret.jsonl")
    return [(tmp_path / "data").resolve(), (tmp_path / "out").resolve()]


# (case, setting, path under tmp_path, words in the error)
PATHS = [
    ("'..' after a wildcard", "input", "data/i?/../../outside/*.json*", "'..' after a wildcard"),
    ("glob matches a symlinked file", "input", "data/in/*.jsonl", "matches"),
    ("glob through a symlinked folder", "input", "data/*/secret.jsonl", "outside the data roots"),
    ("symlink named directly", "input", "data/in/escape.jsonl", "outside the data roots"),
    ("symlink named like a pattern", "input", "data/in/esc[a].jsonl", "matches"),
    ("db with a wildcard and '..'", "db", "out/*/../../x/db.duckdb", "has a wildcard"),
    ("runs_dir with a wildcard", "runs_dir", "out/run?", "has a wildcard"),
    ("db climbing out", "db", "out/../outside/db.duckdb", "outside the data roots"),
]


@pytest.mark.parametrize("case,what,path,words", PATHS, ids=[p[0] for p in PATHS])
def test_paths_stay_inside_the_data_roots(roots, tmp_path: Path, case, what, path, words):
    with pytest.raises(ValueError, match=words):  # PathOutsideRoots or ConfigError, both ValueErrors
        resolve_in_roots(str(tmp_path / path), what, roots)


def test_a_glob_inside_the_roots_still_resolves(roots, tmp_path: Path):
    for link in ("escape.jsonl", "esc[a].jsonl"):
        (tmp_path / "data" / "in" / link).unlink()
    pattern = resolve_in_roots(str(tmp_path / "data" / "i*" / "*.jsonl"), "input", roots)
    assert pattern == str(roots[0] / "i*" / "*.jsonl")
    with pytest.raises(PathOutsideRoots):
        resolve_in_roots(str(tmp_path / "data" / "escape-dir"), "runs_dir", roots)


def test_glob_characters_in_the_db_folder_read_only_this_run(tmp_path: Path, make_config):
    """DuckDB's read_parquet expands * ? [ even in a list of files: 'o[x]' would match 'ox'."""
    for folder, ids in (("ox", ["x1", "x2"]), ("o[x]", ["b1"])):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "in.jsonl").write_bytes(jsonl(*({"custom_id": i, "prompt": i} for i in ids)))
        config = make_config(input=str(tmp_path / folder / "in.jsonl"), db=str(tmp_path / folder / "db.duckdb"),
                             engine="simulator", explain=False, sample_rate=0, run_id="same")
        run_pipeline(config)
    with database.connect(config.db, read_only=True) as con:
        assert sorted(r[0] for r in con.execute("SELECT request_id FROM outputs").fetchall()) == ["b1"]


# -- the command line ---------------------------------------------------------------------------------
# (case, arguments after `run --engine simulator --db DB`, words on stderr)
CLI_ERRORS = [
    ("run id climbing out", ["--input", "IN", "--run-id", "../../escaped"], "run id '../../escaped' is not allowed"),
    ("run id with a glob", ["--input", "IN", "--run-id", "x*"], "run id 'x*' is not allowed"),
    ("missing input", ["--input", "nothing-*.jsonl"], "no input files match"),
    ("part rows zero", ["--input", "IN", "--part-rows", "0"], "part_rows must be at least 1"),
    ("input of an unknown format", ["--input", "TXT"], "unsupported input format '.txt'"),
]


@pytest.mark.parametrize("case,args,words", CLI_ERRORS, ids=[c[0] for c in CLI_ERRORS])
def test_cli_user_errors_are_one_line_without_a_traceback(tmp_path: Path, case, args, words):
    (tmp_path / "db").mkdir()
    (tmp_path / "in.jsonl").write_text(GOOD)
    (tmp_path / "in.txt").write_text(GOOD)
    args = [{"IN": str(tmp_path / "in.jsonl"), "TXT": str(tmp_path / "in.txt")}.get(a, a) for a in args]
    result = run_cli("run", "--engine", "simulator", "--db", str(tmp_path / "db" / "out.duckdb"), *args, timeout=120)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("blendserve run: error: ") and words in last, result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db", "in.jsonl", "in.txt"]  # nothing written beside


def test_cli_verbose_shows_the_traceback(tmp_path: Path):
    result = run_cli("-v", "run", "--engine", "simulator", "--db", str(tmp_path / "o.duckdb"),
                     "--input", str(tmp_path / "none.jsonl"), timeout=120)
    assert result.returncode != 0 and "Traceback" in result.stderr and "no input files match" in result.stderr


def hold_db(db: Path, seconds: int) -> subprocess.Popen:
    """Another process holding ``db`` (DuckDB's write lock) for ``seconds``, returned once it has the lock."""
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({str(db)!r}); "
                               f"print('held', flush=True); time.sleep({seconds})"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
    except BaseException:
        holder.kill()
        holder.wait()
        raise
    return holder


def test_a_second_writer_waits_then_names_the_holder(tmp_path: Path):
    db = tmp_path / "held.duckdb"
    holder = hold_db(db, 60)
    try:
        started = time.monotonic()
        with pytest.raises(database.DatabaseLocked) as err:
            database.connect(db, wait_s=1.5)
        assert time.monotonic() - started >= 1.5  # it waited
        assert f"PID {holder.pid}" in str(err.value) and "time.sleep(60)" in str(err.value)  # its command line
    finally:
        holder.kill()
        holder.wait()
    database.connect(db, wait_s=0).close()  # the lock went with its holder


def test_a_writer_gets_the_file_once_the_holder_lets_go(tmp_path: Path):
    db = tmp_path / "held.duckdb"
    holder = hold_db(db, 2)
    with database.connect(db, wait_s=60) as con:  # the holder exits after 2 s
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
    assert holder.wait() == 0


def test_a_report_read_waits_for_a_writer_too(tmp_path: Path, make_config):
    """The report step reads the file read-only; DuckDB refuses that too while another process writes."""
    (tmp_path / "in.jsonl").write_text(GOOD)
    config = make_config(input=str(tmp_path / "in.jsonl"), engine="simulator", explain=False, sample_rate=0)
    run_pipeline(config)
    holder = hold_db(config.db, 2)
    assert load_run(config.db, config.run_id).totals["requests"] == 1  # read once the holder exits after 2 s
    assert holder.wait() == 0


def test_two_cli_runs_at_once_on_one_db_get_their_own_ids_and_outputs(tmp_path: Path):
    """Default run ids carry milliseconds and a random suffix; the second writer waits for the first."""
    inputs = []
    for name in ("a", "b"):
        inputs.append(tmp_path / f"{name}.jsonl")
        inputs[-1].write_bytes(jsonl(*({"custom_id": f"{name}{i}", "prompt": f"{name} {i}", "max_tokens": 3}
                                       for i in range(3))))
    runs = [subprocess.Popen([sys.executable, "-m", "blendserve", "run", "--engine", "simulator", "--json",
                              "--no-explain", "--sample-rate", "0", "--part-rows", "1", "--input", str(path),
                              "--db", str(tmp_path / "one.duckdb")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())
            for path in inputs]
    results = [run.communicate(timeout=600) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err[-2000:] for _, err in results]
    summaries = [json.loads(out) for out, _ in results]
    assert summaries[0]["run_id"] != summaries[1]["run_id"]
    with database.connect(tmp_path / "one.duckdb", read_only=True) as con:
        for summary, name in zip(summaries, ("a", "b")):
            ids = [r[0] for r in con.execute("SELECT request_id FROM outputs WHERE run_id = ? ORDER BY 1",
                                             [summary["run_id"]]).fetchall()]
            assert ids == [f"{name}0", f"{name}1", f"{name}2"]
            parts = list((tmp_path / "runs" / summary["run_id"] / "parts").glob("*/part-*.parquet"))
            assert len(parts) == 3  # --part-rows 1: a commit per result
