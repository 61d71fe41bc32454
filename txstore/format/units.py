"""Sizes and durations as people write them: "64MB", "256KiB", "100GB"; "90s", "6h", "30d"."""

from __future__ import annotations

import re
from datetime import timedelta

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(size: int | str) -> int:
    """Bytes (a positive int) from an int or a string such as "64MB", "256KiB" or "100GB".

    ``TypeError`` for anything else (a bool or a float too), ``ValueError`` for text that is
    not a size or a size that is not positive.
    """
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    elif isinstance(size, str):
        match = _SIZE.fullmatch(size)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _SIZE_UNITS:
            raise ValueError(f"cannot read {size!r} as a size (e.g. 64MB, 256KiB, 100GB)")
        value = int(float(match.group(1)) * _SIZE_UNITS[unit])
    else:
        raise TypeError(f"a size is an int of bytes or a string such as '64MB', not {size!r}")
    if value <= 0:
        raise ValueError(f"size must be positive, got {size!r}")
    return value


_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")


def parse_duration(value: float | str | timedelta) -> float:
    """Seconds from a number of seconds, a ``timedelta``, or text such as "6h" or "1d12h"."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if re.fullmatch(r"\d+(?:\.\d+)?", text):
            seconds = float(text)
        elif text and re.fullmatch(f"(?:{_PART.pattern})+", text):
            seconds = sum(float(n) * _SECONDS[u] for n, u in _PART.findall(text))
        else:
            raise ValueError(f"cannot read {value!r} as a duration (e.g. 90s, 15m, 6h, 30d)")
    else:
        raise TypeError(f"a duration is seconds, a timedelta or a string, not {value!r}")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """The largest whole unit that fits: "7d", "6h", "90s"."""
    for unit in ("w", "d", "h", "m"):
        if seconds >= _SECONDS[unit] and seconds % _SECONDS[unit] == 0:
            return f"{int(seconds // _SECONDS[unit])}{unit}"
    return f"{seconds:g}s"
