"""The control ticks of a replay: every `control.interval` from the start, up to and
including its end, summed one interval at a time (the same floats wherever a replay
steps them)."""

from __future__ import annotations


def control_ticks(start: float, seconds: float, interval: float) -> list[float]:
    """start + interval, + interval, ... while at or before start + seconds."""
    ticks = []
    t = start + interval
    end = start + seconds
    while t <= end:
        ticks.append(t)
        t += interval
    return ticks
