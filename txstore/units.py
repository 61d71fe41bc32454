"""Durations as people write them: "90s", "15m", "6h", "30d", "2w", or seconds."""

from __future__ import annotations

import re
from datetime import timedelta

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
