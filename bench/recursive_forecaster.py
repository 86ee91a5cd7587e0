"""A recursive forecaster (a study for issue 20, not product code): O(1) work per series
and tick, state carried across ticks and updated with one new bucket per call.

Rows are series; every update is a handful of numpy operations on (rows,), (rows,
members, steps) or (steps, rows) arrays, whatever the history's length.

Members (paths `steps` buckets ahead):
- the last value, the short window mean (`window` buckets) and the long one
  (`LONG_WINDOW`), both running sums over a ring of the last values; simple exponential
  smoothing at `ALPHAS` (levels carried);
- Holt's damped trend (level and trend carried);
- AR(p) on the differences, fitted by recursive least squares with forgetting factor
  `FORGET` (no refit, no kept window): the differences centred on an exponentially
  weighted drift and scaled by their exponentially weighted mean absolute value, so the
  regression is scale-free. Before forecasting, the coefficients are scaled so that the
  recursion's largest root is at most `MAX_RADIUS` (a batched 5x5 eigenvalue call) and
  turned into h-step maps, refreshed on a 1/`STABLE_EVERY` share of the rows each tick
  and kept in between (each row's every 5 min at 10 s; the fit itself moves every tick); and
  the drift is shrunk by its own noise (positive-part James-Stein), so a ramp keeps its
  slope and a noisy level does not extrapolate its drift's noise.

Weights: per member and step, the exponentially weighted absolute error (decay
`ERR_DECAY`) of the forecasts realized at this tick (a ring of the paths issued over the
last `steps` ticks; the flat members keep one value per issue, the damped trend its level
and trend); weight = error ** -`POWER`, normalized over the members.

Interval: per step, the combined forecast's realized error divided by its exponentially
weighted mean absolute error, with quantile trackers (q += eta * (tau - [u < q]), the
streaming pinball-loss update) at (1 -+ level) / 2: no sort, no kept errors. The peak is
the path's maximum plus a tracked median of the realized peak errors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]

ALPHAS = (0.03, 0.05, 0.1, 0.2, 0.3, 0.6)
LONG_WINDOW = 60  # buckets of the long window mean (10 min at 10 s)
HOLT = (0.3, 0.1, 0.9)  # level constant, trend constant, damping
P = 5
FORGET = 0.995
DRIFT_DECAY = 0.02
MAX_RADIUS = 0.98  # the AR recursion's largest root modulus, at most
STABLE_EVERY = 30  # each row's forecasting coefficients refreshed this often (staggered)
Z_MAX = 10.0  # the AR's forecast differences, in units of their mean absolute value
SHRINK = 1.0  # the drift's noise variance multiplier in its shrinkage
ERR_DECAY = 0.02
POWER = 3  # an integer: the weights are a product
POOLED = False  # one weight per member from its error averaged over the steps
SCALE_DECAY = 0.02
QUANTILE_ETA = 0.02
TINY = 1e-12


@dataclass(frozen=True)
class Paths:
    """One tick's output per row: mean, lower and upper (rows, steps), peak (rows,)."""

    mean: Floats
    lower: Floats
    upper: Floats
    peak: Floats


