"""How long operations report progress: stages, each with a total and a unit.

Every long operation (optimize, add_fields, compact, vacuum, verify) reports through one
``Progress``: it opens a ``Stage`` per step ("reading manifests", "compacting", ...) with the
step's total and unit, and counts work into it. What a person sees depends on where the
reports go:

- a terminal: a tqdm bar per stage, with the count, the total, the rate and the ETA;
- anything else (a log file, CI, a pipe): carriage returns would glue every redraw into one
  line, so plain lines are written instead, few enough to read: at most one every
  ``interval`` seconds, each with the ETA, and the final count (a short stage writes that
  alone). With ``logger`` they go to that logger (at INFO) rather than to a stream.

A ``callback`` ``(stage, done, total)`` also hears every update, for a caller that draws its
own progress. tqdm is imported here and nowhere else, and only once progress is shown:
importing it reads package metadata, which a quiet operation (or a DataLoader worker)
need not wait for.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

#: ``(stage, done, total)``: called as long work advances.
ProgressFn = Callable[[str, int, int], None]

#: Seconds between two plain lines of a stage (off a terminal).
LOG_INTERVAL = 10.0


def _tqdm() -> Any:
    from tqdm import tqdm

    return tqdm


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or closed
        return False


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0


class Progress:
    """Where a long operation reports: quiet, a stream (default stderr), a logger, a callback.

    Holds settings only: one ``Progress`` may serve any number of operations, one after
    another or at once.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool = True,
        logger: logging.Logger | None = None,
        callback: ProgressFn | None = None,
        interval: float = LOG_INTERVAL,
    ) -> None:
        self.stream = stream
        self.enabled = enabled
        self.logger = logger
        self.callback = callback
        self.interval = interval

    @classmethod
    def of(cls, arg: ProgressArg) -> Progress:
        """The ``Progress`` an operation's ``progress=`` argument means."""
        if isinstance(arg, Progress):
            return arg
        if arg is None or arg is False:
            return QUIET
        if arg is True:
            return cls()
        if callable(arg):
            return cls(enabled=False, callback=arg)
        raise TypeError(
            f"progress must be a bool, a callback (stage, done, total) or a Progress, not {arg!r}"
        )

    def stage(self, name: str, total: int, unit: str) -> Stage:
        """A step of ``total`` units of work; close it (or use ``with``) when it ends."""
        return Stage(self, name, total, unit)


#: What the operations' ``progress=`` takes: True shows progress on stderr, False or None
#: shows none, a callback hears every update, a ``Progress`` says exactly where to report.
ProgressArg = bool | ProgressFn | Progress | None


class Stage:
    """One step of a long operation, counted in its unit up to its total."""

    def __init__(self, progress: Progress, name: str, total: int, unit: str) -> None:
        self.name, self.total, self.unit = name, total, unit
        self.done = 0
        self._callback = progress.callback
        self._bar: Any = None  # a tqdm bar, on a terminal
        self._write: Callable[[str], None] | None = None
        self._closed = False
        if progress.enabled:
            if progress.logger is not None:
                self._write = _to_logger(progress.logger)
            else:
                stream = progress.stream or sys.stderr  # looked up now: it may be replaced
                if _isatty(stream):
                    self._bar = _tqdm()(
                        total=total,
                        desc=name,
                        unit=f" {unit}",
                        unit_scale=total >= 10_000,  # 12.3k, not 12345; but 50, not 50.0
                        file=stream,
                        leave=True,
                        # Follows the terminal's size; one that reports none (a pseudo
                        # terminal never sized) gets a fixed one, else tqdm draws nothing.
                        **(
                            {"dynamic_ncols": True}
                            if _columns(stream)
                            else {"ncols": 80, "nrows": 24}
                        ),
                    )
                else:
                    self._write = _to_stream(stream)
        self._interval = progress.interval
        # The first plain line waits an interval too: a short stage writes its final one only.
        self._start = self._shown = time.monotonic()
        if self._callback is not None:
            self._callback(name, 0, total)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._write is not None:
            now = time.monotonic()
            if self.done < self.total and now - self._shown >= self._interval:
                self._line(now, final=False)
        if self._callback is not None:
            self._callback(self.name, self.done, self.total)

    def close(self, *, failed: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif self._write is not None:
            self._line(time.monotonic(), final=True, failed=failed)

    def _line(self, now: float, *, final: bool, failed: bool = False) -> None:
        assert self._write is not None
        tqdm = _tqdm()
        self._shown = now
        elapsed = now - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        percent = 100 * self.done // self.total if self.total > 0 else 100
        text = f"{self.name}: {self.done:,}/{self.total:,} {self.unit} ({percent}%)"
        if rate > 0:
            text += f", {tqdm.format_sizeof(rate)} {self.unit}/s"
        if failed:
            text += f", stopped after {tqdm.format_interval(elapsed)}"
        elif final:
            text += f", in {tqdm.format_interval(elapsed)}"
        else:
            left = (self.total - self.done) / rate if rate > 0 else None
            text += f", ETA {'?' if left is None else tqdm.format_interval(left)}"
        self._write(text)

    def __enter__(self) -> Stage:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close(failed=kind is not None)


def _to_stream(stream: TextIO) -> Callable[[str], None]:
    def write(text: str) -> None:
        print(text, file=stream, flush=True)

    return write


def _to_logger(logger: logging.Logger) -> Callable[[str], None]:
    def write(text: str) -> None:
        logger.info("%s", text)

    return write


#: Reports nothing (the default of the operations that are quiet unless asked).
QUIET = Progress(enabled=False)

__all__ = ["LOG_INTERVAL", "QUIET", "Progress", "ProgressArg", "ProgressFn", "Stage"]
