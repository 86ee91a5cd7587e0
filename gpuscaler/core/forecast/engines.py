"""Forecast engines: series in, model paths out. Pure computation.

Two engines give the same model class, ARIMA(p, d, 0):

- `LeastSquaresArima` fits every series of a batch at once by least squares on the
  d-times differenced series (numpy, batched normal equations). This is the production
  engine: about 100x cheaper per series than statsmodels.
- `StatsmodelsArima` wraps `statsmodels.tsa.arima.model.ARIMA` (any order, q > 0 too):
  the reference the fast engine is measured against.

A fit is usable only when it is stable (`stable_fit`): every characteristic root of the
AR polynomial outside the unit circle, and its path inside a band around the window's
range (`within_band`). Anything else is dropped by the ensemble, never used.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from statistics import NormalDist
from typing import Any, Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast.buckets import bucket as bucket
from gpuscaler.core.forecast.buckets import bucket_rows as bucket_rows
from gpuscaler.core.model import (
    BoolArray,
    FitState,
    FloatArray,
)

_RIDGE = 1e-6
"""Tiny ridge on the normal equations: keeps a flat (constant) series solvable."""
_CHUNK = 256
"""Series per batched solve: bounds the design tensor to ~ 256 x window x (p+1) floats."""


@dataclass(frozen=True, eq=False)
class Fitted:
    """Per-series AR coefficients of the differenced series (NaN rows: not fittable)."""

    intercept: FloatArray  # (n,)
    phi: FloatArray  # (n, p)
    sigma2: FloatArray  # (n,)
    modulus: FloatArray | None = None
    """`inverse_root_modulus(phi)` when known (kept on the fit states between refits)."""


def refit_or_reuse(
    engine: LeastSquaresArima,
    hist: FloatArray,
    keys: Sequence[str | None],
    prior: Mapping[str, FitState],
    now: float,
    refit_every: float,
) -> tuple[Fitted, dict[str, FitState], int]:
    """Coefficients for every row: reused where the series' fit is younger than
    `refit_every` (its state, the newest observations, still moves the forecast), refitted
    in one batch otherwise. Returns them, the fit states to keep, and how many were refit."""
    n, p = hist.shape[0], engine.p
    stale: list[int] = []
    reuse: list[int] = []
    olds: list[FitState] = []  # the reused rows' states, in order
    for r, key in enumerate(keys):  # one pass over the rows: which are reused
        old = prior.get(key) if key is not None else None
        if old is None or now - old.fitted_at >= refit_every or len(old.phi) != p:
            stale.append(r)
        else:
            reuse.append(r)
            olds.append(old)
    intercept, phi, sigma2 = np.empty(n), np.empty((n, p)), np.empty(n)
    modulus = np.empty(n)
    if stale:
        fresh = engine.fit(hist[stale])
        intercept[stale], phi[stale], sigma2[stale] = fresh.intercept, fresh.phi, fresh.sigma2
    unknown = list(stale)
    if reuse:  # the kept floats written into their rows at once (the same values; issue
        # 20: fromiter, a fifth of np.array's time on a list of floats), every row a slice
        rows: list[int] | slice = reuse if stale else slice(None)
        m = len(olds)
        lags = np.fromiter(chain.from_iterable(map(_PHI, olds)), np.float64, m * p)
        intercept[rows] = np.fromiter(map(_INTERCEPT, olds), np.float64, m)
        phi[rows] = lags.reshape(m, p)
        sigma2[rows] = np.fromiter(map(_SIGMA2, olds), np.float64, m)
        kept = list(map(_MODULUS, olds))
        if None in kept:
            unknown += [r for r, k in zip(reuse, kept, strict=True) if k is None]
            kept = [np.nan if k is None else k for k in kept]
        modulus[rows] = np.fromiter(kept, np.float64, m)
    if unknown:  # per row, the same whichever rows are found together
        modulus[unknown] = inverse_root_modulus(phi[unknown])
    states: dict[str, FitState] = {}
    if stale:
        made = _fit_states(now, Fitted(intercept, phi, sigma2, modulus), stale, keys, prior)
        for r, key in enumerate(keys):
            if key is not None:
                states[key] = made[r] if r in made else prior[key]
    else:  # every row reused: all keyed
        states = {key: old for key, old in zip(keys, olds, strict=True) if key is not None}
    return Fitted(intercept, phi, sigma2, modulus), states, len(stale)


_INTERCEPT = operator.attrgetter("intercept")
_PHI = operator.attrgetter("phi")
_SIGMA2 = operator.attrgetter("sigma2")
_MODULUS = operator.attrgetter("modulus")


def _fit_states(
    now: float,
    fitted: Fitted,
    rows: list[int],
    keys: Sequence[str | None],
    prior: Mapping[str, FitState],
) -> dict[int, FitState]:
    """The new fit states of `rows` with a key, fitted at `now`: their interval state
    carried on, no scoring yet."""
    out: dict[int, FitState] = {}
    assert fitted.modulus is not None
    for r in rows:
        key = keys[r]
        if key is not None:
            old = prior.get(key)
            out[r] = FitState(
                now,
                float(fitted.intercept[r]),
                tuple(fitted.phi[r].tolist()),
                float(fitted.sigma2[r]),
                old.interval if old is not None else None,
                modulus=float(fitted.modulus[r]),
            )
    return out


@dataclass(frozen=True, eq=False)
class PathBatch:
    mean: FloatArray  # (n, steps)
    lower: FloatArray
    upper: FloatArray


class ForecastEngine(Protocol):
    name: str

    def forecast(self, histories: FloatArray, steps: int, level: float) -> PathBatch:
        """Forecast each row of `histories` (n, T; NaN = gap) `steps` ahead."""
        ...


def z_score(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2)


_TAIL = 4
"""Newest columns `last_finite` reads one at a time before it searches the rows left."""


def last_finite(histories: FloatArray) -> FloatArray:
    """Last finite value of each row (NaN for a row with none): the newest `_TAIL` columns
    read one at a time for the rows not found yet (issue 20: a window's newest bucket is
    open, NaN, and the one before it finite in every row; a search of every point cost
    several times more), the rows left searched."""
    n, t = histories.shape
    out: FloatArray = np.full(n, np.nan)
    rows = np.arange(n)
    for j in range(t - 1, max(t - 1 - _TAIL, -1), -1):
        column = histories[rows, j]
        found = np.isfinite(column)
        out[rows[found]] = column[found]
        rows = rows[~found]
        if not rows.size:
            return out
    left = histories[rows]
    finite = np.isfinite(left)
    idx = t - 1 - np.argmax(finite[:, ::-1], axis=1)
    out[rows] = np.where(finite.any(axis=1), left[np.arange(rows.size), idx], np.nan)
    return out


def _all_finite(z: FloatArray, width: int) -> BoolArray:
    """Per row, whether each run of `width` points from each start (n, t - width + 1) is
    all finite: the points' finiteness found once and and-ed over the run (issue 20: an
    isfinite of every run's every point, the fit's second cost)."""
    finite = np.isfinite(z)
    m = z.shape[1] - width + 1
    out: BoolArray = finite[:, :m].copy()
    for j in range(1, width):
        out &= finite[:, j : j + m]
    return out


_KEPT_HALVES = 8
"""Batches whose half widths an engine keeps (a controller's pools and workloads share
an engine when their forecast sections are equal)."""


class LeastSquaresArima:
    """ARIMA(p, d, 0) with intercept, fitted by batched least squares."""

    def __init__(self, p: int, d: int):
        if d not in (0, 1):
            raise ValueError("LeastSquaresArima supports d in {0, 1}")
        self.p, self.d = p, d
        # Like statsmodels' ARIMA: a constant only when the series is not differenced
        # (with d = 1 a constant would be a drift that extrapolates every trend).
        self.const = d == 0
        self.name = f"arima({p},{d},0)"
        self._halves: dict[tuple[object, ...], FloatArray] = {}
        """The last few batches' half widths by their coefficients (`kept_half_width`)."""

    def fit(self, histories: FloatArray) -> Fitted:
        z = np.diff(histories, n=self.d, axis=1) if self.d else histories
        n = z.shape[0]
        parts = [self._fit_chunk(z[i : i + _CHUNK]) for i in range(0, n, _CHUNK)]
        return Fitted(
            intercept=np.concatenate([c for c, _, _ in parts]),
            phi=np.concatenate([f for _, f, _ in parts]),
            sigma2=np.concatenate([s for _, _, s in parts]),
        )

    def _fit_chunk(self, z: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        p, k = self.p, self.p + 1
        n = z.shape[0]
        if z.shape[1] <= p:
            nan = np.full(n, np.nan)
            return nan, np.full((n, p), np.nan), nan
        windows = sliding_window_view(z, p + 1, axis=1)  # (n, m, p+1): lags..., target
        valid = _all_finite(z, p + 1)
        x = np.empty(windows.shape, dtype=np.float64)
        x[..., 0] = 1.0 if self.const else 0.0  # with no constant the ridge pins it at 0
        x[..., 1:] = windows[..., :p][..., ::-1]  # z[t-1], z[t-2], ..., z[t-p]
        x[~valid] = 0.0
        y = np.where(valid, windows[..., p], 0.0)
        xtx = np.einsum("nmk,nml->nkl", x, x) + _RIDGE * np.eye(k)
        xty = np.einsum("nmk,nm->nk", x, y)
        beta = np.linalg.solve(xtx, xty[..., None])[..., 0]
        resid = np.where(valid, y - np.einsum("nmk,nk->nm", x, beta), 0.0)
        count = valid.sum(axis=1)
        dof = count - p - int(self.const)
        sigma2 = (resid**2).sum(axis=1) / np.maximum(dof, 1)
        bad = dof < 2
        beta[bad] = np.nan
        sigma2[bad] = np.nan
        return beta[:, 0], beta[:, 1:], sigma2

    def predict_mean(self, fitted: Fitted, histories: FloatArray, steps: int) -> FloatArray:
        """Mean paths (n, steps) continuing each row of `histories` with `fitted`."""
        z = np.diff(histories, n=self.d, axis=1) if self.d else histories
        lags = z[:, z.shape[1] - self.p :][:, ::-1] if self.p else z[:, :0]
        return self.roll(fitted, lags, last_finite(histories), nanmean_rows(z), steps)

    def roll(
        self, fitted: Fitted, lags: FloatArray, last: FloatArray, zmean: FloatArray, steps: int
    ) -> FloatArray:
        """Run the recursion `steps` ahead from per-row state: `lags` (rows, p) newest
        first, `last` level (rows,). A gap in the lags is filled with the row's mean
        difference `zmean`, the model's best guess for a missing value."""
        p = self.p
        # One buffer per row, oldest first: the p lags, then the path as it is made (no
        # array built per step; the rows, all series and origins, go through at once).
        buf = np.empty((lags.shape[0], p + steps))
        buf[:, :p] = np.where(np.isfinite(lags), lags, zmean[:, None])[:, ::-1]
        phi = np.ascontiguousarray(fitted.phi[:, ::-1])  # oldest lag first
        for h in range(steps):
            buf[:, p + h] = fitted.intercept + np.einsum("rk,rk->r", phi, buf[:, h : h + p])
        zpath = buf[:, p:]
        if not self.d:
            return zpath
        out: FloatArray = np.cumsum(zpath, axis=1)  # then the level added in place
        return np.add(last[:, None], out, out=out)

    def half_width(self, fitted: Fitted, steps: int, level: float) -> FloatArray:
        """Half width (n, steps) of the prediction interval, from the MA(inf) weights."""
        n, p = fitted.phi.shape
        psi = np.zeros((n, steps))
        psi[:, 0] = 1.0
        for j in range(1, steps):
            for i in range(1, min(j, p) + 1):
                psi[:, j] += fitted.phi[:, i - 1] * psi[:, j - i]
        if self.d:
            psi = np.cumsum(psi, axis=1)
        return z_score(level) * np.sqrt(fitted.sigma2[:, None] * np.cumsum(psi**2, axis=1))

    def kept_half_width(self, fitted: Fitted, steps: int, level: float) -> FloatArray:
        """`half_width`, kept for the last few batches by their coefficients' bytes: a
        batch's coefficients change only at its refits (`forecast.refit_every`), yet its
        half widths were found again every tick (issue 20: about a thousand numpy calls a
        batch, a fixed cost that few lanes pay in full). The same inputs, the same array
        (read-only)."""
        phi, sigma2 = np.ascontiguousarray(fitted.phi), np.ascontiguousarray(fitted.sigma2)
        key = (steps, level, phi.shape, phi.tobytes(), sigma2.tobytes())
        half = self._halves.get(key)
        if half is None:
            half = self.half_width(fitted, steps, level)
            half.flags.writeable = False
            self._halves[key] = half
            while len(self._halves) > _KEPT_HALVES:
                self._halves.pop(next(iter(self._halves)), None)
        return half

    def predict(self, fitted: Fitted, histories: FloatArray, steps: int, level: float) -> PathBatch:
        mean = self.predict_mean(fitted, histories, steps)
        half = self.kept_half_width(fitted, steps, level)
        return PathBatch(mean=mean, lower=mean - half, upper=mean + half)

    def forecast(self, histories: FloatArray, steps: int, level: float) -> PathBatch:
        return self.predict(self.fit(histories), histories, steps, level)


class StatsmodelsArima:
    """Reference engine: statsmodels' state-space ARIMA, one series at a time."""

    def __init__(self, order: tuple[int, int, int]):
        self.order = order
        self.name = f"statsmodels-arima{order}"

    def forecast(self, histories: FloatArray, steps: int, level: float) -> PathBatch:
        from statsmodels.tsa.arima.model import ARIMA
        from threadpoolctl import threadpool_limits

        # One BLAS thread (limited after the import, which loads scipy's own BLAS): a small
        # state-space fit is 20x slower with multithreaded OpenBLAS on 2 busy cores
        # (2.3 s against 0.1 s per ARIMA(5,1,0) fit on 360 points, measured here).
        with threadpool_limits(limits=1):
            return self._forecast(ARIMA, histories, steps, level)

    def _forecast(
        self, arima: type[Any], histories: FloatArray, steps: int, level: float
    ) -> PathBatch:
        n = histories.shape[0]
        mean, lower, upper = (np.full((n, steps), np.nan) for _ in range(3))
        for i, row in enumerate(histories):
            if np.isfinite(row).sum() < sum(self.order) + 3:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    result = arima(row, order=self.order).fit()
                    frame = result.get_forecast(steps).summary_frame(alpha=1 - level)
                except (ValueError, np.linalg.LinAlgError):
                    continue
            mean[i] = frame["mean"].to_numpy()
            lower[i] = frame["mean_ci_lower"].to_numpy()
            upper[i] = frame["mean_ci_upper"].to_numpy()
        return PathBatch(mean, lower, upper)


def make_engine(cfg: ForecastConfig) -> ForecastEngine:
    p, d, _q = cfg.order
    if cfg.engine == "fast":
        return LeastSquaresArima(p, d)
    return StatsmodelsArima(cfg.order)


def nanmean_rows(a: FloatArray) -> FloatArray:
    finite = np.isfinite(a)
    count = finite.sum(axis=1)
    total = np.where(finite, a, 0.0).sum(axis=1)
    return np.where(count > 0, total / np.maximum(count, 1), 0.0)


# --------------------------------------------------------------------------- stability

ROOT_MARGIN = 1e-3
"""A characteristic root must lie at least this far outside the unit circle (inverse roots
of modulus up to 1 - ROOT_MARGIN): a root on or inside the circle makes the AR recursion
grow without bound, the explosive fits of near-constant pod windows."""
BAND = 1.0
"""A usable path stays within the window's range widened by this many ranges each side."""


def inverse_root_modulus(phi: FloatArray) -> FloatArray:
    """Largest modulus of the inverse characteristic roots per row of `phi` (n, p): the
    eigenvalues of the AR companion matrix. Below 1 means every root of
    1 - phi_1 z - ... - phi_p z^p lies outside the unit circle. NaN for a NaN row."""
    n, p = phi.shape
    if p == 0:
        return np.zeros(n)
    finite: BoolArray = np.asarray(np.isfinite(phi).all(axis=1))
    comp = np.zeros((n, p, p))
    comp[:, 0, :] = np.where(finite[:, None], phi, 0.0)
    comp[:, 1:, :-1] = np.eye(p - 1)
    out: FloatArray = np.abs(np.linalg.eigvals(comp)).max(axis=1)
    out[~finite] = np.nan
    return out


def window_band(hist: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Per row: the window's range widened by BAND ranges each side (a flat window's
    range counts as a millionth of its level, so only a flat path passes; NaN for a row
    with none: the reductions np.nanmin and np.nanmax run on an array, without their check
    for such a row and its warning, filtered here before: issue 20)."""
    lo, hi = np.fmin.reduce(hist, axis=1), np.fmax.reduce(hist, axis=1)
    span = np.maximum(hi - lo, 1e-6 * np.maximum(np.abs(hi), 1.0))
    return lo - BAND * span, hi + BAND * span


def within_band(paths: FloatArray, hist: FloatArray) -> BoolArray:
    """Rows (n,) whose finite path stays inside `window_band` of their window."""
    lo, hi = window_band(hist)
    inside = (paths >= lo[:, None]) & (paths <= hi[:, None])
    ok: BoolArray = np.asarray(inside.all(axis=1), dtype=bool)
    return ok


def stable_fit(fitted: Fitted) -> BoolArray:
    """Rows (n,) whose AR fit has every characteristic root outside the unit circle."""
    modulus = fitted.modulus if fitted.modulus is not None else inverse_root_modulus(fitted.phi)
    with np.errstate(invalid="ignore"):
        ok: BoolArray = np.asarray(modulus < 1.0 - ROOT_MARGIN)
    return ok
