"""docs/configuration.md against fleetd/config.py: every key the code has is named there, every
key named there exists, and every default it states is the code's."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from fleetd.config import Settings

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
# Tables whose rows are not config keys.
NOT_KEYS = ("[[games]]",)


def _leaves(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    keys: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if name != "games" and isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.update(_leaves(annotation, f"{prefix}{name}."))
        else:
            keys[prefix + name] = field.get_default(call_default_factory=True)
    return keys


def _documented() -> tuple[dict[str, str | None], set[str]]:
    """Table rows, and the `[fleet]` prose's `key` (default), as {section.key: stated default
    (None where not one literal)}; and every name the `[fleet]` prose puts in backticks."""
    rows: dict[str, str | None] = {}
    fleet: list[str] = []
    section = ""
    for line in REFERENCE.read_text().splitlines():
        heading = re.match(r"^#+ .*?`\[([a-z_]+)\]`", line)
        if line.startswith("#"):
            section = heading.group(1) if heading else ""
            if "[[games]]" in line:
                section = "[[games]]"
            continue
        if section == "fleet":
            fleet.append(line)
            continue
        cells = [cell.strip() for cell in line.split("|")[1:-1]] if line.startswith("| `") else []
        if not cells or section in NOT_KEYS:
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        defaults = re.findall(r"`([^`]*)`", cells[1])
        for index, name in enumerate(names):
            inline = re.fullmatch(r"\[([a-z_]+)\] ([a-z_]+)", name)
            key = f"{inline.group(1)}.{inline.group(2)}" if inline else (f"{section}.{name}" if section else name)
            if cells[1] == "unset":
                rows[key] = "unset"
            else:
                rows[key] = defaults[index] if len(defaults) == len(names) else None
    text = " ".join(fleet)
    rows.update((f"fleet.{key}", default) for key, default in
                re.findall(r"`([a-z_]+)`\s+\((-?[0-9.]+|true|false)\b", text))
    return rows, {f"fleet.{key}" for key in re.findall(r"`([a-z_]+)`", text)}


def _same(stated: str, value: Any) -> bool:
    if stated == "unset":
        return value is None
    if isinstance(value, bool):
        return stated == str(value).lower()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(stated) == float(value)
    if isinstance(value, (list, dict)):
        return stated == str(value).replace("'", '"')
    return stated.strip('"') == str(value)


def test_every_config_key_is_in_the_reference_and_every_documented_one_exists() -> None:
    keys = _leaves(Settings)
    rows, prose = _documented()
    documented = set(rows) | prose
    assert sorted(set(keys) - documented - {"fleet.tiers", "games"}) == []
    assert sorted(set(rows) - set(keys)) == []


def test_every_documented_default_is_the_codes() -> None:
    keys = _leaves(Settings)
    wrong = []
    for key, stated in _documented()[0].items():
        if stated is None or key == "state_dir" or key not in keys:  # prose, or the environment's
            continue
        value = getattr(keys[key], "value", keys[key])  # an enum's
        if not _same(stated, value):
            wrong.append(f"{key}: the reference says {stated}, the code {value!r}")
    assert wrong == []


def test_every_games_entry_field_is_in_the_reference() -> None:
    from fleetd.config import GameSeed

    section = REFERENCE.read_text().split("### `[[games]]`", 1)[1]
    assert sorted(name for name in GameSeed.model_fields if f"`{name}`" not in section) == []
