"""Reading a TOML file the way every fleetd file is read: UTF-8, with or without the byte-order
mark Windows editors (Notepad among them) put first. TOML itself has none, and tomllib took the
mark for a statement ("Invalid statement (line 1, column 1)"), an error nothing in the file shows."""

from __future__ import annotations

import codecs
import tomllib
from pathlib import Path
from typing import Any


def toml_text(data: bytes) -> str:
    """The file's text (UnicodeDecodeError where it is not UTF-8), without a leading BOM."""
    return data.removeprefix(codecs.BOM_UTF8).decode("utf-8")


def read_toml(path: Path) -> dict[str, Any]:
    """The document (OSError, UnicodeDecodeError or tomllib.TOMLDecodeError as they come)."""
    return tomllib.loads(toml_text(path.read_bytes()))
