"""Checks of the SAPO config dataclasses, shared so every section words a bad value the same way
(`<section>.<field> must be ...`) and a stored config with a key no field has is refused, not ignored."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any


def check_enabled(section: str, config: Any) -> None:
    if not isinstance(config.enabled, bool):
        raise ValueError(f"{section}.enabled must be a boolean")  # noqa: TRY004 - config convention


def check_ints(section: str, config: Any, bounds: Iterable[tuple[str, int, int]]) -> None:
    """Each named field an int (not a bool) in [low, high]."""
    for name, low, high in bounds:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{section}.{name} must be an int in [{low}, {high}], got {value!r}")


def check_numbers(section: str, config: Any, bounds: Iterable[tuple[str, float, float]]) -> None:
    """Each named field a finite number (not a bool) in [low, high]."""
    for name, low, high in bounds:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not low <= value <= high:
            raise ValueError(f"{section}.{name} must be in [{low}, {high}], got {value!r}")


def check_keys(cls: Any, data: Any, what: str) -> None:
    """Refuse `data` unless it is an object whose keys are all fields of the dataclass `cls`."""
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be an object")  # noqa: TRY004 (ValueError for every bad input)
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"unknown {what} keys: {unknown}")
