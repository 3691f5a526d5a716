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

# Thousands only, in a whole number's digits: `1_000`, `-25_000_000`, `1_000.5`, `2_000e3`.
THOUSANDS = re.compile(r"\s*[+-]?\d{1,3}(?:_\d{3})+(?:\.\d*)?(?:[eE][+-]?\d+)?\s*")


def grouping_refusal(text: str) -> str | None:
    """Why `text`, which Python would read as a number, is not: None when it has no underscore,
    groups the digits by thousands, or is no number at all; otherwise the value and the forms
    fleetd takes."""
    if "_" not in text or THOUSANDS.fullmatch(text):
        return None
    try:
        float(text)  # Python's reading, underscores and all
    except ValueError:
        return None  # not a number in any reading: the caller's own check says what it is not
    parts = text.strip().split("_")
    digits = text.strip().replace("_", "")
    as_list = (f", or a list as [{', '.join(str(int(part)) for part in parts)}]"
               if all(part.isdigit() for part in parts) else "")
    return (f"{text!r} is not read as a number: underscores may only group digits by thousands "
            f"(1_000_000); write {digits} for that number{as_list}")
