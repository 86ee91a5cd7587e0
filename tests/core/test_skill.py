"""The forecast's skill self-assessment: the floor steps back to reactive sizing when the
forecast placed its extra capacity no better than flat headroom, and returns when it
does again."""

from __future__ import annotations

import numpy as np
import pytest
from builders import NOW, floor_of, forecast, workload_obs
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpuscaler.config import ReplicasConfig
from gpuscaler.core.model import Signal, TargetHistory
from gpuscaler.core.replicas import Skill, assess, in_fallback, shift_at_cost, window_max

TICK = 30.0
CFG = ReplicasConfig(max_replicas=200)


def run(
    values: np.ndarray, paths: tuple[np.ndarray, np.ndarray], h: TargetHistory, t0: float
) -> tuple[TargetHistory, list[str]]:
    """Tick the floor decider over `values` (observed) with forecasts (mean, upper)."""
    reasons = []
    for i, (v, mean, up) in enumerate(zip(values, *paths, strict=True)):
        now = t0 + i * TICK
        f = forecast(float(mean), float(up), last=float(v))
        obs = workload_obs(Signal(now - 1, f), floor=4, share=1.0)
        out = floor_of(obs, CFG, 120.0, h, now)
        h = out.history
        reasons.append(out.decision.reason if out.decision else out.skip.reason)  # type: ignore[union-attr]
    return h, reasons


def white_noise(n: int, seed: int = 0) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    values = 300 + np.random.default_rng(seed).normal(0, 30, n)
    # An honest forecast of noise: its level, with a band.
    return values, (np.full(n, 300.0), np.full(n, 330.0))


