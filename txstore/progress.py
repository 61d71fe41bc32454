"""A one-line progress report on stderr for long jobs (no dependency, no terminal tricks)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Counts units of work and rewrites one stderr line at most every ``interval`` seconds."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        unit: str = "samples",
        enabled: bool = True,
        stream: TextIO | None = None,
        interval: float = 0.5,
    ) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.interval = interval
        self.done = 0
        self._start = time.monotonic()
        self._shown = 0.0

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self._shown >= self.interval:
            self._shown = now
            self._show(now, end="\r")

    def _show(self, now: float, end: str) -> None:
        rate = self.done / max(now - self._start, 1e-9)
        of = f"/{self.total:,}" if self.total is not None else ""
        print(
            f"{self.label}: {self.done:,}{of} {self.unit} ({rate:,.0f}/s)",
            end=end,
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        if self.enabled:
            self._show(time.monotonic(), end="\n")
