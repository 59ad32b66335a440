"""blendserve against ``vllm run-batch`` on the same OpenAI batch file, end to end (vLLM-CPU, SmolLM2-135M).

    .venv/bin/python bench/bench_peer.py [--quick] [--rounds 3] [--batches mixed,locality,duplicates,large] \
        [--airflow] [--systems run-batch,run-batch-sorted,blendserve,airflow] [--scale 1.0] [--work DIR] [--out]

A tiny proof run (about 30 requests a batch, every system): ``--quick --scale 0.2 --airflow``.

Systems, each a whole process (start to exit), on the same batch file (peer_batches.py builds them):

- ``run-batch``: ``vllm run-batch -i batch.jsonl -o out.jsonl`` on the file as given;
- ``run-batch-sorted``: the same on the file's lines sorted by prompt text (a user's one-line locality trick);
- ``blendserve``: ``blendserve run --input batch.jsonl --db fresh.duckdb --json``;
- ``airflow`` (``--airflow``): DAG ``blendserve_batch`` on a live Airflow (started once, as bin/airflow-local
  and tests/live_airflow.py do), triggered over the REST API, timed from the trigger to the run's success.

Same engine settings everywhere (blendserve's VllmEngine: prefix caching, chunked prefill, enforce_eager,
seed 0, max_model_len, max_num_seqs, KV bytes, dtype, its CPU environment); float32 by default, since in
bf16 greedy answers change with the batch's composition. vllm-cpu's ``vllm`` script fails on its own
package name (no ``vllm`` distribution), so run-batch starts as ``python -m
vllm.entrypoints.openai.run_batch``: the same parser and main as ``vllm run-batch``.

Measured per run: wall seconds, tokens per second (prompt + output tokens of every request as answered,
over the wall), prefix-cache hit share (run-batch: ``usage.prompt_tokens_details.cached_tokens`` over
``prompt_tokens``, with ``--enable-prompt-tokens-details``; blendserve: its summary's ``prefix_hit_rate``,
which counts the requests it served, not the duplicates it fanned out) and, per batch, the share of
identical greedy answers against run-batch (joined on custom_id). Systems take turns round-robin within a
batch, in a rotating order, ``--rounds`` rounds; tables give medians (min to max).

Sizes: ``--quick`` (mixed 160, locality 144, duplicates 144 requests, 1 round, no large batch): about
15 minutes on 2 quiet cores. Full (mixed 440, locality 400, duplicates 450, large 1,600 requests, 3 rounds):
about 4 hours (a round of the full mixed batch takes about 11 minutes for two systems, of the large one
about 45 minutes for three; ``--airflow`` adds a third). Full-size batches are best measured one
``--batches`` run at a time: ``--out`` keeps the stored ones a run did not measure.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import peer_batches
from bench_warmup import environment
from blendserve.cli import build_parser
from blendserve.commands.engine_options import engine_settings
from blendserve.config import RunConfig
from blendserve.costmodel.profiles import load_profile
from blendserve.engines.vllm_engine import configure_cpu_env
from blendserve.model_prep import ensure_model_dir
from blendserve.pipeline import database
from common import REPO, earlier_result, provenance, write_result
from peer_airflow import LiveAirflow

BATCHES = ("mixed", "locality", "duplicates", "large")  # in every table's order; "large" at full size only

SYSTEMS = ("run-batch", "run-batch-sorted", "blendserve")  # the default set; "airflow" with --airflow
ALL_SYSTEMS = (*SYSTEMS, "airflow")
BASELINE = "run-batch"


@dataclass(frozen=True)
class Settings:
    """The engine settings every system runs with."""

    dtype: str  # weights and activations
    max_model_len: int  # context length
    max_num_seqs: int  # running-sequence limit
    kv_gb: float  # KV cache, GiB (kv_cache_memory_bytes)
    max_num_batched_tokens: int  # tokens per step (vLLM's default differs: 4096 for LLM, 2048 for run-batch on CPU)

    @property
    def kv_bytes(self) -> int:
        return int(self.kv_gb * (1 << 30))


@dataclass
class SystemRun:
    """One system on one batch file, one round."""

    system: str  # run-batch, run-batch-sorted, blendserve or airflow
    batch: str  # batch name (peer_batches.build)
    round: int  # 0-based round
    wall_s: float  # whole process, start to exit (airflow: trigger to the run's success)
    requests: int  # answers returned (errors included)
    errors: int  # answers that are errors
    prompt_tokens: int  # prompt tokens of every answered request (duplicates counted each time)
    output_tokens: int  # output tokens of every answered request
    tokens_per_s: float  # (prompt + output tokens) / wall_s
    prefix_hit_rate: float  # prompt tokens served from the prefix cache, share (see the module docstring)
    inference_s: float | None = None  # blendserve: its summary's inference wall (engine serving only)
    job_s: float | None = None  # blendserve: its own job seconds (ingest, plan, engine start, infer, load)
    hardware: str | None = None  # blendserve: the profile its plan was costed on (a calibrated one, with auto)
    replay_s: float | None = None  # blendserve: the cost model's seconds for what ran (report/replay.py)
    replay_error: float | None = None  # blendserve: replay_s / inference_s - 1
    answers: dict[str, str] = field(default_factory=dict, repr=False)  # custom_id -> answer text (not saved)


# -- the systems ---------------------------------------------------------------------------------------------

def engine_env() -> dict[str, str]:
    """This process's environment with blendserve's vLLM-CPU settings (configure_cpu_env), for every system."""
    configure_cpu_env(RunConfig(run_id="bench-peer", input="-", db="-"))
    return dict(os.environ, PYTHONPATH=str(REPO / "plugins"), TOKENIZERS_PARALLELISM="false")


def run_batch_command(batch: Path, out: Path, s: Settings) -> list[str]:
    """``vllm run-batch`` with VllmEngine's engine arguments."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(batch), "-o", str(out),
            "--model", str(ensure_model_dir()), "--served-model-name", peer_batches.MODEL_NAME,
            "--dtype", s.dtype, "--max-model-len", str(s.max_model_len), "--max-num-seqs", str(s.max_num_seqs),
            "--kv-cache-memory-bytes", str(s.kv_bytes), "--max-num-batched-tokens", str(s.max_num_batched_tokens),
            "--enable-prefix-caching", "--enable-chunked-prefill",
            "--enforce-eager", "--seed", "0", "--enable-prompt-tokens-details"]


