"""Rows to records, written once: a record's field takes the row's attribute of the same name
unless the caller gives it (a rename, a conversion, a value from another table)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

R = TypeVar("R")


def to_record(cls: type[R], row: object, **given: Any) -> R:
    """A field that is neither given nor on the row fails here, at once (AttributeError),
    instead of reaching an API answer as a silent None."""
    values = {f.name: given[f.name] if f.name in given else getattr(row, f.name) for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**values)
