"""The tiers a victim goes through, the table of allowed changes, and the one
place a step is checked against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from gpuscaler.core.decisions import (
    CheckpointRequest,
    Eviction,
    PreemptionAction,
    PreemptionStep,
    Skip,
)
from gpuscaler.core.preemption.views import VictimState

KIND: Final = "preemption"
TRANSITIONS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "none": frozenset({"soft"}),
        "soft": frozenset({"hard", "cleanup", "aborted"}),
        "hard": frozenset({"hard", "cleanup", "given_up"}),
        "cleanup": frozenset({"done", "quarantined"}),
        "done": frozenset(),
        "aborted": frozenset(),
        "given_up": frozenset(),
        "quarantined": frozenset(),
    }
)
IN_FLIGHT: Final = frozenset({"soft", "hard", "cleanup"})


class TransitionError(ValueError):
    """A tier change the table does not allow."""


def check_transition(old: str, new: str) -> None:
    if new not in TRANSITIONS.get(old, frozenset()):
        raise TransitionError(f"preemption tier {old} -> {new} is not allowed")


def step_decision(
    now: float, state: VictimState, to: str, action: PreemptionAction, reason: str
) -> PreemptionStep:
    """The step `action` taking `state`'s victim to tier `to`, checked against the table."""
    check_transition(state.tier, to)
    return PreemptionStep(
        now, state.victim, state.tier, to, reason, action, state.beneficiary, state.node
    )


def evict_step(now: float, state: VictimState, reason: str, grace_seconds: float) -> Eviction:
    """The hard tier's eviction of `state`'s victim, checked against the table."""
    check_transition(state.tier, "hard")
    return Eviction(
        now,
        state.victim,
        state.tier,
        "hard",
        reason,
        "evict",
        state.beneficiary,
        state.node,
        grace_seconds,
    )


def checkpoint_step(
    now: float, state: VictimState, reason: str, soft_grace: float, eviction_grace: float
) -> CheckpointRequest:
    """A new victim's soft tier: ask it to checkpoint within `soft_grace`."""
    check_transition(state.tier, "soft")
    return CheckpointRequest(
        now,
        state.victim,
        state.tier,
        "soft",
        reason,
        "request_checkpoint",
        state.beneficiary,
        state.node,
        gpus=state.gpus,
        priority=state.priority,
        uid=state.uid,
        checkpoint_deadline=now + soft_grace,
        evicted_by=now + soft_grace,
        gone_by=now + soft_grace + eviction_grace,
    )


def hold(now: float, target: str, reason: str) -> Skip:
    return Skip(now, KIND, target, reason, invalid_input=False)