def timed(command: list[str], log: Path) -> tuple[float, str]:
    """Run ``command`` to its exit (stderr to ``log``); its wall seconds and stdout. Fails loudly."""
    started = time.monotonic()
    with open(log, "w") as err, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True,
                                                 env=engine_env(), cwd=REPO) as process:
        try:
            stdout, _ = process.communicate()
        finally:  # stopped (SIGTERM, Ctrl-C): TERM first, so the child stops its engine processes too
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
    wall = time.monotonic() - started
    log.with_suffix(".stdout").write_text(stdout)  # vLLM logs to stdout: its settings, its periodic stats
    if process.returncode:
        raise RuntimeError(f"{command[:4]} failed ({process.returncode}); see {log}")
    return wall, stdout


def run_vllm(system: str, batch: Path, work: Path, s: Settings) -> SystemRun:
    out = work / f"{system}-out.jsonl"
    wall, _ = timed(run_batch_command(batch, out, s), work / f"{system}.log")
    answers, prompt, cached, output, errors = {}, 0, 0, 0, 0
    for line in out.read_text().splitlines():
        row = json.loads(line)
        body = (row.get("response") or {}).get("body")
        if row.get("error") or not body:
            errors += 1
            answers[row["custom_id"]] = ""
            continue
        usage = body["usage"]
        answers[row["custom_id"]] = body["choices"][0]["message"]["content"] or ""
        prompt += usage["prompt_tokens"]
        output += usage["completion_tokens"]
        cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return SystemRun(system, "", 0, wall, len(answers), errors, prompt, output, (prompt + output) / wall,
                     cached / prompt if prompt else 0.0, answers=answers)


def engine_flags(s: Settings) -> list[str]:
    """blendserve's engine flags (commands/engine_options) for ``s``: the same for run and calibrate."""
    return ["--dtype", s.dtype, "--max-model-len", str(s.max_model_len), "--max-num-seqs", str(s.max_num_seqs),
            "--kv-cache-gb", repr(s.kv_gb), "--max-num-batched-tokens", str(s.max_num_batched_tokens)]


