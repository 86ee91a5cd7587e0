"""ARIMA(p, d, 0) for many series at once: batched least squares, the recursion that rolls
a path ahead, and the stability rules a fit must pass before its path is used (every AR
root outside the unit circle, the path inside a band around the window's range).
`StatsmodelsArima`: the `statsmodels` engine and the reference of `bench/forecast.py`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from gpuscaler.core.model import BoolArray, FloatArray

RIDGE = 1e-6
"""Tiny ridge on the normal equations: keeps a flat (constant) series solvable."""
CHUNK = 256
"""Series per batched solve: bounds the design tensor to CHUNK x window x (p + 1) floats."""
ROOT_MARGIN = 1e-3
"""A characteristic root must lie at least this far outside the unit circle: a root on or
inside it makes the recursion grow without bound (the explosive fits of flat windows)."""
BAND = 1.0
"""A usable path stays within the window's range widened by this many ranges each side."""


@dataclass(frozen=True, eq=False)
class Coefficients:
    """Per-series AR coefficients of the d-times differenced series (NaN rows: no fit)."""

    intercept: FloatArray  # (n,)
    phi: FloatArray  # (n, p), newest lag first
    sigma2: FloatArray  # (n,) residual variance

    def rows(self, idx: Any) -> Coefficients:
        return Coefficients(self.intercept[idx], self.phi[idx], self.sigma2[idx])


