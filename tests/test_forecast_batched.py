"""The forecast phase's per-tick work batched across series (issue 18) gives, bit for bit,
what the code before it gave one series at a time (kept in tests/forecast_reference.py):
the forecasts, their reasons and intervals, and the states carried to the next tick."""

from __future__ import annotations

import math
from dataclasses import replace

import forecast_reference as old
import numpy as np
import pytest
from builders import NOW
from test_interval_resolve import reference as resolve_one

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast import forecast_series
from gpuscaler.core.forecast.assembly import Batch, _clipped
from gpuscaler.core.forecast.engines import (
    LeastSquaresArima,
    inverse_root_modulus,
    make_engine,
    refit_or_reuse,
)
from gpuscaler.core.forecast.ensemble import SesTape, ses_last
from gpuscaler.core.forecast.intervals import issue_rows, resolve, resolve_rows
from gpuscaler.core.forecast.scored import clip_rows
from gpuscaler.core.model import FitState, FloatArray, IntervalState, IssuedInterval, Series, Signal
from gpuscaler.core.snapshot import bucket_peak, bucket_peaks, window_mean, window_means

STEP = 5.0
POINTS = 240  # 20 min of 5 s samples: 120 buckets of 10 s
TICK = 30.0
CFG = ForecastConfig()  # 10 s buckets, 5 min horizon, refit every 5 min


def _data(n: int, seed: int) -> FloatArray:
    """n series of every kind the forecast meets: noisy walks with bursts, gaps of a
    sample and of minutes, a flat one (its fit is dropped), one that starts late (too
    little history at first), one with no samples."""
    rng = np.random.default_rng(seed)
    length = POINTS + 40 * int(TICK / STEP)
    walk = np.cumsum(rng.normal(0, 1.0, (n, length)), axis=1)
    bursts = (rng.random((n, length)) < 0.02) * rng.uniform(5, 40, (n, 1))
    data = 50 + walk + bursts + rng.normal(0, 2.0, (n, length))
    data[rng.random((n, length)) < 0.02] = np.nan
    data[1, 300:420] = np.nan  # a 10-minute gap
    data[2] = 7.0  # flat
    data[3, :200] = np.nan  # starts late
    data[4] = np.nan  # no samples
    data[5] = 100.0 + 30.0 * np.sin(np.arange(length) / 15.0)  # above the pools' clip
    return data


def _series(data: FloatArray, k: int, other_grid: bool) -> tuple[list[Series | None], float]:
    now = NOW + k * TICK
    first = k * int(TICK / STEP)
    out: list[Series | None] = [
        Series(now - STEP * (POINTS - 1), STEP, row[first : first + POINTS]) for row in data
    ]
    out.append(None)
    if other_grid:  # a shorter window: the series are not all on one grid
        out[0] = Series(now - STEP * (POINTS - 61), STEP, data[0, first + 60 : first + POINTS])
    return out, now


def _signal(s: Signal) -> tuple[object, ...]:
    f = s.forecast
    if f is None:
        return (s.last_sample_time, s.problem)
    arrays = tuple(a.tobytes() for a in (f.mean, f.lower, f.upper))
    head = (s.last_sample_time, s.problem, f.origin, f.step, f.level, f.method, f.reason)
    return (*head, f.last_value, sorted(f.errors.items()), f.peak_error, *arrays)


def _state(s: FitState) -> tuple[object, ...]:
    interval = s.interval
    iv = (
        None
        if interval is None
        else (
            interval.level,
            interval.checked_at,
            interval.pending,
            interval.points,
            interval.misses,
        )
    )
    sc = s.scored
    # A scoring that names no method is never read: its errors are not rolled on (fc4),
    # only what its refit made is compared.
    scored = (
        None
        if sc is None
        else (sc.method, sc.weights, sorted(sc.errors.items()), sc.ses_best, sc.ses_inv.tobytes())
        if sc.method is None
        else (
            sc.method,
            sc.weights,
            sorted(sc.errors.items()),
            sc.ses_best,
            sc.peak,
            sc.newest,
            *tuple(a.tobytes() for a in (sc.ses_inv, sc.abs_errors, sc.abs_recent, sc.peak_recent)),
        )
    )
    return (s.fitted_at, s.intercept, s.phi, s.sigma2, iv, scored)