def blendserve_command(batch: Path, db: Path, s: Settings) -> list[str]:
    return [sys.executable, "-m", "blendserve", "run", "--input", str(batch), "--db", str(db), "--json",
            *engine_flags(s)]


def calibrated(s: Settings, log: Path) -> dict:
    """This machine's profile for ``s`` (``blendserve calibrate`` once, when there is none yet), so that
    ``--hardware auto`` costs blendserve's plans in this machine's seconds; how long calibrating took."""
    flags = build_parser().parse_args(["calibrate", *engine_flags(s)])  # the key a run with these flags looks up
    existing = load_profile(RunConfig(run_id="bench-peer", input="-", db="-", **engine_settings(flags)))
    if existing is not None:
        return {"profile": existing.name, "calibrate_s": None, "fit_error": existing.fit_error}
    wall, stdout = timed([sys.executable, "-m", "blendserve", "calibrate", "--json", *engine_flags(s)], log)
    profile = json.loads(stdout[stdout.index("{"):])
    return {"profile": profile["name"], "calibrate_s": wall, "fit_error": profile["fit_error"]}


def run_blendserve(batch: Path, work: Path, s: Settings) -> SystemRun:
    db = work / "blendserve.duckdb"  # a fresh one per run: work is the run's own folder
    wall, stdout = timed(blendserve_command(batch, db, s), work / "blendserve.log")
    summary = json.loads(stdout[stdout.rindex("\n{") + 1 if "\n{" in stdout else stdout.index("{"):])
    return from_duckdb("blendserve", db, summary["run_id"], wall, summary)


def from_duckdb(system: str, db: Path, run_id: str, wall: float, summary: dict) -> SystemRun:
    """A blendserve run's answers and tokens from its DuckDB table ``outputs``."""
    # a process still closing the file (an Airflow task) holds its lock a moment: connect waits for it
    with database.connect(db, read_only=True, wait_s=120) as con:
        rows = con.execute("SELECT request_id, text, num_prompt_tokens, num_output_tokens, status "
                           "FROM outputs WHERE run_id = ?", [run_id]).fetchall()
    prompt = sum(r[2] or 0 for r in rows)
    output = sum(r[3] or 0 for r in rows)
    return SystemRun(system, "", 0, wall, len(rows), sum(1 for r in rows if r[4] == 'error'), prompt, output,
                     (prompt + output) / wall, float(summary.get("prefix_hit_rate", 0.0)),
                     inference_s=summary.get("wall_seconds"), job_s=summary.get("job_seconds"),
                     hardware=summary.get("hardware"), replay_s=summary.get("replay_seconds"),
                     replay_error=summary.get("replay_error"),
                     answers={r[0]: r[1] or "" for r in rows})


def run_system(system: str, files: dict[str, Path], work: Path, s: Settings, airflow: LiveAirflow | None) -> SystemRun:
    work.mkdir(parents=True, exist_ok=True)
    if system == "blendserve":
        return run_blendserve(files["given"], work, s)
    if system == "airflow":
        db = work / "airflow.duckdb"
        wall, summary = airflow.run_batch(files["given"], db, conf_settings(s))
        return from_duckdb("airflow", db, summary["run_id"], wall, summary)
    return run_vllm(system, files["sorted" if system == "run-batch-sorted" else "given"], work, s)


def conf_settings(s: Settings) -> dict:
    """The DAG run conf keys for the same settings as blendserve_command's flags."""
    return {"dtype": s.dtype, "max_model_len": s.max_model_len, "max_num_seqs": s.max_num_seqs,
            "kv_cache_gb": s.kv_gb, "max_num_batched_tokens": s.max_num_batched_tokens}


# -- figures -------------------------------------------------------------------------------------------------

def identical_share(a: dict[str, str], b: dict[str, str]) -> float:
    """Share of the custom_ids both answered whose answers are the same text (whitespace at the ends aside)."""
    common = a.keys() & b.keys()
    return sum(a[k].strip() == b[k].strip() for k in common) / len(common) if common else 0.0


def spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}} to {max(values):{fmt}})"


