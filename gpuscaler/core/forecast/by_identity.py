"""Values remembered for exact sequences of objects (issue 20): a batch's per-row objects
(scorings, interval states) made at one tick are read, in the same order, at the next; what
was found of them as arrays is remembered with them instead of gathered again row by row.

An entry is found only for the very objects it was put for, in order (identity, through
weak references: nothing is kept alive); it is forgotten when its first object goes, and
the oldest beyond `keep` entries go first (then found again the slow way).
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

_target = weakref.ref.__call__


class ByIdentity(Generic[K, V]):
    """A value for each remembered sequence of objects (`put`), found again by `get`."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._entries: dict[int, tuple[tuple[weakref.ref[K], ...], V]] = {}

    def get(self, items: Sequence[K | None]) -> V | None:
        """The value put for exactly `items` (in order), else None."""
        if not items:
            return None
        entry = self._entries.get(id(items[0]))
        if entry is None:
            return None
        refs, value = entry
        if len(refs) == len(items) and all(map(operator.is_, map(_target, refs), items)):
            return value
        return None

    def put(self, items: Sequence[K], value: V) -> None:
        """Remember `value` for `items` (not empty: nothing remembered for none)."""
        if not items:
            return
        key = id(items[0])
        refs = (weakref.ref(items[0], self._forget(key)), *map(weakref.ref, items[1:]))
        self._entries.pop(key, None)
        self._entries[key] = (refs, value)
        while len(self._entries) > self.keep:
            self._entries.pop(next(iter(self._entries), -1), None)

    def __contains__(self, key: int) -> bool:
        """Whether an entry is remembered under `key` (the id of its first object)."""
        return key in self._entries

    def _forget(self, key: int) -> Callable[[object], None]:
        entries = self._entries

        def forget(_: object) -> None:
            entries.pop(key, None)

        return forget
