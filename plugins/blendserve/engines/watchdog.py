"""Engine processes die with the process that started them, however it dies.

vLLM starts its engine core (and that its workers) as separate processes. If
the task process is killed (``kill -9``, an Airflow timeout, the OOM killer)
they are re-parented to PID 1 and keep their memory, and on a GPU worker the
GPU. A parent-death signal cannot be set in them (multiprocessing's spawn has
no hook), and the task's process group may hold its supervisor too, so a small
watchdog does it: started before the engine, in a session of its own, it
records the task's new descendants every half second; when the task is gone
(its end of the pipe closes without a word) it kills what it recorded and
their descendants. ``Watchdog.stop`` on a normal close lets it exit quietly.

This file runs as a script by its path (stdlib only): inside Airflow the
plugins folder is on ``sys.path`` but not in the environment a child inherits.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

POLL_S = 0.5  # how often the task's descendants are recorded
STOP = b"stop\n"

Identity = tuple[int, int]  # (pid, start time in clock ticks): a reused pid is another process


class Watchdog:
    """A running watchdog over this process; ``stop`` when the engine has shut down."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        if not os.path.isdir("/proc"):  # not Linux: engines are left to their own shutdown
            return
        # what this process ran before its engine is not the engine's: the baseline is taken here, as
        # the watchdog's own start may take a second, while the engine's processes are already starting
        before = [f"{pid}:{start}" for pid, start in descendants({os.getpid()}, process_table())]
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(os.getpid()), *before],
            stdin=subprocess.PIPE, start_new_session=True,  # a kill of the task's group spares it
        )

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                self.process.stdin.write(STOP)  # type: ignore[union-attr]
                self.process.stdin.close()  # type: ignore[union-attr]
            except BrokenPipeError:
                pass
        self.process.wait(timeout=10)


def process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time) of every process, from /proc."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
            table[int(entry.name)] = (int(fields[1]), int(fields[19]))
    return table


def descendants(roots: set[int], table: dict[int, tuple[int, int]]) -> set[Identity]:
    """Every process below ``roots`` (not the roots themselves)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[Identity] = set()
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), []):
            found.add((child, table[child][1]))
            stack.append(child)
    return found


def kill_all(recorded: set[Identity]) -> None:
    """SIGKILL the recorded processes still alive as themselves, and everything now below them."""
    table = process_table()
    alive = {(pid, start) for pid, start in recorded if table.get(pid, (0, -1))[1] == start}
    for pid, _ in alive | descendants({pid for pid, _ in alive}, table):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def watch(parent: int, before: set[Identity]) -> None:
    me = os.getpid()
    recorded: set[Identity] = set()
    while True:
        recorded |= {p for p in descendants({parent}, process_table()) - before if p[0] != me}
        ready, _, _ = select.select([sys.stdin.buffer], [], [], POLL_S)
        if ready:
            message = os.read(sys.stdin.fileno(), 64)
            if message.startswith(STOP):
                return  # the engine shut down normally
            if not message:
                break  # EOF: the task is gone
        if os.getppid() != parent:
            break
    kill_all(recorded)


if __name__ == "__main__":
    watch(int(sys.argv[1]), {(int(p), int(s)) for p, s in (a.split(":") for a in sys.argv[2:])})
