"""Durations, sizes and the strict model every config section builds on."""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationInfo, field_validator

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Parse "500ms", "30s", "5m", "1h", "1h30m" into seconds; raise ValueError otherwise."""
    if isinstance(text, bool) or not isinstance(text, str):
        raise ValueError(
            f"expected a duration string such as '500ms', '30s', '5m' or '1h', got {text!r}"
        )
    stripped = text.strip()
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(stripped):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(stripped) or not stripped:
        raise ValueError(
            f"bad duration {text!r}: expected a number with a unit ms, s, m, h or d "
            "(e.g. '500ms', '30s', '5m', '1h')"
        )
    if total > MAX_DURATION:
        raise DurationTooLong(f"duration {text!r} is longer than a year: the maximum is 366d")
    return total


class DurationTooLong(ValueError):
    """A duration written right but past MAX_DURATION: named apart so that a caller
    trying other formats next reports the maximum, not the format."""


MAX_DURATION = 366 * 86400.0
"""Longer than any sensible window, cooldown or timeout: a typo such as '99999d'."""
MAX_CONFIG_BYTES = 1 << 20
"""A config file larger than this is refused before parsing (the shipped one is 10 KB)."""


def format_duration(seconds: float) -> str:
    if 0 < seconds < 1:
        return f"{round(seconds * 1000)}ms"
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


Seconds = Annotated[float, BeforeValidator(parse_duration)]
"""A duration written in YAML as "30s"; held as float seconds."""


_NUMBERS = (int, float, int | None, float | None)


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML's `true` is not the number 1: pydantic's lax mode would take it as one."""
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and field.annotation in _NUMBERS:
            raise ValueError(f"expected a number, got {str(value).lower()}")
        return value


M = TypeVar("M", bound=BaseModel)


def only_sections(
    overrides: dict[str, dict[str, Any]], allowed: dict[str, type[BaseModel]], owner: str
) -> dict[str, dict[str, Any]]:
    unknown = set(overrides) - set(allowed)
    if unknown:
        raise ValueError(f"cannot override {sorted(unknown)} ({owner} overrides {sorted(allowed)})")
    return overrides
