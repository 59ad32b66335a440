"""No engine process outlives its task: kill -9 the task, and what it started dies too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import jsonl, subprocess_env

# A task that starts the watchdog, then a child and a grandchild (as vLLM's engine core and worker), then waits.
TASK = """
import subprocess, sys, time
from blendserve.engines.watchdog import Watchdog
watchdog = Watchdog()
child = subprocess.Popen(["sh", "-c", "sleep 300 & wait"])
time.sleep(0.3)
print(child.pid, flush=True)
{end}
"""


def start_task(end: str) -> tuple[subprocess.Popen, int]:
    task = subprocess.Popen([sys.executable, "-c", TASK.format(end=end)], stdout=subprocess.PIPE, text=True,
                            env=subprocess_env())
    return task, int(task.stdout.readline())


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def gone_within(processes: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    """The processes still running after ``seconds`` (zombies count as gone: they hold nothing)."""
    _, alive = psutil.wait_procs(processes, timeout=seconds)
    return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_killed_task_takes_its_engine_processes_with_it():
    task, child = start_task("time.sleep(300)")
    engine = tree(child)  # the "engine core" and its "worker"
    assert len(engine) == 2
    time.sleep(1.5)  # the watchdog records every half second
    os.kill(task.pid, signal.SIGKILL)
    task.wait()
    assert gone_within(engine, 10) == []


def test_a_task_that_stops_its_engine_leaves_the_rest_alone():
    task, child = start_task("watchdog.stop()\nprint(watchdog.process.returncode, flush=True)")
    assert task.stdout.readline().strip() == "0"  # the watchdog exits when told
    task.wait()
    survivors = gone_within(tree(child), 1)
    assert len(survivors) == 2  # a normal stop kills nothing
    for p in survivors:
        p.kill()


@pytest.mark.engine
def test_kill_9_during_vllm_inference_leaves_no_engine_process(tmp_path: Path):
    """The real vLLM-CPU engine in vLLM's own processes (as on a GPU; on a CPU it runs in the task's
    process unless told otherwise): once results commit, kill -9 the run; its EngineCore and workers must go."""
    rows = [{"custom_id": f"r{i}", "prompt": f"Count slowly from {i} to {i + 300}.", "max_tokens": 400}
            for i in range(24)]
    (tmp_path / "in.jsonl").write_bytes(jsonl(*rows))
    run = subprocess.Popen([sys.executable, "-m", "blendserve", "run", "--engine", "vllm", "--run-id", "kill9",
                            "--input", str(tmp_path / "in.jsonl"), "--db", str(tmp_path / "out.duckdb"),
                            "--part-rows", "1", "--sample-rate", "0", "--no-explain", "--kv-cache-gb", "0.5"],
                           env=subprocess_env(VLLM_ENABLE_V1_MULTIPROCESSING="1"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = tmp_path / "runs" / "kill9" / "parts"
    deadline = time.monotonic() + 240
    while not list(parts.glob("*/part-*.parquet")):
        assert run.poll() is None and time.monotonic() < deadline, "the run ended or stalled before inferring"
        time.sleep(0.5)
    engine = tree(run.pid)[1:]
    assert len(engine) >= 2  # the watchdog and at least vLLM's engine core
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    assert gone_within(engine, 20) == []
