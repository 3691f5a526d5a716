"""Durations as people read them. Standard library only: the CLI's tables use it without the store."""

import re


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?[smhd])+|\d+(?:\.\d+)?", re.ASCII)
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])", re.ASCII)


def parse_duration(text: str) -> float:
    """`90`, `90s`, `30m`, `2h`, `1d`, `1h30m` -> seconds: each unit once, largest first. A
    ValueError says what is wrong."""
    rest = text.strip().lower()
    if not rest:
        raise ValueError("empty: give a duration such as 30m, 2h or 1h30m")
    if not _DURATION.fullmatch(rest):
        raise ValueError(f"{text!r} is not a duration: use numbers with s, m, h or d (30m, 2h, 1h30m)")
    parts = _PART.findall(rest)
    if not parts:
        return float(rest)
    units = [unit for _, unit in parts]
    if units != sorted(set(units), key=lambda unit: -_UNITS[unit]):
        raise ValueError(f"{text!r}: give each unit once, largest first (1h30m, not 30m1h)")
    return sum(float(number) * _UNITS[unit] for number, unit in parts)
