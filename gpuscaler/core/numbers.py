"""Whole numbers that arrive as text (labels, annotations, metadata), read strictly."""

from __future__ import annotations

import re

_DIGITS = re.compile(r"[0-9]{1,18}")  # 18 digits: any int64 that is not negative


def strict_int(text: str) -> int:
    """`text` as a non-negative int, ASCII digits only. `int()` also takes "+1", "1_0",
    " 1" and non-ASCII digits ("²" passes str.isdigit() and fails int()): none of them is
    a number Kubernetes or Prometheus meant. ValueError names the text (40 characters)."""
    if not isinstance(text, str) or _DIGITS.fullmatch(text) is None:
        raise ValueError(f"{str(text)[:40]!r} is not a whole number (ASCII digits only)")
    return int(text)
