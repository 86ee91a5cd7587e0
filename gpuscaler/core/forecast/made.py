"""The forecast's per-series frozen objects made without the dataclass `__init__` on the
hot path (issue 20). A frozen dataclass sets each field by `object.__setattr__` (some
3-4 us for seven fields here); a batch makes a fit state, two interval states, a scoring,
a forecast and a signal for every series at every tick. Each maker writes the instance's
`__dict__` directly, field by field in declaration order: the object is the one the
constructor makes (`tests/test_forecast_made.py` checks every field against
`dataclasses.fields`, so a field added later fails there, not silently here)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpuscaler.core.lazy import deferred_key
from gpuscaler.core.model import (
    FINITE_MARK,
    FitState,
    FloatArray,
    Forecast,
    IntervalState,
    IssuedInterval,
    Scored,
    Signal,
    pending_of,
)

Reason = tuple[Callable[..., str], tuple[object, ...]]
"""A reason to be made when first read: `make(*args)`."""

_new = object.__new__

_REASON, _PENDING = deferred_key("reason"), deferred_key("pending")
"""Where a maker leaves a field to `Lazy` (`lazy.deferred_key`)."""


def interval_state(
    level: float,
    checked_at: float,
    pending: tuple[IssuedInterval, ...] | None,
    points: int,
    misses: int,
    layout: tuple[tuple[float, float, int], ...] | None,
    bounds: FloatArray | None,
) -> IntervalState:
    """`IntervalState(level, checked_at, pending, points, misses, layout, bounds)`;
    `pending` None: made from `layout` and `bounds` when first read (`pending_of`)."""
    out: IntervalState = _new(IntervalState)
    d = out.__dict__
    d["level"], d["checked_at"] = level, checked_at
    if pending is None:
        assert layout is not None and bounds is not None
        d[_PENDING] = (pending_of, (layout, bounds))
    else:
        d["pending"] = pending
    d["points"], d["misses"], d["layout"], d["bounds"] = points, misses, layout, bounds
    return out


def carried(state: FitState, interval: IntervalState | None, scored: Scored | None) -> FitState:
    """`dataclasses.replace(state, interval=interval, scored=scored)`: the same fields,
    copied as a block (every series' state is carried on at every tick)."""
    out: FitState = _new(FitState)
    d = out.__dict__
    d.update(state.__dict__)
    d["interval"], d["scored"] = interval, scored
    return out


def scored(
    method: str | None,
    weights: tuple[float, ...],
    errors: Mapping[str, float],
    ses_best: int,
    ses_inv: FloatArray,
    abs_errors: FloatArray,
    peak: float,
    abs_recent: FloatArray,
    peak_recent: FloatArray,
    newest: float,
) -> Scored:
    """`Scored(method, weights, errors, ses_best, ses_inv, abs_errors, peak, abs_recent,
    peak_recent, newest)`."""
    out: Scored = _new(Scored)
    d = out.__dict__
    d["method"], d["weights"], d["errors"], d["ses_best"] = method, weights, errors, ses_best
    d["ses_inv"], d["abs_errors"], d["peak"] = ses_inv, abs_errors, peak
    d["abs_recent"], d["peak_recent"], d["newest"] = abs_recent, peak_recent, newest
    return out


def forecast(
    origin: float,
    step: float,
    mean: FloatArray,
    lower: FloatArray,
    upper: FloatArray,
    level: float,
    method: str,
    reason: str | Reason,
    last_value: float,
    errors: Mapping[str, float],
    peak_error: float,
    finite: bool | None = None,
) -> Forecast:
    """`Forecast(origin, step, mean, lower, upper, level, method, reason, last_value,
    errors, peak_error)`; a `reason` given as `(make, args)` is made when first read
    (`lazy.Lazy`). `finite`: `Forecast.is_finite` as found for its batch (`mark_finite`;
    its arrays must be read-only)."""
    out: Forecast = _new(Forecast)
    d = out.__dict__
    d["origin"], d["step"], d["mean"], d["lower"], d["upper"] = origin, step, mean, lower, upper
    d["level"], d["method"] = level, method
    if isinstance(reason, str):
        d["reason"] = reason
    else:
        d[_REASON] = reason
    d["last_value"], d["errors"], d["peak_error"] = last_value, errors, peak_error
    if finite is not None:
        d[FINITE_MARK] = finite
    return out


def signal(
    last_sample_time: float | None, forecast: Forecast | None, problem: str | None
) -> Signal:
    """`Signal(last_sample_time, forecast, problem)`."""
    out: Signal = _new(Signal)
    d = out.__dict__
    d["last_sample_time"], d["forecast"], d["problem"] = last_sample_time, forecast, problem
    return out
