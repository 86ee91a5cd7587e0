"""What only changes at a refit, kept per series until the next one (issue 18).

Scoring the ensemble (every member at up to ASSESS_ORIGINS in-window origins over the
horizon) is most of a forecast's cost, yet its results (the members' weights, the
choice between the ensemble and the last value, the recent errors, the conformal
errors and the peak offset) are made when the coefficients are refitted
(`forecast.refit_every`). They ride on the series' `FitState` as a `Scored`; a steady
tick only computes the members' live paths, combines them with the kept weights and
takes the conformal quantile at the current adaptive level from the kept, sorted errors.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuscaler.core.forecast.engines import last_finite
from gpuscaler.core.forecast.ensemble import (
    MEMBERS,
    WINDOW_MEAN_POINTS,
    Assessment,
    choose_method,
    combine,
    normalized,
    ses_last,
    smoothing_live,
    window_means,
)
from gpuscaler.core.forecast.intervals import peak_offset, ranked_half_width
from gpuscaler.core.model import BoolArray, FloatArray, Scored


def score(a: Assessment) -> list[Scored]:
    """One `Scored` per row of an assessment."""
    names = list(a.errors)
    table = np.stack([a.errors[k] for k in names], axis=1)  # (n, candidates)
    errors = [
        {k: v for k, v in zip(names, row, strict=True) if np.isfinite(v)} for row in table.tolist()
    ]
    methods = [choose_method(e) if "last_value" in e else None for e in errors]
    last = np.array([m == "last_value" for m in methods])
    # Only the chosen method's errors are kept: one sort (NaN last), not one per candidate.
    chosen = np.where(last[:, None, None], a.residuals["last_value"], a.residuals["ensemble"])
    ordered = np.sort(np.abs(chosen).swapaxes(1, 2), axis=2).swapaxes(1, 2)  # sort rows
    peaks = np.where(
        last, peak_offset(a.peak_errors["last_value"]), peak_offset(a.peak_errors["ensemble"])
    )
    raw = np.stack([a.raw_weights[m] for m in MEMBERS], axis=1).tolist()
    return [
        Scored(
            method=methods[r],
            weights=tuple(raw[r]),
            errors=errors[r],
            ses_best=int(a.ses_best[r]),
            ses_inv=a.ses_inv[:, r].copy(),
            abs_errors=ordered[r],
            peak=float(peaks[r]),
        )
        for r in range(table.shape[0])
    ]


def live_paths(
    hist: FloatArray, scored: Sequence[Scored], arima: FloatArray, usable: BoolArray, steps: int
) -> tuple[dict[str, FloatArray], dict[str, FloatArray]]:
    """Every member's path (n, steps) at the live origin with the kept smoothing weights,
    the ensemble (kept weights, over the members with a finite path) and the last value;
    and the weights (n,) per member, normalized over those members."""
    levels = smoothing_live(
        ses_last(hist),
        np.array([s.ses_best for s in scored], dtype=np.int64),
        np.stack([s.ses_inv for s in scored], axis=1),
    )
    end = np.array([hist.shape[1] - 1])
    levels["window_mean"] = window_means(hist, end, WINDOW_MEAN_POINTS)[:, 0]
    levels["last_value"] = last_finite(hist)
    live = {k: np.repeat(v[:, None], steps, axis=1) for k, v in levels.items()}
    live["arima"] = np.where(usable[:, None], arima, np.nan)
    raw = {m: np.array([s.weights[i] for s in scored]) for i, m in enumerate(MEMBERS)}
    weights = normalized(raw, live)
    live["ensemble"] = combine(weights, live)
    return live, weights


def half_widths(scored: Sequence[Scored], levels: FloatArray) -> FloatArray:
    """The conformal half width (n, steps) of each row's chosen method at its level, from
    the kept sorted errors (rows scored at different refits may hold different numbers
    of origins: the shorter are padded with NaN, which the rank ignores)."""
    depth = max(s.abs_errors.shape[0] for s in scored)
    steps = scored[0].abs_errors.shape[1]
    ordered = np.full((len(scored), depth, steps), np.nan)
    for r, s in enumerate(scored):
        ordered[r, : s.abs_errors.shape[0]] = s.abs_errors
    return ranked_half_width(ordered, levels)