def predictable(n: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    t = np.arange(n + 4) * TICK
    values = 300 + 150 * np.sin(2 * np.pi * t / 1200.0)  # a 20-minute cycle
    ahead = np.array([values[i + 1 : i + 5].max() for i in range(n)])  # the next 2 minutes
    return values[:n], (ahead, ahead + 5)


@pytest.mark.parametrize("seed", range(6))
def test_the_fallback_engages_on_a_white_noise_workload_and_says_why(seed: int) -> None:
    values, paths = white_noise(150, seed)
    h, reasons = run(values, paths, TargetHistory(), NOW)
    assert h.fallback
    assert "skill fallback" in reasons[-1] and "sizes for the observed demand alone" in reasons[-1]


def test_the_fallback_disengages_when_the_workload_becomes_predictable() -> None:
    values, paths = white_noise(150)
    h, _ = run(values, paths, TargetHistory(), NOW)
    assert h.fallback
    values, paths = predictable(150)
    h, reasons = run(values, paths, h, NOW + 150 * TICK)
    assert not h.fallback
    assert "skill fallback" not in reasons[-1]
    assert any("forecast upper" in r for r in reasons[-40:])  # rising: ahead of the peak


def test_a_predictable_workload_never_falls_back() -> None:
    values, paths = predictable(150)
    h, _ = run(values, paths, TargetHistory(), NOW)
    skill = assess(h.seen[None], NOW + 149 * TICK, 120.0, 300.0, 20)[0]
    assert skill.score is not None and skill.score > 0.5
    assert not h.fallback


def records(n: int, value: float | np.ndarray, upper: float, mean: float) -> np.ndarray:
    """`n` tick records, one a tick from NOW: `value` observed each, the forecast's
    `upper` bound and `mean` peak (values may vary by tick when arrays)."""
    t = NOW + TICK * np.arange(n)
    return np.stack(np.broadcast_arrays(t, value, upper, mean), axis=1)[None]


def test_before_enough_origins_are_scored_the_floor_stays_reactive() -> None:
    skill = assess(records(10, 100.0, 500.0, 400.0), NOW + 9 * TICK, 120.0, 300.0, 20)[0]
    assert skill.score is None
    assert in_fallback(False, skill, 0.05, 0.15)


def test_between_the_thresholds_the_state_holds_either_way() -> None:
    middle = Skill(0.1, 50)
    assert in_fallback(True, middle, 0.05, 0.15)
    assert not in_fallback(False, middle, 0.05, 0.15)


def test_old_records_leave_the_window() -> None:
    """Records are kept for the skill window and the reserve window, whichever is longer,
    plus a lead time or a stabilization window, whichever is longer: here 30 + 5 minutes."""
    cfg = ReplicasConfig(skill_window="30m", reserve_window="10m")
    h = TargetHistory()
    for i in range(200):
        now = NOW + i * TICK
        obs = workload_obs(Signal(now - 1, forecast(100.0, 120.0)), floor=4)
        h = floor_of(obs, cfg, 120.0, h, now).history
    assert len(h.seen) == 2100 / TICK
    assert h.seen[0, 0] == NOW + 199 * TICK - 2100 + TICK


def test_only_origins_within_the_span_are_scored_when_the_records_reach_further_back() -> None:
    """The records may be kept longer than the skill window (for the burst reserve): the
    assessment still scores the skill window alone."""
    recs = records(400, 100.0 + np.arange(400) % 7, 120.0, 110.0)
    now = NOW + 399 * TICK
    everything = assess(recs, now, 120.0, 300.0, 1)[0]
    windowed = assess(recs, now, 120.0, 300.0, 1, span=3600.0)[0]
    # Origins at least one lead (120 s) old: all but the last 4 ticks, or those of the span.
    assert everything.origins == 400 - 4
    assert windowed.origins == 3600 / TICK - 4


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.0, 1000.0), min_size=8, max_size=60),
    st.floats(0.0, 500.0),
    st.floats(-200.0, 200.0),
)
def test_skill_is_zero_without_a_reactive_shortfall(
    values: list[float], band: float, bias: float
) -> None:
    """A demand that never rises above the highest of its window before leaves reactive
    sizing no shortfall: nothing for a forecast to gain, whatever it said."""
    falling = np.sort(np.asarray(values))[::-1]
    recs = records(len(falling), falling, 0.0, 0.0)
    recs[0, :, 3] = falling + bias
    recs[0, :, 2] = recs[0, :, 3] + band
    skill = assess(recs, NOW + (len(falling) - 1) * TICK, 120.0, 300.0, 1)[0]
    assert skill.origins == len(falling) - 4
    assert skill.score == 0.0


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 40).flatmap(
        lambda n: st.tuples(
            st.lists(st.floats(-1e3, 1e4), min_size=n, max_size=n),
            st.lists(st.floats(-1e3, 1e4), min_size=n, max_size=n),
            st.lists(st.booleans(), min_size=n, max_size=n),
        )
    ),
    st.floats(0.0, 1e5),
)
def test_the_level_floor_costs_what_the_forecasts_extra_capacity_does(
    rows: tuple[list[float], list[float], list[bool]], extra: float
) -> None:
    reactive, base = np.asarray([rows[0]]), np.asarray([rows[1]])
    scored = np.asarray([rows[2]])
    assume(scored.any())
    c = shift_at_cost(reactive, base, np.asarray([extra]), scored)[0]
    cost = (np.maximum(reactive, base + c) - reactive)[scored].sum()
    scale = np.abs(reactive).sum() + np.abs(base).sum() + extra + 1.0
    assert cost == pytest.approx(extra, abs=1e-9 * scale)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3), min_size=0, max_size=30),
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), min_size=1, max_size=10),
)
def test_a_window_maximum_is_the_highest_value_of_its_window(
    values: list[float], windows: list[tuple[int, int]]
) -> None:
    v = np.asarray([values, [-x for x in values]]).reshape(2, len(values))
    start = np.asarray([min(a, b, len(values)) for a, b in windows])
    stop = np.asarray([min(max(a, b), len(values)) for a, b in windows])
    got = window_max(v, start, stop)
    for j, (a, b) in enumerate(zip(start.tolist(), stop.tolist(), strict=True)):
        for row in range(2):
            assert got[row, j] == (v[row, a:b].max() if b > a else -np.inf)
