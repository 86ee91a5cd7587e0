"""Checks every decision shares: can the input be trusted, is the target cooling down,
has the trigger held long enough."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from gpuscaler.core.decisions import Decision, DecisionKind, Skip
from gpuscaler.core.model import Signal, TargetHistory


@dataclass(frozen=True, slots=True)
class Outcome:
    """A decision for one target, or why there is none, and its history after this tick;
    `blocked_until_preempted`: the fragments a pool waits for pods holding more to go."""

    history: TargetHistory
    decision: Decision | None = None
    skip: Skip | None = None
    blocked_until_preempted: int | None = None


def input_problem(signal: Signal, now: float, staleness: float) -> str | None:
    """Why `signal` cannot be acted on, or None when it can."""
    if signal.problem is not None:
        return signal.problem
    if signal.last_sample_time is None:
        return "no samples"
    age = now - signal.last_sample_time
    if age > staleness:
        return f"stale: newest sample is {age:.0f}s old, limit {staleness:.0f}s"
    if signal.forecast is None:
        return "no forecast"
    if not signal.forecast.is_finite() or not math.isfinite(signal.forecast.last_value):
        return "forecast is not finite (NaN or Inf)"
    return None


def invalid(kind: DecisionKind, target: str, now: float, reason: str, h: TargetHistory) -> Outcome:
    # Missing data resets a pending trigger: the trigger must hold on data we trust.
    skip = Skip(now, kind, target, f"no action: {reason}", invalid_input=True)
    return Outcome(sustain(h, 0, now), skip=skip)


def hold(kind: DecisionKind, target: str, now: float, reason: str, h: TargetHistory) -> Outcome:
    return Outcome(h, skip=Skip(now, kind, target, reason, invalid_input=False))


def cooling_down(h: TargetHistory, now: float, cooldown: float) -> float:
    """Seconds of cooldown left (0 when none)."""
    if h.last_change_at is None:
        return 0.0
    return max(0.0, h.last_change_at + cooldown - now)


def sustain(h: TargetHistory, direction: int, now: float) -> TargetHistory:
    """History with the pending trigger for `direction` started (or kept) at now; a
    direction of 0 clears it."""
    since = None if direction == 0 else now
    if h.pending_direction == direction and (h.pending_since is None) == (since is None):
        return h
    return replace(h, pending_since=since, pending_direction=direction)


def held_for(h: TargetHistory, now: float) -> float:
    return 0.0 if h.pending_since is None else now - h.pending_since