@dataclass(frozen=True)
class Arima:
    """ARIMA(p, d, 0); with d = 0 an intercept, with d = 1 none (as statsmodels: a constant
    on a differenced series is a drift that extrapolates every trend)."""

    p: int
    d: int

    @property
    def name(self) -> str:
        return f"arima({self.p},{self.d},0)"

    @property
    def const(self) -> bool:
        return self.d == 0

    def differenced(self, hist: FloatArray) -> FloatArray:
        return np.diff(hist, n=self.d, axis=1) if self.d else hist

    def fit(self, hist: FloatArray) -> Coefficients:
        """Least-squares coefficients of every row of `hist` (n, t; NaN = gap): a lag
        window with a gap is left out of its row's normal equations."""
        z = self.differenced(hist)
        parts = [self._fit_chunk(z[i : i + CHUNK]) for i in range(0, z.shape[0], CHUNK)]
        if not parts:
            return Coefficients(np.empty(0), np.empty((0, self.p)), np.empty(0))
        return Coefficients(*(np.concatenate(column) for column in zip(*parts, strict=True)))

    def _fit_chunk(self, z: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        p, k, n = self.p, self.p + 1, z.shape[0]
        if z.shape[1] <= p:
            return np.full(n, np.nan), np.full((n, p), np.nan), np.full(n, np.nan)
        windows = sliding_window_view(z, p + 1, axis=1)  # (n, m, p + 1): lags, then target
        valid = np.isfinite(windows).all(axis=2)
        x = np.empty(windows.shape)
        x[..., 0] = 1.0 if self.const else 0.0  # without a constant the ridge pins it at 0
        x[..., 1:] = windows[..., :p][..., ::-1]  # z[t-1], ..., z[t-p]
        x[~valid] = 0.0
        y = np.where(valid, windows[..., p], 0.0)
        xtx = np.einsum("nmk,nml->nkl", x, x) + RIDGE * np.eye(k)
        xty = np.einsum("nmk,nm->nk", x, y)
        beta = np.linalg.solve(xtx, xty[..., None])[..., 0]
        resid = np.where(valid, y - np.einsum("nmk,nk->nm", x, beta), 0.0)
        dof = valid.sum(axis=1) - p - int(self.const)
        sigma2 = (resid**2).sum(axis=1) / np.maximum(dof, 1)
        bad = dof < 2
        beta[bad], sigma2[bad] = np.nan, np.nan
        return beta[:, 0], beta[:, 1:], sigma2

    def roll(
        self, c: Coefficients, lags: FloatArray, last: FloatArray, zmean: FloatArray, steps: int
    ) -> FloatArray:
        """Paths (rows, steps) from per-row state: `lags` (rows, p) of the differenced
        series, newest first, and the `last` level (rows,). A gap among the lags takes the
        row's mean difference `zmean`, the model's best guess for a missing value."""
        p = self.p
        buf = np.empty((lags.shape[0], p + steps))  # oldest lag first, then the path
        buf[:, :p] = np.where(np.isfinite(lags), lags, zmean[:, None])[:, ::-1]
        phi = c.phi[:, ::-1]
        for h in range(steps):
            buf[:, p + h] = c.intercept + np.einsum("rk,rk->r", phi, buf[:, h : h + p])
        path = buf[:, p:]
        return last[:, None] + np.cumsum(path, axis=1) if self.d else path

    def roll_from(
        self, c: Coefficients, hist: FloatArray, rows: Any, origins: Any, steps: int
    ) -> FloatArray:
        """Paths (pairs, steps) from origin `origins[i]` (an index into the window) of row
        `rows[i]`, with that row's coefficients: the live path and every in-window origin
        the ensemble scores go through this one recursion."""
        p, d = self.p, self.d
        points = hist[rows[:, None], origins[:, None] - np.arange(p + d)[None, ::-1]]
        lags = (np.diff(points, n=d, axis=1) if d else points)[:, ::-1]
        zmean = nanmean_rows(self.differenced(hist))[rows]
        return self.roll(c.rows(rows), lags, hist[rows, origins], zmean, steps)

    def predict(self, c: Coefficients, hist: FloatArray, steps: int) -> FloatArray:
        """Mean paths (n, steps) continuing each row of `hist` from its last point (a gap
        there: its last finite value is the level)."""
        z = self.differenced(hist)
        lags = z[:, z.shape[1] - self.p :][:, ::-1]
        return self.roll(c, lags, last_finite(hist), nanmean_rows(z), steps)

    def spread(self, c: Coefficients, steps: int) -> FloatArray:
        """The model's own forecast standard error (n, steps), from its MA(inf) weights."""
        n, p = c.phi.shape
        psi = np.zeros((n, steps))
        psi[:, 0] = 1.0
        for j in range(1, steps):
            for i in range(1, min(j, p) + 1):
                psi[:, j] += c.phi[:, i - 1] * psi[:, j - i]
        if self.d:
            psi = np.cumsum(psi, axis=1)
        out: FloatArray = np.sqrt(c.sigma2[:, None] * np.cumsum(psi**2, axis=1))
        return out


class StatsmodelsArima:
    """statsmodels' state-space ARIMA, one series at a time: paths and intervals."""

    def __init__(self, order: tuple[int, int, int]):
        self.order = order
        self.name = f"statsmodels-arima{order}"

    def forecast(
        self, hist: FloatArray, steps: int, level: float
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Mean, lower and upper paths (n, steps); NaN rows where a fit fails."""
        from statsmodels.tsa.arima.model import ARIMA
        from threadpoolctl import threadpool_limits

        n = hist.shape[0]
        out = [np.full((n, steps), np.nan) for _ in range(3)]
        # One BLAS thread: a small state-space fit is many times slower with threads
        # competing for a few cores.
        with threadpool_limits(limits=1), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i, row in enumerate(hist):
                if np.isfinite(row).sum() < sum(self.order) + 3:
                    continue
                try:
                    result = ARIMA(row, order=self.order).fit()
                    frame = result.get_forecast(steps).summary_frame(alpha=1 - level)
                except (ValueError, np.linalg.LinAlgError):
                    continue
                for a, column in zip(out, ("mean", "mean_ci_lower", "mean_ci_upper"), strict=True):
                    a[i] = frame[column].to_numpy()
        return out[0], out[1], out[2]


def half_width(spread: FloatArray, level: float) -> FloatArray:
    """Half width at the two-sided `level` of a normal error of standard error `spread`."""
    out: FloatArray = NormalDist().inv_cdf(0.5 + level / 2) * spread
    return out


def last_finite(hist: FloatArray) -> FloatArray:
    """Each row's last finite value (NaN for a row with none)."""
    n, t = hist.shape
    if not t:
        return np.full(n, np.nan)
    finite = np.isfinite(hist)
    idx = t - 1 - np.argmax(finite[:, ::-1], axis=1)
    out: FloatArray = np.where(finite.any(axis=1), hist[np.arange(n), idx], np.nan)
    return out


def nanmean_rows(a: FloatArray) -> FloatArray:
    """Each row's mean of its finite values (0 for a row with none)."""
    finite = np.isfinite(a)
    count = finite.sum(axis=1)
    total = np.where(finite, a, 0.0).sum(axis=1)
    out: FloatArray = np.where(count > 0, total / np.maximum(count, 1), 0.0)
    return out


def inverse_root_modulus(phi: FloatArray) -> FloatArray:
    """Per row of `phi` (n, p): the largest modulus of the inverse characteristic roots
    (the eigenvalues of the AR companion matrix); below 1 is stationary. NaN for a NaN row."""
    n, p = phi.shape
    if p == 0:
        return np.zeros(n)
    finite: BoolArray = np.asarray(np.isfinite(phi).all(axis=1))
    companion = np.zeros((n, p, p))
    companion[:, 0, :] = np.where(finite[:, None], phi, 0.0)
    companion[:, 1:, :-1] = np.eye(p - 1)
    out: FloatArray = np.abs(np.linalg.eigvals(companion)).max(axis=1)
    out[~finite] = np.nan
    return out


def stable(modulus: FloatArray) -> BoolArray:
    """Rows whose fit has every characteristic root outside the unit circle."""
    with np.errstate(invalid="ignore"):
        ok: BoolArray = np.asarray(modulus < 1.0 - ROOT_MARGIN)
    return ok


def within_band(paths: FloatArray, hist: FloatArray) -> BoolArray:
    """Rows (n,) whose path stays inside the window's range widened by BAND ranges each
    side (a flat window's range counts as a millionth of its level: only a flat path
    passes)."""
    with np.errstate(invalid="ignore"):
        lo, hi = np.fmin.reduce(hist, axis=1), np.fmax.reduce(hist, axis=1)
        span = np.maximum(hi - lo, 1e-6 * np.maximum(np.abs(hi), 1.0))
        low, high = lo - BAND * span, hi + BAND * span
        inside = (paths >= low[:, None]) & (paths <= high[:, None])
    ok: BoolArray = np.asarray(inside.all(axis=1))
    return ok
