"""Durations as people read them. Standard library only: the CLI's tables use it without the store."""


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


def parse_duration(text: str) -> float:
    """`90`, `90s`, `30m`, `2h`, `1d`, `1h30m` -> seconds. A ValueError names what is wrong."""
    rest = text.strip().lower()
    if not rest:
        raise ValueError("empty: give a duration such as 30m, 2h or 1h30m")
    if rest.replace(".", "", 1).isdigit():
        return float(rest)
    total, number = 0.0, ""
    for char in rest:
        if char.isdigit() or char == ".":
            number += char
        elif char in _UNITS and number and number.count(".") <= 1:
            total += float(number) * _UNITS[char]
            number = ""
        else:
            raise ValueError(f"{text!r} is not a duration: use numbers with s, m, h or d (30m, 2h, 1h30m)")
    if number:
        raise ValueError(f"{text!r} ends in a number without a unit: use s, m, h or d (30m, 2h, 1h30m)")
    return total