class RecursiveForecaster:
    """`rows` series forecast `steps` buckets ahead at interval `level`; call `update`
    with each new bucket (rows,) in time order (NaN: missing, the last value held)."""

    def __init__(self, rows: int, steps: int, window: int = 12, level: float = 0.7):
        self.n, self.h, self.k = rows, steps, window
        self.taus = ((1 - level) / 2, (1 + level) / 2)
        self.t = 0  # updates so far
        # last, window mean, long window mean, SES..., Holt, AR
        m = self.members = 5 + len(ALPHAS)
        self.flat = 3 + len(ALPHAS)
        phi = HOLT[2]
        self.cphi = np.cumsum(phi ** np.arange(1, steps + 1))  # damped trend multipliers
        self.alphas = np.array(ALPHAS)
        self.ring_len = max(steps, window, LONG_WINDOW) + 1
        self.sums = np.zeros((rows, 2))  # of the last `window`, LONG_WINDOW values
        self.widths = np.array([window, LONG_WINDOW], dtype=float)
        self.values = np.zeros((rows, self.ring_len))
        self.ses = np.zeros((rows, len(ALPHAS)))
        self.level, self.trend = np.zeros(rows), np.zeros(rows)
        self.drift, self.scale = np.zeros(rows), np.zeros(rows)
        self.spread = np.zeros(rows)
        self.lags = np.zeros((rows, P))  # newest first
        self.theta = np.zeros((rows, P))
        self.phase = np.arange(rows) % STABLE_EVERY
        self.ahead = np.zeros((rows, steps, P))  # h-step maps of the last p differences
        self.cov = np.repeat(np.eye(P)[None] * 100.0, rows, axis=0)
        self.err = np.full((rows, m, steps), np.nan)  # per member and step
        self.comb_scale = np.full((rows, steps), np.nan)
        self.q = np.stack([np.full((rows, steps), -1.3), np.full((rows, steps), 1.3)])
        self.peak_off, self.peak_scale = np.zeros(rows), np.full(rows, np.nan)
        # What was issued in the last `steps` ticks, by slot t % steps.
        self.ring_flat = np.zeros((steps, rows, self.flat))
        self.ring_holt = np.zeros((steps, rows, 2))
        self.ring_ar = np.zeros((steps, rows, steps), dtype=np.float32)
        self.ring_comb = np.zeros((steps, rows, steps), dtype=np.float32)
        self.ring_pmax = np.zeros((steps, rows))

    def update(self, y: Floats) -> Paths:
        """Take the newest bucket of every row; the forecasts from it."""
        seen = np.isfinite(y)
        if self.t == 0:
            y = np.where(seen, y, 0.0)
            self._start(y)
        else:
            y = np.where(seen, y, self.values[:, (self.t - 1) % self.ring_len])
            self._score(y, seen)
            self._learn(y)
        if self.t:
            gone = (self.t - np.array([self.k, LONG_WINDOW])) % self.ring_len
            self.sums += y[:, None] - self.values[:, gone]
        self.values[:, self.t % self.ring_len] = y
        out = self._issue(y)
        self.t += 1
        return out

    def _start(self, y: Floats) -> None:
        self.values[:] = y[:, None]
        self.sums[:] = y[:, None] * self.widths
        self.ses[:] = y[:, None]
        self.level[:] = y

    def _score(self, y: Floats, seen: npt.NDArray[np.bool_]) -> None:
        """Errors of every forecast realized by `y`: each step h's from the tick h ago."""
        hs = np.arange(1, self.h + 1)
        ok = (hs <= self.t)[None, :] & seen[:, None]  # (rows, steps)
        slots = (self.t - hs) % self.h
        flat = self.ring_flat[slots].transpose(1, 2, 0)  # (rows, flat, steps)
        lt = self.ring_holt[slots]  # (steps, rows, 2)
        holt = (lt[:, :, 0] + lt[:, :, 1] * self.cphi[:, None]).T
        ar = self.ring_ar[slots, :, hs - 1].T
        pred = np.concatenate([flat, holt[:, None], ar[:, None]], axis=1)
        self.err = _ew(self.err, np.abs(y[:, None, None] - pred), ERR_DECAY, ok[:, None, :])
        e = y[:, None] - self.ring_comb[slots, :, hs - 1].T  # (rows, steps)
        u = e / (self.comb_scale + TINY)
        for i, tau in enumerate(self.taus):
            moved = self.q[i] + QUANTILE_ETA * (tau - (u < self.q[i]))
            self.q[i] = np.where(ok & np.isfinite(u), moved, self.q[i])
        self.comb_scale = _ew(self.comb_scale, np.abs(e), SCALE_DECAY, ok)
        if self.t >= self.h:  # the peak issued `steps` ticks ago is realized
            recent = (self.t - np.arange(self.h)) % self.ring_len
            vals = self.values[:, recent[1:]]
            actual = np.maximum(vals.max(axis=1) if vals.size else -np.inf, y)
            pe = actual - self.ring_pmax[self.t % self.h]
            self.peak_scale = _ew(self.peak_scale, np.abs(pe - self.peak_off), SCALE_DECAY, seen)
            step = QUANTILE_ETA * np.nan_to_num(self.peak_scale) * np.sign(pe - self.peak_off)
            self.peak_off = np.where(seen, self.peak_off + step, self.peak_off)

    def _learn(self, y: Floats) -> None:
        """The members' states moved by `y`."""
        self.ses += self.alphas * (y[:, None] - self.ses)
        a, b, phi = HOLT
        level = a * y + (1 - a) * (self.level + phi * self.trend)
        self.trend = b * (level - self.level) + (1 - b) * phi * self.trend
        self.level = level
        d = y - self.values[:, (self.t - 1) % self.ring_len]
        first = self.t == 1
        self.scale = np.abs(d) if first else self.scale + DRIFT_DECAY * (np.abs(d) - self.scale)
        self.drift = d if first else self.drift + DRIFT_DECAY * (d - self.drift)
        spread = (d - self.drift) ** 2
        self.spread = spread if first else self.spread + DRIFT_DECAY * (spread - self.spread)
        z = (d - self.drift) / (self.scale + TINY)
        x = self.lags
        px = np.einsum("nij,nj->ni", self.cov, x)
        gain = px / (FORGET + np.einsum("ni,ni->n", x, px))[:, None]
        resid = z - np.einsum("ni,ni->n", self.theta, x)
        self.theta += gain * resid[:, None]
        self.cov = (self.cov - gain[:, :, None] * px[:, None, :]) / FORGET
        trace = np.einsum("nii->n", self.cov)
        self.cov /= np.maximum(trace / (100.0 * P), 1.0)[:, None, None]  # no blow-up
        self.lags = np.concatenate([z[:, None], x[:, :-1]], axis=1)

    def _ar_path(self, y: Floats) -> Floats:
        """The AR member's path: the differences forecast from the last p, centred and
        scaled back. The forecasting coefficients are refreshed from the recursive fit
        on a 1/`STABLE_EVERY` share of the rows each tick (each row every
        `STABLE_EVERY` ticks: 5 min at 10 s) and kept in between, as h-step maps."""
        due = self.phase == self.t % STABLE_EVERY
        if due.any():
            self.ahead[due] = _ahead(self.theta[due], self.h)
        z = np.einsum("nhp,np->nh", self.ahead, self.lags)
        np.clip(z, -Z_MAX, Z_MAX, out=z)
        noise = self.spread * DRIFT_DECAY / (2 - DRIFT_DECAY) * SHRINK
        drift = self.drift * np.maximum(1 - noise / (self.drift**2 + TINY), 0.0)
        diffs = drift[:, None] + self.scale[:, None] * z
        path: Floats = y[:, None] + np.cumsum(diffs, axis=1)
        return path

    def _issue(self, y: Floats) -> Paths:
        """Every member's path, their weighted combination, its interval and peak; what
        the scoring needs kept in the rings."""
        flat = np.concatenate([y[:, None], self.sums / self.widths, self.ses], axis=1)
        holt = self.level[:, None] + self.trend[:, None] * self.cphi
        ar = self._ar_path(y)
        err = self.err.mean(axis=2, keepdims=True) if POOLED else self.err
        inv = 1.0 / (err + TINY * (1.0 + np.abs(y))[:, None, None])
        weights = inv.copy()
        for _ in range(POWER - 1):  # a product: a float power is some 5 times dearer
            weights *= inv
        weights = np.where(np.isfinite(weights), weights, 1.0)
        weights /= weights.sum(axis=1, keepdims=True)
        weights = np.broadcast_to(weights, self.err.shape)
        mean = (weights[:, : self.flat] * flat[:, :, None]).sum(axis=1)
        mean = mean + weights[:, self.flat] * holt + weights[:, self.flat + 1] * ar
        scale = np.where(np.isfinite(self.comb_scale), self.comb_scale, 0.0)
        lower, upper = mean + self.q[0] * scale, mean + self.q[1] * scale
        pmax = mean.max(axis=1)
        slot = self.t % self.h
        self.ring_flat[slot] = flat
        self.ring_holt[slot, :, 0], self.ring_holt[slot, :, 1] = self.level, self.trend
        self.ring_ar[slot], self.ring_comb[slot], self.ring_pmax[slot] = ar, mean, pmax
        return Paths(mean, lower, upper, pmax + self.peak_off)