@pytest.mark.parametrize(
    ("seed", "clip", "other_grid", "cfg"),
    [
        (1, (0.0, 100.0), False, CFG),
        (2, (0.0, None), False, CFG),
        (3, (0.0, None), True, CFG),
        (4, (0.0, 100.0), False, ForecastConfig(ensemble=False)),  # the engine's own paths
    ],
)
def test_a_batched_tick_forecasts_and_keeps_exactly_what_one_series_at_a_time_did(
    seed: int, clip: tuple[float, float | None], other_grid: bool, cfg: ForecastConfig
) -> None:
    data = _data(10, seed)
    keys: list[str | None] = [*(f"s{i}" for i in range(data.shape[0])), "none"]
    keys[6] = None  # a series without a kept state
    new: dict[str, FitState] = {}
    ref: dict[str, FitState] = {}
    methods = set()
    for k in range(25):  # refits at every tenth tick
        series, now = _series(data, k, other_grid)
        got_states: dict[str, FitState] = {}
        want_states: dict[str, FitState] = {}
        got = forecast_series(series, cfg, now, None, clip, keys, new, got_states)
        want = old.forecast_series(series, cfg, now, None, clip, keys, ref, want_states)
        assert [_signal(s) for s in got] == [_signal(s) for s in want], f"tick {k}"
        assert sorted(got_states) == sorted(want_states)
        for key, state in got_states.items():
            assert _state(state) == _state(want_states[key]), f"tick {k}, {key}"
        methods |= {s.forecast.method for s in got if s.forecast is not None}
        new, ref = _last_value(got_states, k), _last_value(want_states, k)
    want_methods = {"ensemble", "last_value"} if cfg.ensemble else {"last_value", "arima(5,1,0)"}
    assert methods == want_methods  # every kind of row was in the batches


def _last_value(states: dict[str, FitState], k: int) -> dict[str, FitState]:
    """`states` with two series' kept scorings choosing the last value (a choice these
    windows seldom make) after tick 12, so that the batch holds rows of both choices."""
    out = dict(states)
    for key in ("s0", "s5") if k >= 12 else ():
        state = out.get(key)
        if state is not None and state.scored is not None and state.scored.method is not None:
            out[key] = replace(state, scored=replace(state.scored, method="last_value"))
    return out


def _pending(rng: np.random.Generator, now: float, count: int) -> tuple[IssuedInterval, ...]:
    out = []
    for _ in range(count):
        origin = now - 10.0 * int(rng.integers(0, 40))
        size = int(rng.integers(1, 8))  # (the reference cannot check an empty one)
        lower = rng.normal(50, 10, size)
        upper = lower + rng.uniform(0, 20, size)
        out.append(IssuedInterval(origin, 10.0, tuple(lower.tolist()), tuple(upper.tolist())))
    return tuple(out)


@pytest.mark.parametrize("seed", range(8))
def test_resolving_many_rows_at_once_equals_resolving_each_on_its_own(seed: int) -> None:
    rng = np.random.default_rng(seed)
    now, n, t = 10_000.0, 30, 25
    hist = rng.normal(55, 12, (n, t))
    hist[rng.random((n, t)) < 0.1] = np.nan
    states: list[IntervalState | None] = [
        None
        if r % 7 == 0
        else IntervalState(
            float(rng.uniform(0.5, 0.99)),
            now - 10.0 * int(rng.integers(1, 5)),
            _pending(rng, now, int(rng.integers(0, 6))),
            int(rng.integers(0, 50)),
            int(rng.integers(0, 5)),
        )
        for r in range(n)
    ]
    got = resolve_rows(states, hist, now, 10.0, 0.9)
    want = [resolve_one(s, hist[r], now, 10.0, 0.9) for r, s in enumerate(states)]
    assert got == want
    assert any(g.points for g in got) and any(g.pending for g in got)


def test_intervals_issued_in_a_batch_are_checked_as_ones_made_from_tuples() -> None:
    start = IntervalState(0.9, NOW)
    lower = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    issued = issue_rows([start, start], lower, lower + 2.0, 10.0)
    assert issued[0].layout is issued[1].layout == ((NOW, 10.0, 3),)  # one object
    again = issue_rows(
        [resolve(s, np.array([1.0]), NOW + 10.0, 10.0, 0.9) for s in issued],
        lower + 1.0,
        lower + 3.0,
        10.0,
    )
    for r, state in enumerate(again):
        assert state.bounds is not None and not state.bounds.flags.writeable
        p = state.pending
        assert state.bounds.tolist() == [[*p[0].lower, *p[1].lower], [*p[0].upper, *p[1].upper]]
        assert p[-1].lower == tuple((lower[r] + 1.0).tolist())
        # the same state without the arrays kept
        plain = IntervalState(state.level, state.checked_at, p, state.points, state.misses)
        row = np.array([2.5, 4.0, 9.0, 5.5])
        for now in (NOW + 20.0, NOW + 30.0, NOW + 40.0):
            got = resolve(state, row, now, 10.0, 0.9)
            assert got == resolve(plain, row, now, 10.0, 0.9)
            assert got.layout == tuple((q.origin, q.step, len(q.lower)) for q in got.pending)
            assert got.bounds is not None
            assert got.bounds.tolist() == [
                [v for q in got.pending for v in q.lower],
                [v for q in got.pending for v in q.upper],
            ]
    other = again[1]  # with the arrays kept and without
    mixed = [again[0], IntervalState(0.8, other.checked_at, other.pending, 4, 1)]
    rows = np.array([[2.5, 4.0, 9.0], [5.0, 7.0, 1.0]])
    got_rows = resolve_rows(mixed, rows, NOW + 30.0, 10.0, 0.9)
    assert got_rows == [resolve_one(s, rows[r], NOW + 30.0, 10.0, 0.9) for r, s in enumerate(mixed)]


