"""Strict reading of numbers written as text (annotations, labels, trigger metadata,
flags), and bounded echo of bad input. `int()` also takes "8_192", "+8192" and digits of
other scripts ("٤", and "²" passes `str.isdigit()` yet fails `int()`): none is what a
person or a controller writes, so none is taken."""

from __future__ import annotations

import re

_WHOLE = re.compile(r"-?[0-9]{1,18}")
"""An optional minus and ASCII digits; 18 of them fit an int64."""


def parse_count(text: str) -> int:
    """The whole number `text` spells (surrounding whitespace ignored; a minus is taken so
    the caller's range check can say what is wrong); ValueError otherwise."""
    stripped = text.strip()
    if not _WHOLE.fullmatch(stripped):
        raise ValueError(f"{shown(text)} is not a whole number")
    return int(stripped)


def shown(text: str, limit: int = 64) -> str:
    """`text` quoted for a message, its first `limit` characters and its length when
    longer: bad input is echoed bounded, never whole."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text):,} characters)"
