"""The tiers a victim goes through, the table of allowed changes, and the one
place a step is checked against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

from gpuscaler.core.decisions import Decision, Skip
from gpuscaler.core.preemption.views import VictimState

KIND: Final = "preemption"
Tier = Literal["none", "soft", "hard", "cleanup", "done", "aborted", "given_up", "quarantined"]
TRANSITIONS: Final[Mapping[str, frozenset[str]]] = {
    "none": frozenset({"soft"}),
    "soft": frozenset({"hard", "cleanup", "aborted"}),
    "hard": frozenset({"hard", "cleanup", "given_up"}),
    "cleanup": frozenset({"done", "quarantined"}),
    "done": frozenset(),
    "aborted": frozenset(),
    "given_up": frozenset(),
    "quarantined": frozenset(),
}
IN_FLIGHT: Final = frozenset({"soft", "hard", "cleanup"})


class TransitionError(ValueError):
    """A tier change the table does not allow."""


def check_transition(old: str, new: str) -> None:
    if new not in TRANSITIONS.get(old, frozenset()):
        raise TransitionError(f"preemption tier {old} -> {new} is not allowed")


def step_decision(
    now: float, state: VictimState, to: str, action: str, reason: str, **extra: str | int | float
) -> Decision:
    check_transition(state.tier, to)
    return Decision(
        now,
        KIND,
        state.victim,
        state.tier,
        to,
        reason,
        detail={"action": action, "beneficiary": state.beneficiary, "node": state.node, **extra},
    )


def hold(now: float, target: str, reason: str) -> Skip:
    return Skip(now, KIND, target, reason, invalid_input=False)
