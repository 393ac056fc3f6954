"""What a record holds that its model does not name: keys that pass through `extra="allow"` untyped."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def untyped(value: Any, path: str = "") -> list[str]:
    """Every key under `value` (a validated model, or lists and dicts of them) that no model field names."""
    found: list[str] = []
    if isinstance(value, BaseModel):
        found += [f"{path}.{key}".lstrip(".") for key in (value.model_extra or {})]
        for name in type(value).model_fields:
            found += untyped(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += untyped(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            found += untyped(item, f"{path}.{key}")
    return found


def keys_written(value: Any) -> int:
    """How many keys a record as written holds, nested ones included."""
    if isinstance(value, dict):
        return len(value) + sum(keys_written(v) for v in value.values())
    if isinstance(value, list):
        return sum(keys_written(v) for v in value)
    return 0
