"""Issue 20 (rf8): the scoring's per-row work over rows, bit for bit as before. The oracle
is the code as it was at 3ecdbd8 (tests/tape_reference.py): forward filling every row,
the tape's products made for the whole window at once, the assessment's smoothing levels
at every point, the window means from padded running sums, the assessment's last-value
residuals and the future's peak found twice. The refit's fields of kept scorings read as
arrays (`kept_rows`) are the scorings' own, and never another list's."""

from __future__ import annotations

import gc
from dataclasses import fields, replace

import numpy as np
import pytest
import tape_reference as old
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuscaler.core.forecast import kept_rows, tape
from gpuscaler.core.forecast.engines import LeastSquaresArima
from gpuscaler.core.forecast.ensemble import Assessment, _stats, assess, window_means
from gpuscaler.core.forecast.scored import score
from gpuscaler.core.forecast.tape import SesTape, forward_fill, ses_at
from gpuscaler.core.model import FloatArray, Scored

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def _window(seed: int, n: int, t: int, gaps: float, shape: str) -> FloatArray:
    """n wandering rows with NaN (and infinite) gaps; `shape`: "lead" the first row's first
        half missing, "empty" the first row all NaN, "zero" the last row all -0.0 and 0.0, "open"
    the last column NaN and another infinite in every row."""
    rng = np.random.default_rng(seed)
    hist = 50 + np.cumsum(rng.normal(0, 1.0, (n, t)), axis=1)
    hist[rng.random((n, t)) < gaps] = np.nan
    hist[rng.random((n, t)) < gaps / 4] = np.inf
    if shape == "lead":
        hist[0, : max(1, t // 2)] = np.nan
    elif shape == "empty":
        hist[0] = np.nan
    elif shape == "zero":
        hist[-1] = np.where(np.arange(t) % 2 == 0, -0.0, 0.0)
    elif shape == "open":  # the newest bucket still open in every row, a column missing
        hist[:, -1] = np.nan
        hist[:, rng.integers(0, t)] = np.inf
    return hist


windows = st.builds(
    _window,
    st.integers(0, 10_000),
    st.integers(1, 6),
    st.integers(1, 120),
    st.sampled_from([0.0, 0.0, 0.05, 0.3, 1.0]),
    st.sampled_from(["", "lead", "empty", "zero", "open", "open"]),
)


@SETTINGS
@given(windows)
def test_forward_filling_only_the_rows_with_a_gap_gives_every_rows_old_fill(
    hist: FloatArray,
) -> None:
    got = forward_fill(hist)
    assert got.tobytes() == old.forward_fill(hist).tobytes()
    assert got is not hist and not np.shares_memory(got, hist)


@SETTINGS
@given(windows, st.lists(st.integers(0, 200), min_size=1, max_size=8), st.booleans())
def test_the_tape_made_a_chunk_at_a_time_gives_the_old_tapes_levels_at_any_ends(
    hist: FloatArray, ends: list[int], small: bool
) -> None:
    """In any order (a restart when an end is older), repeated; `small`: chunks of the
    fewest points (16), so a window of up to 120 crosses several."""
    t = hist.shape[1]
    at = np.array([e % t for e in ends])
    with pytest.MonkeyPatch.context() as mp:
        if small:
            mp.setattr(tape, "CHUNK_BYTES", 1)
        new, was = SesTape(hist), old.SesTape(hist)
        for end in at.tolist():
            assert new.at(end).tobytes() == was.at(end).tobytes()
        assert SesTape(hist).many(at).tobytes() == old.SesTape(hist).many(at).tobytes()


@SETTINGS
@given(windows, st.lists(st.integers(0, 200), min_size=1, max_size=80), st.booleans())
def test_the_levels_at_increasing_ends_are_the_old_levels_at_every_point_read_there(
    hist: FloatArray, ends: list[int], small: bool
) -> None:
    """Leading gaps are filled back (no NaN as the tape gives), repeated ends, chunks."""
    at = np.array(sorted(e % hist.shape[1] for e in ends))
    with pytest.MonkeyPatch.context() as mp:
        if small:
            mp.setattr(tape, "CHUNK_BYTES", 1)
        got = ses_at(hist, at)
    want = np.ascontiguousarray(old.ses_levels(hist)[:, :, at])
    assert got.shape == want.shape and got.flags.c_contiguous
    assert got.tobytes() == want.tobytes()


@SETTINGS
@given(
    windows,
    st.lists(st.integers(0, 200), max_size=10),
    st.sampled_from([1, 2, 12, 60, 500]),
)
def test_window_means_without_padded_sums_equal_the_old_means(
    hist: FloatArray, ends: list[int], points: int
) -> None:
    """Ends in any order, repeated, before a window's worth of points, none."""
    at = np.array([e % hist.shape[1] for e in ends], dtype=np.int64)
    with np.errstate(invalid="ignore"):
        want = old.window_means(hist, at, points)
    got = window_means(hist, at, points)
    assert got.shape == want.shape and got.tobytes() == want.tobytes()


def test_window_means_kept_for_a_window_are_never_another_windows() -> None:
    """The running sums kept for the last window (`_running`, by its bytes) serve only
    that window: one point changed, a view of it, its rows alone, and it again."""
    hist = _window(3, 4, 90, 0.1, "open")
    other = hist.copy()
    other[1, 40] += 1.0
    ends = np.array([20, 57, 89])
    for h in (hist, other, hist[:, :], hist[1:3], other, hist, hist[:, :60]):
        e = ends[ends < h.shape[1]]
        with np.errstate(invalid="ignore"):
            want = old.window_means(h, e, 12)
        assert window_means(h, e, 12).tobytes() == want.tobytes()


@SETTINGS
@given(
    st.integers(0, 10_000),
    st.sampled_from(["", "nan", "inf", "both", "huge"]),
    st.booleans(),
    st.booleans(),
)
def test_errors_of_finite_residuals_summed_without_a_copy_are_the_zero_filled_ones(
    seed: int, bad: str, scratch: bool, strided: bool
) -> None:
    """`_stats` against its definition (a zero-filled copy, the finite points counted):
    finite, with a NaN or an infinity in a row or both, squares that overflow, a view."""
    rng = np.random.default_rng(seed)
    resid = rng.normal(0, 5, (4, 6, 7 * (2 if strided else 1)))
    resid[0, 0, 0] = -0.0
    if bad in ("nan", "both"):
        resid[1, 2, 3] = np.nan
    if bad in ("inf", "both"):
        resid[2, 0, 1] = -np.inf
    if bad == "huge":
        resid[3, 1, 1] = 1e300
    if strided:
        resid = resid[:, :, ::2]
    finite = np.isfinite(resid)
    r = np.where(finite, resid, 0.0)
    count = np.count_nonzero(finite, axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        mse = np.einsum("nos,nos->n", r, r) / count
        mae = np.abs(r).sum(axis=(1, 2)) / count
    got = _stats(resid.copy() if scratch else resid, scratch)
    assert got[0].tobytes() == np.where(count > 0, mae, np.nan).tobytes()
    assert got[1].tobytes() == np.where(count > 0, mse, np.nan).tobytes()


def test_the_tape_takes_the_last_levels_of_an_assessed_window_only_of_one_with_its_bits() -> None:
    """A refit tick's tape reads the levels after the window's last point that `ses_at`
    made for a window of the same bits (-0.0 is not 0.0 there), then steps as before."""
    hist = _window(11, 3, 50, 0.1, "zero")
    ends = np.array([10, 30, 49])
    fresh = [SesTape(hist.copy()).at(e) for e in (49, 20, 49)]
    flipped = hist.copy()
    flipped[-1, 1] = 0.0 if np.signbit(hist[-1, 1]) else -0.0
    ses_at(hist, ends)
    other = SesTape(flipped)
    assert other.at(49).tobytes() == SesTape(flipped.copy()).at(49).tobytes()
    ses_at(hist, ends)
    tape_ = SesTape(hist.copy())
    assert tape_.at(49).tobytes() == fresh[0].tobytes() and tape_._flat is None  # kept
    assert [tape_.at(e).tobytes() for e in (20, 49)] == [f.tobytes() for f in fresh[1:]]
    assert (
        tape_.many(np.array([5, 49])).tobytes() == SesTape(hist).many(np.array([5, 49])).tobytes()
    )


def _bits(a: Assessment) -> list[object]:
    out: list[object] = []
    for f in fields(a):
        value = getattr(a, f.name)
        if isinstance(value, dict):
            out.append([(k, np.ascontiguousarray(v).tobytes()) for k, v in value.items()])
        else:
            out.append(np.ascontiguousarray(value).tobytes())
    return out


@SETTINGS
@given(
    st.integers(0, 10_000),
    st.integers(1, 6),
    st.integers(60, 230),
    st.sampled_from([1, 6, 15, 30]),
    st.sampled_from([0.0, 0.0, 0.02, 0.2]),
    st.sampled_from(["", "lead", "zero"]),
    st.sampled_from([0, 1]),
    st.integers(0, 63),
)
def test_the_assessment_equals_the_old_one_field_by_field(
    seed: int, n: int, t: int, steps: int, gaps: float, shape: str, d: int, ok: int
) -> None:
    """Every field, every dict in the same key order, by bytes (None where both are)."""
    hist = _window(seed, n, t, gaps, shape)
    hist[~np.isfinite(hist)] = np.nan
    engine = LeastSquaresArima(3, d)
    fitted = engine.fit(hist)
    usable = np.array([(ok >> r) & 1 == 1 for r in range(n)])
    live = engine.predict_mean(fitted, hist, steps)
    with np.errstate(all="ignore"):
        got = assess(engine, fitted, hist, steps, live, usable)
        want = old.assess(engine, fitted, hist, steps, live, usable)
    assert (got is None) == (want is None)
    if got is not None and want is not None:
        assert _bits(got) == _bits(want)


def _scorings(n: int, seed: int = 5) -> list[Scored]:
    hist = _window(seed, n, 200, 0.0, "")
    engine = LeastSquaresArima(3, 1)
    fitted = engine.fit(hist)
    usable = np.ones(n, dtype=bool)
    a = assess(engine, fitted, hist, 30, engine.predict_mean(fitted, hist, 30), usable)
    assert a is not None
    return score(a, 0.0)


def _fields(rows: kept_rows.KeptRows) -> list[bytes]:
    return [a.tobytes() for a in (rows.ensemble, rows.weights, rows.best, rows.inv)]


def test_kept_rows_are_each_scorings_own_fields_and_never_another_lists() -> None:
    scored = _scorings(4)
    want = [
        np.array([s.method == "ensemble" for s in scored]).tobytes(),
        np.array([s.weights for s in scored]).tobytes(),
        np.array([s.ses_best for s in scored], dtype=np.int64).tobytes(),
        np.stack([s.ses_inv for s in scored]).tobytes(),
    ]
    first = kept_rows.of(scored)
    assert _fields(first) == want
    assert kept_rows.of(list(scored)) is first  # the same scorings: remembered
    assert not first.weights.flags.writeable and not first.inv.flags.writeable
    # one scoring replaced by another (other weights, method, constant): found again
    other = replace(
        scored[-1],
        weights=tuple(2.0 * w for w in scored[-1].weights),
        method="last_value" if scored[-1].method == "ensemble" else "ensemble",
        ses_best=(scored[-1].ses_best + 1) % 11,
        ses_inv=scored[-1].ses_inv * 3.0,
    )
    mixed = [*scored[:-1], other]
    again = kept_rows.of(mixed)
    assert again is not first
    assert _fields(again) == _fields(kept_rows._gathered(mixed))
    assert _fields(again) != want
    # fewer rows, or the same in another order: found again too
    assert kept_rows.of(scored[:3]) is not first
    assert _fields(kept_rows.of(scored[::-1])) == _fields(kept_rows._gathered(scored[::-1]))


def test_rolled_scorings_carry_their_refits_rows_and_forget_them_with_the_first() -> None:
    scored = _scorings(3, seed=9)
    rows = kept_rows.of(scored)
    rolled = [replace(s, newest=s.newest + 20.0) for s in scored]
    assert kept_rows.carried(rolled, rows) is rows
    assert kept_rows.of(rolled) is rows
    key = id(rolled[0])
    assert key in kept_rows._remembered
    del rolled
    gc.collect()
    assert key not in kept_rows._remembered
