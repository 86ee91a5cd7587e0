"""What a plan holds: decisions (each with its reason) and skips (each with why)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gpuscaler.config import TIME_SLICE_LEVELS

if TYPE_CHECKING:
    pass


DecisionKind = Literal["fragments", "replica_floor", "time_slice", "preemption"]


@dataclass(frozen=True)
class Decision:
    """One action of a plan: set `target`'s `kind` from `from_value` to `to_value`."""

    time: float
    kind: DecisionKind
    target: str
    from_value: int | str
    to_value: int | str
    reason: str
    forecast: Mapping[str, float] | None = None
    detail: Mapping[str, str | int | float | None] | None = None
    """What an adapter needs beyond from/to (preemption: action, beneficiary, node)."""

    @property
    def direction(self) -> int:
        return _direction(self.from_value, self.to_value)

    def as_record(self) -> dict[str, object]:
        """The fields of a decisions.jsonl line."""
        return {
            "time": self.time,
            "kind": self.kind,
            "target": self.target,
            "from": self.from_value,
            "to": self.to_value,
            "reason": self.reason,
            "forecast": dict(self.forecast) if self.forecast is not None else None,
            "detail": dict(self.detail) if self.detail is not None else None,
        }


@dataclass(frozen=True)
class Skip:
    """A target the tick did not act on, and why."""

    time: float
    kind: DecisionKind
    target: str
    reason: str
    invalid_input: bool
    """True when the input was missing, stale or not finite; False for a policy hold."""

    def as_record(self) -> dict[str, object]:
        return {
            "time": self.time,
            "kind": self.kind,
            "target": self.target,
            "skipped": True,
            "invalid_input": self.invalid_input,
            "reason": self.reason,
        }


def target_key(kind: DecisionKind, target: str) -> str:
    return f"{kind}:{target}"


_LEVEL_RANK: dict[str, int] = {name: i for i, name in enumerate(TIME_SLICE_LEVELS)}


def _direction(a: int | str, b: int | str) -> int:
    """+1 when b is more (fragments, replicas, a longer slice) than a, -1 when less."""
    ra = a if isinstance(a, int) else _LEVEL_RANK.get(a, 0)
    rb = b if isinstance(b, int) else _LEVEL_RANK.get(b, 0)
    return (rb > ra) - (rb < ra)
