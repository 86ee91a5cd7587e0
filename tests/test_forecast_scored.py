"""The ensemble's scoring is kept from one refit to the next (issue 18): a steady tick does
not rescore the members, and its forecast is what scoring at the refit gives."""

from __future__ import annotations

import numpy as np
import pytest
from builders import NOW

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast import LeastSquaresArima, forecast_series
from gpuscaler.core.forecast.engines import Fitted, stable_fit, within_band
from gpuscaler.core.forecast.ensemble import ARIMA_MARGIN, MEMBERS, assess, ses_levels
from gpuscaler.core.forecast.intervals import conformal_half_width
from gpuscaler.core.model import FitState, Scored, Series, Signal

STEP = 10.0
POINTS = 360
CFG = ForecastConfig()  # 10 s buckets, 5 min horizon, refit every 5 min


def _data(n: int, seed: int = 3) -> np.ndarray:
    """n noisy, wandering series with bursts, long enough for POINTS + 40 ticks."""
    rng = np.random.default_rng(seed)
    walk = np.cumsum(rng.normal(0, 1.0, (n, POINTS + 40)), axis=1)
    bursts = (rng.random((n, POINTS + 40)) < 0.03) * rng.uniform(5, 20, (n, 1))
    return 50 + walk + bursts + rng.normal(0, 2.0, (n, POINTS + 40))


def _tick(data: np.ndarray, k: int) -> tuple[list[Series], float]:
    now = NOW + k * STEP
    start = now - STEP * (POINTS - 1)
    return [Series(start, STEP, row) for row in data[:, k : k + POINTS]], now


def _run(
    data: np.ndarray, ticks: list[int], rescore: bool
) -> tuple[list[list[Signal]], dict[str, FitState]]:
    keys = [f"s{i}" for i in range(data.shape[0])]
    states: dict[str, FitState] = {}
    out = []
    for k in ticks:
        series, now = _tick(data, k)
        kept: dict[str, FitState] = {}
        out.append(
            forecast_series(series, CFG, now, keys=keys, prior=states, states=kept, rescore=rescore)
        )
        states = kept
    return out, states


def test_at_a_refit_the_kept_and_the_rescored_forecasts_agree_exactly() -> None:
    data = _data(6)
    (kept,), _ = _run(data, [0], rescore=False)
    (fresh,), _ = _run(data, [0], rescore=True)
    for a, b in zip(kept, fresh, strict=True):
        assert a.forecast is not None and b.forecast is not None
        assert a.forecast.method == b.forecast.method
        np.testing.assert_array_equal(a.forecast.mean, b.forecast.mean)
        np.testing.assert_array_equal(a.forecast.lower, b.forecast.lower)
        np.testing.assert_array_equal(a.forecast.upper, b.forecast.upper)
        assert a.forecast.peak == b.forecast.peak
        assert a.forecast.reason == b.forecast.reason


def test_a_steady_tick_reuses_the_scoring_and_a_refit_makes_a_new_one() -> None:
    data = _data(4)
    keys = [f"s{i}" for i in range(4)]

    def tick(k: int, prior: dict[str, FitState]) -> dict[str, FitState]:
        series, now = _tick(data, k)
        kept: dict[str, FitState] = {}
        forecast_series(series, CFG, now, keys=keys, prior=prior, states=kept)
        return kept

    first = tick(0, {})
    steady = tick(3, first)
    refit = tick(round(CFG.refit_every / STEP), steady)
    for key, state in first.items():
        kept, now, later = state.scored, steady[key].scored, refit[key].scored
        assert kept is not None and now is not None and later is not None
        # kept as is, not scored again; the errors of one more completed origin appended
        assert now.errors is kept.errors and now.weights == kept.weights
        assert now.newest == kept.newest + 2 * STEP
        np.testing.assert_array_equal(now.abs_recent[:-1], kept.abs_recent[1:])
        assert later.errors is not kept.errors  # scored again at the refit


