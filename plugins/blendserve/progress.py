"""Progress lines for long work: rows done, tokens per second, time left.

Plain log lines (not a redrawn bar) so that Airflow task logs and terminals
show the same thing.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("blendserve.progress")


class Progress:
    def __init__(self, label: str, total: int, every_seconds: float = 5.0) -> None:
        self.label, self.total, self.every = label, total, every_seconds
        self.done = self.tokens = 0
        self.start = self.last = time.monotonic()

    def update(self, rows: int = 1, tokens: int = 0) -> None:
        self.done += rows
        self.tokens += tokens
        now = time.monotonic()
        if now - self.last >= self.every or self.done >= self.total:
            self.last = now
            log.info(self.line(now))

    def line(self, now: float | None = None) -> str:
        elapsed = max((now or time.monotonic()) - self.start, 1e-9)
        rate = self.done / elapsed
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        return (f"{self.label}: {self.done}/{self.total} rows ({100 * self.done / max(self.total, 1):.0f}%), "
                f"{self.tokens / elapsed:.0f} tok/s, {elapsed:.0f}s elapsed, ~{left:.0f}s left")