def _ew(old: Floats, new: Floats, decay: float, ok: npt.NDArray[np.bool_]) -> Floats:
    """Exponentially weighted mean moved by `new` where `ok` (started at the first)."""
    with np.errstate(invalid="ignore"):  # NaN where not started yet
        moved = new - old
        moved *= decay
        moved += old
    fresh = np.isnan(old)
    if fresh.any():
        np.copyto(moved, new, where=fresh)
    np.copyto(old, moved, where=ok)
    return old


def _ahead(theta: Floats, steps: int) -> Floats:
    """Per row of AR coefficients (rows, p), the maps (rows, steps, p) from the last p
    values (newest first) to the forecasts 1..steps ahead: the first rows of the
    companion matrix's powers, by doubling (C^(k+1..2k) = C^k C^(1..k)), after its
    spectral radius is brought down to MAX_RADIUS where above (theta_k scaled by c ** k
    scales every root by c)."""
    rows, p = theta.shape
    companion = np.zeros((rows, p, p))
    companion[:, np.arange(1, p), np.arange(p - 1)] = 1.0
    companion[:, 0, :] = theta
    radius = np.abs(np.linalg.eigvals(companion)).max(axis=1)
    c = np.minimum(MAX_RADIUS / np.maximum(radius, TINY), 1.0)
    companion[:, 0, :] = theta * c[:, None] ** np.arange(1, p + 1)
    powers = companion[:, None]
    while powers.shape[1] < steps:
        powers = np.concatenate([powers, powers[:, -1:] @ powers], axis=1)
    out: Floats = powers[:, :steps, 0, :]
    return out