def test_between_refits_the_forecast_is_the_refits_scoring_on_the_live_paths() -> None:
    """The kept forecast, rebuilt independently: `assess` on the window as it was at the
    refit gives the weights and the conformal errors, to which the errors at the two
    origins completed since are added (the oldest two dropped); the members' paths come
    from the current window (full smoothing recursion, the 12-bucket mean, the ARIMA path
    with the refit's coefficients)."""
    data = _data(5, seed=11)
    later = 4
    (at_refit, now_sigs), states = _run(data, [0, later], rescore=False)
    engine = LeastSquaresArima(*CFG.order[:2])
    steps = round(CFG.horizon / STEP)
    old = data[:, :POINTS]
    fitted = engine.fit(old)
    old_paths = engine.predict(fitted, old, steps, CFG.interval_level).mean
    ok = stable_fit(fitted) & within_band(old_paths, old)
    a = assess(engine, fitted, old, steps, old_paths, ok)
    assert a is not None
    new = data[:, later : later + POINTS]
    arima_now = engine.predict(fitted, new, steps, CFG.interval_level).mean
    assert within_band(arima_now, new).all()
    all_levels = ses_levels(new)  # (alphas, n, points)

    def ensemble_at(r: int, j: int) -> np.ndarray:
        """The ensemble's path from bucket j of the current window, the refit's weights."""
        lv = all_levels[:, r, j]
        row = Fitted(fitted.intercept[r : r + 1], fitted.phi[r : r + 1], fitted.sigma2[r : r + 1])
        paths = {
            "arima": engine.predict(row, new[r : r + 1, : j + 1], steps, 0.7).mean[0],
            "ses": np.full(steps, lv[a.ses_best[r]]),
            "ses_avg": np.full(steps, (a.ses_inv[:, r] * lv).sum() / a.ses_inv[:, r].sum()),
            "window_mean": np.full(steps, new[r, j - 11 : j + 1].mean()),
        }
        w = {m: a.raw_weights[m][r] for m in MEMBERS}
        for m in MEMBERS[1:]:  # a member takes weight from ARIMA only by a clear margin
            w[m] *= min(max((w[m] / w["arima"] - 1) / ARIMA_MARGIN, 0.0), 1.0)
        out: np.ndarray = sum(w[m] * paths[m] for m in MEMBERS) / sum(w.values())
        return out

    newest = POINTS - 1 - steps  # the newest origin with its whole horizon observed
    for r, sig in enumerate(now_sigs):
        f = sig.forecast
        first = at_refit[r].forecast
        assert f is not None and first is not None
        assert f.method == first.method == "ensemble"
        np.testing.assert_allclose(f.mean, ensemble_at(r, POINTS - 1), rtol=1e-9, atol=1e-9)
        added = [
            np.abs(new[r, j + 1 : j + 1 + steps] - ensemble_at(r, j)) for j in (newest - 2, newest)
        ]
        table = np.concatenate([np.abs(a.residuals["ensemble"][r]), added])[2:]
        interval = states[f"s{r}"].interval
        assert interval is not None
        # the level the interval of this tick was taken at (before this tick's issue)
        level = np.array([interval.level])
        half = conformal_half_width(table[None], level)[0]
        np.testing.assert_allclose(f.upper - f.mean, half, rtol=1e-9, atol=1e-9)


def test_kept_and_rescored_forecasts_stay_close_over_many_ticks() -> None:
    """Over 30 ticks (one refit period plus), the forecasts with the scoring kept and the
    ones scored at every tick have about the same error against what followed."""
    data = _data(8, seed=5)
    ticks = list(range(0, 36, 3))
    out, _ = _run(data, ticks, rescore=False)
    ref, _ = _run(data, ticks, rescore=True)
    steps = round(CFG.horizon / STEP)

    def mae(runs: list[list[Signal]]) -> float:
        errs = []
        for k, sigs in zip(ticks, runs, strict=True):
            actual = data[:, k + POINTS : k + POINTS + steps]
            width = actual.shape[1]
            for i, s in enumerate(sigs):
                assert s.forecast is not None
                errs.append(np.abs(s.forecast.mean[:width] - actual[i]).mean())
        return float(np.mean(errs))

    kept, fresh = mae(out), mae(ref)
    assert fresh > 0
    assert kept == pytest.approx(fresh, rel=0.1)


def test_a_new_horizon_between_refits_scores_again() -> None:
    data = _data(3)
    keys = [f"s{i}" for i in range(3)]
    series, now = _tick(data, 0)
    first: dict[str, FitState] = {}
    forecast_series(series, CFG, now, keys=keys, prior={}, states=first)
    longer = CFG.model_copy(update={"horizon": 2 * CFG.horizon})
    series, now = _tick(data, 2)
    kept: dict[str, FitState] = {}
    out = forecast_series(series, longer, now, keys=keys, prior=first, states=kept)
    steps = round(longer.horizon / STEP)
    for s in out:
        assert s.forecast is not None and len(s.forecast.mean) == steps
        assert np.isfinite(s.forecast.upper).all()
    assert all(kept[k].scored is not first[k].scored for k in keys)


def test_kept_scorings_rolled_together_equal_those_rolled_one_by_one() -> None:
    """Issue 18: a group's rows are rolled, sorted and given their peak offsets at once;
    each equals the same row rolled alone, and rows of other shapes are still rolled."""
    from dataclasses import replace

    from gpuscaler.core.forecast.scored import _rolled

    _, states = _run(_data(5), [0], rescore=False)
    sub = [s.scored for s in states.values() if s.scored is not None]
    assert len(sub) >= 3
    rng = np.random.default_rng(5)
    steps = sub[0].abs_recent.shape[1]
    errors = rng.uniform(0, 10, (len(sub), 2, steps))
    errors[0, 1, 3] = np.nan
    peaks = rng.uniform(-5, 5, (len(sub), 2))

    def rolled(rows: list[Scored], e: np.ndarray, p: np.ndarray) -> list[Scored]:
        """`_rolled` of rows with two new origins each ((rows, 2, steps) errors)."""
        n = len(rows)
        return _rolled(rows, e.reshape(2 * n, steps), p.reshape(2 * n), [2] * n, [NOW] * n)

    alone = [rolled([s], errors[g : g + 1], peaks[g : g + 1])[0] for g, s in enumerate(sub)]
    # one row with fewer recent origins: the rows no longer share a shape
    short = replace(sub[1], abs_recent=sub[1].abs_recent[10:], peak_recent=sub[1].peak_recent[10:])
    mixed = [sub[0], short, *sub[2:]]
    short_alone = rolled([short], errors[1:2], peaks[1:2])[0]
    for got_all, want_all in (
        (rolled(sub, errors, peaks), alone),
        (rolled(mixed, errors, peaks), [alone[0], short_alone, *alone[2:]]),
    ):
        for got, want in zip(got_all, want_all, strict=True):
            for name in ("abs_errors", "abs_recent", "peak_recent"):
                np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
            assert (got.peak, got.newest) == (want.peak, want.newest) and got.newest == NOW
    assert short_alone.abs_recent.shape[0] < alone[1].abs_recent.shape[0]
