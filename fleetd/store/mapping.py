"""Rows to records, written once: a record's field takes the row's attribute of the same name
unless the caller gives it (a rename, a conversion, a value from another table)."""

from __future__ import annotations

from dataclasses import fields
from functools import cache
from typing import Any, TypeVar

R = TypeVar("R")


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))  # dataclasses.fields is slow: once per record type


def to_record(cls: type[R], row: object, **given: Any) -> R:
    """A field that is neither given nor on the row fails here, at once (AttributeError),
    instead of reaching an API answer as a silent None."""
    values = {name: given[name] if name in given else getattr(row, name) for name in _field_names(cls)}
    return cls(**values)
