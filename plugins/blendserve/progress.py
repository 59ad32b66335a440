"""Progress for long work: requests done, tokens per second, time left.

On a terminal (stderr is a TTY) it is a tqdm bar; anywhere else (Airflow task
logs, redirected output) it is the same numbers as a log line every few
seconds, because a redrawn bar turns into thousands of lines in a log file.

Usage (the pipeline's serving loop wraps its result callback)::

    with Progress("shard 0", total=len(requests)) as progress:
        engine.run(requests, order, progress.wrap(on_result))

and for a phase with no natural count (planning, warm-up selection)::

    with phase("plan: prefix tree"):
        ...
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

log = logging.getLogger("blendserve.progress")


def _use_bar(mode: str) -> bool:
    """'bar', 'log' or 'auto' (a bar only when a person is watching stderr)."""
    if mode == "auto":
        return bool(getattr(sys.stderr, "isatty", lambda: False)())
    return mode == "bar"


class Progress:
    """Counts rows (requests) and tokens; shows a bar or logs a line every ``every_seconds``."""

    def __init__(self, label: str, total: int, every_seconds: float = 5.0, mode: str = "auto") -> None:
        self.label, self.total, self.every = label, total, every_seconds
        self.done = self.tokens = 0
        self.start = self.last = time.monotonic()
        self._bar = self._make_bar() if _use_bar(mode) else None

    def _make_bar(self) -> Any:
        from tqdm import tqdm

        return tqdm(total=self.total, desc=self.label, unit="req", dynamic_ncols=True, leave=True)

    def update(self, rows: int = 1, tokens: int = 0) -> None:
        self.done += rows
        self.tokens += tokens
        now = time.monotonic()
        if self._bar is not None:
            self._bar.update(rows)
            self._bar.set_postfix_str(f"{self.tokens / max(now - self.start, 1e-9):,.0f} tok/s", refresh=False)
            return
        if now - self.last >= self.every or self.done >= self.total:
            self.last = now
            log.info(self.line(now))

    def wrap(self, sink: Callable[[Any], None]) -> Callable[[Any], None]:
        """A result callback that counts each engine result (prompt + output tokens) before passing it on."""
        def counted(result: Any) -> None:
            sink(result)
            self.update(1, int(getattr(result, "num_prompt_tokens", 0) or 0)
                        + int(getattr(result, "num_output_tokens", 0) or 0))
        return counted

    def line(self, now: float | None = None) -> str:
        elapsed = max((now or time.monotonic()) - self.start, 1e-9)
        rate = self.done / elapsed
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        return (f"{self.label}: {self.done}/{self.total} requests ({100 * self.done / max(self.total, 1):.0f}%), "
                f"{self.tokens / elapsed:,.0f} tok/s, {elapsed:.0f}s elapsed, ~{left:.0f}s left")

    def close(self) -> None:
        """Finish the bar, and always leave one final line in the log (what a task log keeps)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        log.info(self.line())

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def phase(label: str) -> Iterator[None]:
    """Log the start and duration of a phase that has no count (planning, sampling)."""
    started = time.monotonic()
    log.info("%s ...", label)
    yield
    log.info("%s done in %.1f s", label, time.monotonic() - started)


class Stages:
    """When each part of a CLI run happened, in seconds since the run began: [start, end]."""

    def __init__(self) -> None:
        self.began = time.monotonic()
        self.seconds: dict[str, list[float]] = {}  # stage -> [start, end]

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        yield
        self.add(name, (start, time.monotonic()))

    def add(self, name: str, interval: tuple[float, float] | None) -> None:
        """A stage timed elsewhere (``time.monotonic()`` marks); one that ended before this run is not its."""
        if interval is not None and interval[1] >= self.began:
            self.seconds[name] = [round(max(t - self.began, 0.0), 2) for t in interval]