def test_coefficients_reused_between_refits_keep_the_stability_found_at_the_refit() -> None:
    data = _data(10, 4)[:, :POINTS]
    hist = data[:, ::2]
    engine = make_engine(CFG)
    assert isinstance(engine, LeastSquaresArima)
    keys: list[str | None] = [f"s{i}" for i in range(10)]
    fitted, states, refit = refit_or_reuse(engine, hist, keys, {}, NOW, 300.0)
    assert refit == 10 and fitted.modulus is not None
    want = inverse_root_modulus(fitted.phi)
    assert fitted.modulus.tobytes() == want.tobytes()
    again, same, refit = refit_or_reuse(engine, hist, keys, states, NOW + 30.0, 300.0)
    assert refit == 0 and again.modulus is not None
    assert again.modulus.tobytes() == want.tobytes()
    assert all(same[k] is states[k] for k in states)  # reused as they are
    unknown = {k: FitState(s.fitted_at, s.intercept, s.phi, s.sigma2) for k, s in states.items()}
    third, _, _ = refit_or_reuse(engine, hist, keys, unknown, NOW + 30.0, 300.0)
    assert third.modulus is not None and third.modulus.tobytes() == want.tobytes()


@pytest.mark.parametrize("seed", range(5))
def test_recent_peaks_found_together_equal_those_found_one_by_one(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = rng.normal(300, 50, (12, 200))
    rows[rng.random(rows.shape) < 0.2] = np.nan
    rows[3, -60:] = np.nan  # nothing in the last window
    start = NOW - 0.5 * 199
    series: list[Series | None] = [Series(start, 0.5, row) for row in rows]
    series += [
        None,
        Series(start, 0.5, np.array([])),
        Series(start + 3.0, 0.5, rows[0][:-6]),  # another grid
        Series(start, 1.0, rows[1][::2]),
    ]
    # `now` a multiple of the spacing off the newest sample (NOW + 0.5: the newest one step
    # before `now`, as a tick sees it), so `now - window` falls on a sample: the edge that
    # decides whether the oldest bucket is whole (snapshot._buckets).
    offsets = [k / 2 for k in range(-6, 6)]
    cases = [(NOW + k, w, s) for k in offsets for w, s in ((30.0, 10.0), (60.0, 5.0))]
    for now, window, step in [*cases, (NOW + float(rng.integers(-3, 3)), 0.4, 10.0)]:
        got = bucket_peaks(series, now, window, step)
        want = [bucket_peak(s, now, window, step) for s in series]
        assert [None if g is None else g.hex() for g in got] == [
            None if w is None else w.hex() for w in want
        ]
        if window >= step:
            assert any(g is not None and math.isfinite(g) for g in got)
    assert bucket_peaks(series, NOW, 30.0, 10.0)[3] is None  # no sample in its last 30 s


@pytest.mark.parametrize("seed", range(5))
def test_stall_means_found_together_equal_those_found_one_by_one(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = rng.normal(20, 8, (9, 700))
    rows[rng.random(rows.shape) < 0.3] = np.nan
    rows[2, -400:] = np.nan  # nothing in the window, a sample before it
    rows[2, -401] = 5.0
    rows[4] = np.nan  # no sample at all
    start = NOW - 0.5 * 699
    series: list[Series | None] = [Series(start, 0.5, row) for row in rows]
    series += [None, Series(start, 0.5, np.array([])), Series(start + 1.0, 0.5, rows[0][:-2])]
    for window in (300.0, 1.0, 1000.0):
        got = window_means(series, NOW, window)
        want = [window_mean(s, NOW, window) for s in series]
        assert got == want
    assert window_means(series, NOW, 150.0)[2] == (None, NOW - 0.5 * 400)  # its last sample


@pytest.mark.parametrize("seed", range(4))
def test_stall_means_of_rows_without_a_gap_equal_each_rows_own_mean_bit_for_bit(seed: int) -> None:
    """Rows with every sample of the window finite are summed together (pairwise per
    row); beside them rows with gaps, and windows of 1 to 700 samples (pairwise sums
    change their order past 8 and 128 values)."""
    rng = np.random.default_rng(seed)
    rows = rng.lognormal(3, 1.5, (8, 700)) * rng.choice([1e-3, 1.0, 1e6], (8, 1))
    rows[1, rng.random(700) < 0.05] = np.nan  # gaps: found one by one
    rows[3, -3] = np.nan
    series: list[Series | None] = [Series(NOW - 0.5 * 699, 0.5, row) for row in rows]
    for window in (0.5, 3.0, 4.0, 60.0, 64.0, 64.5, 200.0, 349.5, 1000.0):
        got = window_means(series, NOW, window)
        want = [window_mean(s, NOW, window) for s in series]
        assert [(m if m is None else m.hex(), t) for m, t in got] == [
            (m if m is None else m.hex(), t) for m, t in want
        ]


def test_the_smoothing_tape_gives_each_end_what_smoothing_that_prefix_alone_gives() -> None:
    rng = np.random.default_rng(7)
    hist = 50 + np.cumsum(rng.normal(0, 2, (6, 90)), axis=1)
    hist[rng.random(hist.shape) < 0.1] = np.nan
    hist[1, :40] = np.nan  # no point before index 40
    hist[2] = np.nan  # no point at all
    hist[3, 60:] = np.nan  # a gap to the end
    tape = SesTape(hist)
    for end in (12, 13, 39, 40, 41, 70, 20, 89, 89, 0):  # increasing, then back, repeated
        want = ses_last(hist[:, : end + 1])
        assert tape.at(end).tobytes() == want.tobytes(), end
    rows = np.array([4, 1])
    assert tape.rows(rows).at(45).tobytes() == ses_last(hist[rows, :46]).tobytes()


@pytest.mark.parametrize("seed", [5, 6])
def test_rows_with_their_own_clips_in_one_batch_forecast_as_each_clip_alone(seed: int) -> None:
    """Issue 20: a tick's pools (clipped to 0-100) and workloads (never negative) in one
    batch: every forecast and kept state as in a batch of each clip alone."""
    data = _data(10, seed)
    clip_of = [(0.0, 100.0) if i % 2 else (0.0, None) for i in range(data.shape[0] + 1)]
    keys: list[str | None] = [*(f"s{i}" for i in range(data.shape[0])), "none"]
    together: dict[str, FitState] = {}
    apart: dict[str, FitState] = {}
    for k in range(15):  # a refit at the tenth tick
        series, now = _series(data, k, False)
        got_states: dict[str, FitState] = {}
        got = forecast_series(series, CFG, now, keys=keys, prior=together, states=got_states,
                              clips=clip_of)  # fmt: skip
        want: list[Signal | None] = [None] * len(series)
        want_states: dict[str, FitState] = {}
        for clip in ((0.0, 100.0), (0.0, None)):
            idx = [i for i, c in enumerate(clip_of) if c == clip]
            part = forecast_series([series[i] for i in idx], CFG, now, None, clip,
                                   [keys[i] for i in idx], apart, want_states)  # fmt: skip
            for i, s in zip(idx, part, strict=True):
                want[i] = s
        assert [_signal(s) for s in got] == [_signal(s) for s in want if s is not None]
        assert sorted(got_states) == sorted(want_states)
        for key, state in got_states.items():
            assert _state(state) == _state(want_states[key]), f"tick {k}, {key}"
        together, apart = got_states, want_states


@pytest.mark.parametrize(
    "clips",
    [
        [(0.0, None), (0.0, 100.0)] * 3,  # interleaved: rows gathered by clip
        [(0.0, None)] * 2 + [(0.0, 100.0)] * 4,  # one run a clip (the lanes): slices
    ],
)
def test_each_rows_clip_bounds_it_as_that_clip_alone_bit_for_bit(
    clips: list[tuple[float, float | None]],
) -> None:
    """Rows clipped by groups of one clip: a clip without an upper bound turns a -0.0 into
    0.0 where `np.clip` at +inf would keep -0.0, as in a batch of that clip alone."""
    rng = np.random.default_rng(8)
    mean = rng.normal(50, 80, (6, 5))
    mean[0] = -0.0
    lower, upper = mean - 5, mean + 5
    peak = rng.normal(0, 3, 6).tolist()
    b = Batch(make_engine(CFG), mean, 5, CFG, NOW, [None] * 6, {}, {}, (0.0, None), False, clips)
    got = _clipped(b, mean, lower, upper, peak)
    for clip in ((0.0, None), (0.0, 100.0)):
        rows = [r for r, c in enumerate(clips) if c == clip]
        want = clip_rows(mean[rows], lower[rows], upper[rows], [peak[r] for r in rows], clip)
        for g, w in zip(got, want, strict=True):
            assert g[rows].tobytes() == w.tobytes()
    assert not np.signbit(got[0][0]).any()
