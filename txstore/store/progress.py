"""Progress reports on stderr for long jobs (no dependency, no terminal tricks).

On a terminal one line is rewritten in place (``\\r``); anywhere else (a log file, CI, a pipe)
a carriage return would glue every update into one line, so plain lines are written instead,
few enough to read: at most one every ``LOG_INTERVAL`` seconds, and the final count.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

#: Seconds between two progress lines written to something that is not a terminal.
LOG_INTERVAL = 5.0


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or closed
        return False


class Progress:
    """Counts units of work and reports them on ``stream`` (default stderr)."""

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
        self.tty = _isatty(self.stream)
        self.interval = interval if self.tty else max(interval, LOG_INTERVAL)
        self.done = 0
        self._start = time.monotonic()
        # A terminal shows the first update at once; a log waits an interval, so that short
        # jobs write their final line only.
        self._shown = 0.0 if self.tty else self._start

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self._shown >= self.interval:
            self._shown = now
            self._show(now, end="\r" if self.tty else "\n")

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