def summarize(runs: list[SystemRun]) -> dict[str, dict]:
    """Per system: medians and ranges of wall, tokens/s and prefix hits, and its stage times."""
    out = {}
    for system in sorted({r.system for r in runs}, key=list(ALL_SYSTEMS).index):
        mine = [r for r in runs if r.system == system]
        walls, tps = [r.wall_s for r in mine], [r.tokens_per_s for r in mine]
        out[system] = {"wall_s": statistics.median(walls), "wall_min_s": min(walls), "wall_max_s": max(walls),
                       "tokens_per_s": statistics.median(tps), "tokens_per_s_min": min(tps),
                       "tokens_per_s_max": max(tps),
                       "prefix_hit_rate": statistics.median(r.prefix_hit_rate for r in mine),
                       "errors": max(r.errors for r in mine), "requests": mine[0].requests}
        for stage in ("inference_s", "job_s", "replay_s", "replay_error"):  # blendserve's own, where its summary has them
            if getattr(mine[0], stage) is not None:
                out[system][stage] = statistics.median(getattr(r, stage) for r in mine)
        if mine[0].hardware:
            out[system]["hardware"] = mine[0].hardware
    return out


def agreement(runs: list[SystemRun]) -> dict[str, float]:
    """Identical answers against run-batch, first round of each system."""
    first = {r.system: r for r in reversed(runs)}  # reversed: the earliest run of a system wins
    base = first.get(BASELINE)
    return {system: identical_share(run.answers, base.answers) for system, run in first.items()
            if base is not None and system != BASELINE}


def print_table(name: str, summary: dict[str, dict], same: dict[str, float]) -> None:
    base = summary.get(BASELINE, {}).get("wall_s")
    print(f"\n{name}: | system | wall s median (min to max) | vs run-batch (wall) | tok/s | prefix hits "
          "| identical answers vs run-batch | errors |")
    for system, s in summary.items():
        ratio = f"{base / s['wall_s']:.2f}x" if base else "-"
        agree = f"{same[system]:.1%}" if system in same else "-"
        stage = "".join(f", {label} {s[key]:.1f} s" for key, label in (("job_s", "job"), ("inference_s", "inference"))
                        if key in s)
        print(f"  | {system} | {s['wall_s']:.1f} ({s['wall_min_s']:.1f} to {s['wall_max_s']:.1f}{stage}) | {ratio} "
              f"| {s['tokens_per_s']:.0f} | {s['prefix_hit_rate']:.1%} | {agree} | {s['errors']} |", flush=True)


# -- the bench -----------------------------------------------------------------------------------------------

def prepare(name: str, sizes: peer_batches.Sizes, seed: int, s: Settings, folder: Path) -> tuple[dict[str, Path], dict]:
    """The batch's two files (as given, sorted by prompt text) and its facts."""
    rows = peer_batches.build(name, sizes, seed)
    lengths = peer_batches.prompt_lengths(rows)
    facts = {"requests": len(rows), "prompt_tokens": sum(lengths),
             "max_output_tokens": sum(r["body"]["max_tokens"] for r in rows), "kv_gb": s.kv_gb,
             "kv_tokens": peer_batches.kv_capacity_tokens(s.kv_gb, s.dtype),
             "distinct_prefix_tokens": peer_batches.distinct_prefix_tokens(rows)}
    files = {"given": peer_batches.write(rows, folder / name / "batch.jsonl"),
             "sorted": peer_batches.write(rows, folder / name / "batch-sorted.jsonl", by_prompt=True)}
    print(f"{name}: {facts['requests']} requests, {facts['prompt_tokens']:,} prompt tokens, up to "
          f"{facts['max_output_tokens']:,} output tokens; distinct shared MMLU prefixes "
          f"{facts['distinct_prefix_tokens']:,} tokens vs KV {facts['kv_tokens']:,} tokens ({s.kv_gb:g} GiB)",
          flush=True)
    return files, facts


