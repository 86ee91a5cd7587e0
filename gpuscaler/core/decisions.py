"""What a plan holds: decisions (each with its reason) and skips (each with why).

One frozen dataclass per kind of decision; `Decision` is their union, which actuators,
metrics and logs dispatch on with `match`. `as_record()` gives the line of
`decisions.jsonl`, the same for every kind (`detail`: what a preemption step carries).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import ClassVar, Literal

from gpuscaler.config import TIME_SLICE_LEVELS

DecisionKind = Literal["fragments", "replica_floor", "time_slice", "preemption"]

PreemptionAction = Literal[
    "request_checkpoint",
    "evict",
    "force_delete",
    "delete",
    "quarantine",
    "record_gone",
    "abort",
    "give_up",
    "confirm_released",
]


class _Change:
    """What every decision answers: which way it moves its target, and its record."""

    kind: ClassVar[DecisionKind]
    time: float
    target: str
    from_value: int | str
    to_value: int | str
    reason: str

    @property
    def direction(self) -> int:
        """+1 when the new value is more (fragments, replicas, a longer slice), -1 when less."""
        a, b = self.from_value, self.to_value
        ra = a if isinstance(a, int) else LEVEL_RANK.get(a, 0)
        rb = b if isinstance(b, int) else LEVEL_RANK.get(b, 0)
        return (rb > ra) - (rb < ra)

    def forecast_record(self) -> dict[str, float] | None:
        return None

    def detail_record(self) -> dict[str, str | int | float | None] | None:
        return None

    def as_record(self) -> dict[str, object]:
        return {
            "time": self.time,
            "kind": self.kind,
            "target": self.target,
            "from": self.from_value,
            "to": self.to_value,
            "reason": self.reason,
            "forecast": self.forecast_record(),
            "detail": self.detail_record(),
        }


class _Forecasted(_Change):
    forecast: Mapping[str, float] | None

    def forecast_record(self) -> dict[str, float] | None:
        return dict(self.forecast) if self.forecast is not None else None


@dataclass(frozen=True)
class _CountChange(_Forecasted):
    """A change of a whole number: a workload's replicas or a pool's fragments."""

    time: float
    target: str
    from_value: int
    to_value: int
    reason: str
    forecast: Mapping[str, float] | None = None


@dataclass(frozen=True)
class ReplicaFloorDecision(_CountChange):
    """Set a workload's replica floor (KEDA minReplicaCount, HPA minReplicas)."""

    kind: ClassVar[DecisionKind] = "replica_floor"


@dataclass(frozen=True)
class FragmentsDecision(_CountChange):
    """Set a node pool's fragments per GPU."""

    kind: ClassVar[DecisionKind] = "fragments"


@dataclass(frozen=True)
class TimeSliceDecision(_Forecasted):
    """Set a node pool's time slice level."""

    time: float
    target: str
    from_value: str
    to_value: str
    reason: str
    forecast: Mapping[str, float] | None = None
    kind: ClassVar[DecisionKind] = "time_slice"


@dataclass(frozen=True)
class PreemptionStep(_Change):
    """Move a victim (`target`, namespace/pod) from one tier to the next by `action`, for
    `beneficiary`, on `node`."""

    time: float
    target: str
    from_value: str
    to_value: str
    reason: str
    action: PreemptionAction
    beneficiary: str
    node: str
    kind: ClassVar[DecisionKind] = "preemption"

    def __post_init__(self) -> None:
        own = {"request_checkpoint": "CheckpointRequest", "evict": "Eviction"}
        if type(self) is PreemptionStep and self.action in own:
            raise TypeError(f"a {self.action} step is a {own[self.action]}, with its data")

    def detail_record(self) -> dict[str, str | int | float | None]:
        """action, beneficiary, node, then what the step's kind carries."""
        skip = {"time", "target", "from_value", "to_value", "reason"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}


@dataclass(frozen=True)
class CheckpointRequest(PreemptionStep):
    """The soft tier starts: ask the victim to checkpoint before `checkpoint_deadline`."""

    gpus: int
    priority: int
    uid: str
    checkpoint_deadline: float
    evicted_by: float
    gone_by: float


@dataclass(frozen=True)
class Eviction(PreemptionStep):
    """The hard tier: evict the victim through the Eviction API with this grace period."""

    grace_seconds: float


Decision = ReplicaFloorDecision | FragmentsDecision | TimeSliceDecision | PreemptionStep


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


LEVEL_RANK: Mapping[str, int] = MappingProxyType(
    {name: i for i, name in enumerate(TIME_SLICE_LEVELS)}
)
