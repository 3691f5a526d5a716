"""Underscores in a number given as text, read one way wherever a user types one: the CLI's
`--hp`/`--health`/`games set` values and integer options, and the API's game fields sent as
JSON strings (a fleet file's quoted values, a config `[[games]]` entry's). Python's `int()`
and pydantic's lax int both take any underscore between digits, so `net_arch = "64_64"`, meant
as the list [64, 64], or a mistyped `64_64`, became 6464 without a word. Accepted: underscores
grouping the digits by thousands (`1_000_000`), as numbers are written; refused, naming the
value and the forms taken: any other. A TOML integer literal (`total_timesteps = 64_64`, no
quotes) is TOML's to read, and means 6464 by its spec: it never reaches this as text.

Standard library only: the CLI's fast paths import it."""

from __future__ import annotations

import re

# Thousands only, counted from the decimal point both ways: `1_000`, `-25_000_000`, `1_000.5`,
# `2_000e3`, `0.000_001`, `.000_5`.
_WHOLE = r"(?:\d{1,3}(?:_\d{3})+|\d+)"
_FRACTION = r"(?:\d{3}(?:_\d{3})*_\d{1,3}|\d*)"
THOUSANDS = re.compile(rf"\s*[+-]?(?:{_WHOLE}(?:\.{_FRACTION})?|\.{_FRACTION})(?:[eE][+-]?\d+)?\s*")
# A number written with underscores anywhere (`64__64`, `64_`, `_64`, `1e_5`): refused as one,
# not read past (Python refuses these, and a reader that drops the underscores joins them).
_UNDERSCORED = re.compile(r"\s*[+-]?[\d_]*\.?[\d_]*(?:[eE][+-]?[\d_]+)?\s*")


def grouping_refusal(text: str, list_hint: bool = True) -> str | None:
    """Why `text`, a number but for its underscores, is not read as one: None when it has no
    underscore, groups the digits by thousands, or is no number at all; otherwise the value and
    the forms fleetd takes (`list_hint`: "or a list as [64, 64]" too, where a list is taken)."""
    if "_" not in text or THOUSANDS.fullmatch(text):
        return None
    digits = text.strip().replace("_", "")
    if not _UNDERSCORED.fullmatch(text):
        return None  # not a number in any reading: the caller's own check says what it is not
    try:
        float(digits)
    except ValueError:  # no digit at all (`_`, `_.`, `_e5`): no number either
        return None
    parts = text.strip().split("_")
    as_list = (f", or a list as [{', '.join(str(int(part)) for part in parts)}]"
               if list_hint and all(part.isdigit() for part in parts) else "")
    return (f"{text!r} is not read as a number: underscores may only group digits by thousands "
            f"(1_000_000, 0.000_001); write {digits} for that number{as_list}")