def bench_batch(name: str, files: dict[str, Path], systems: list[str], rounds: int, s: Settings, folder: Path,
                airflow: LiveAirflow | None) -> list[SystemRun]:
    runs = []
    for round_ in range(rounds):
        for k in range(len(systems)):  # rotate, so no system always runs first or last in a round
            system = systems[(round_ + k) % len(systems)]
            run = run_system(system, files, folder / name / f"r{round_}-{system}", s, airflow)
            run.batch, run.round = name, round_
            runs.append(run)
            print(f"  {name} round {round_ + 1} {system:<17} {run.wall_s:7.1f} s {run.tokens_per_s:7.0f} tok/s "
                  f"prefix hits {run.prefix_hit_rate:6.1%}  {run.errors} errors", flush=True)
    return runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small batches, 1 round, no large batch (~15 min)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default: 1 quick, 3 full)")
    ap.add_argument("--batches", default=None, help="comma list of mixed,locality,duplicates,large "
                                                    "(default: all; quick: no large)")
    ap.add_argument("--scale", type=float, default=1.0, help="request counts times this (0.2: a tiny proof run)")
    ap.add_argument("--airflow", action="store_true", help="also blendserve through a live Airflow")
    ap.add_argument("--systems", default=None, help=f"comma list out of {','.join(ALL_SYSTEMS)} "
                                                    "(default: all; airflow only with --airflow)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-num-batched-tokens", type=int, default=4096,
                    help="tokens per step, for all (default: what blendserve's vLLM gets by default on a CPU)")
    ap.add_argument("--kv-gb", type=float, default=1.0, help="KV cache, GiB (all batches but locality)")
    ap.add_argument("--locality-kv-gb", type=float, default=0.25, help="KV cache of the locality batch, GiB")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None, help="folder for batch files, outputs and logs "
                                                            "(default: a temporary one, removed)")
    ap.add_argument("--out", action="store_true",
                    help="write bench/results/peer.json (--quick) or peer-full.json")
    return ap.parse_args(argv)


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finallies: stop the child, the Airflow
    sizes = (peer_batches.QUICK if args.quick else peer_batches.FULL).scaled(args.scale)
    every = [b for b in BATCHES if b != "large" or not args.quick]
    names = args.batches.split(",") if args.batches else every
    rounds = args.rounds or (1 if args.quick else 3)
    systems = args.systems.split(",") if args.systems else list(SYSTEMS) + (["airflow"] if args.airflow else [])
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as tmp:
        folder = args.work or Path(tmp)
        airflow = LiveAirflow.start(folder / "airflow") if "airflow" in systems else None
        try:
            result = {}
            for name in names:
                kv = args.locality_kv_gb if name == "locality" else args.kv_gb
                s = Settings(args.dtype, args.max_model_len, args.max_num_seqs, kv, args.max_num_batched_tokens)
                batch_sizes = peer_batches.LARGE.scaled(args.scale) if name == "large" else sizes
                files, facts = prepare(name, batch_sizes, args.seed, s, folder)
                facts["calibration"] = calibrated(s, folder / f"calibrate-{name}.log")
                runs = bench_batch(name, files, systems, rounds, s, folder, airflow)
                summary, same = summarize(runs), agreement(runs)
                print_table(name, summary, same)
                result[name] = {**facts, "systems": summary, "identical_vs_run_batch": same, "rounds": rounds,
                                "provenance": provenance(),
                                "runs": [{k: v for k, v in asdict(r).items() if k != "answers"} for r in runs]}
        finally:
            if airflow is not None:
                airflow.stop()
    print(environment())
    if args.out:
        name = "peer" if args.quick else "peer-full"
        write_result(name, with_earlier(name, {
            "settings": {"dtype": args.dtype, "max_num_seqs": args.max_num_seqs, "max_model_len": args.max_model_len,
                         "kv_gb": args.kv_gb, "max_num_batched_tokens": args.max_num_batched_tokens,
                         "locality_kv_gb": args.locality_kv_gb},
            "quick": args.quick, "scale": args.scale, "rounds": rounds, "systems": systems,
            "environment": environment(), "batches": result}))


def with_earlier(name: str, data: dict) -> dict:
    """``data`` plus the batches that the stored result ``name`` holds and this run did not measure, when it was
    measured at the same size and settings: a full-size batch takes tens of minutes, so they are run one at a
    time. Each batch keeps the provenance and rounds of the run that measured it."""
    earlier = earlier_result(name, data, ("quick", "scale", "settings"))
    if earlier is None:
        return data
    batches = {b: {"provenance": earlier["provenance"], "rounds": earlier["rounds"], **v}
               for b, v in earlier["batches"].items()}
    batches.update(data["batches"])
    return {**data, "batches": dict(sorted(batches.items(), key=lambda kv: BATCHES.index(kv[0])))}


if __name__ == "__main__":
    main()
