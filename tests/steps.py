"""Preemption steps out of a tuple of decisions, typed (each one must be a step)."""

from __future__ import annotations

from collections.abc import Iterable

from gpuscaler.core.decisions import Decision, PreemptionStep


def steps(decisions: Iterable[Decision]) -> list[PreemptionStep]:
    out = [d for d in decisions if isinstance(d, PreemptionStep)]
    assert len(out) == len(list(decisions)), "a decision that is not a preemption step"
    return out
