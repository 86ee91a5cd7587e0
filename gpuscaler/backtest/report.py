"""The backtest over every series of a CSV: pooled and per-series scores, the worst one."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from gpuscaler.backtest.evaluate import (
    Errors,
    Reference,
    Scores,
    evaluate_series,
    rounded,
    scores,
)
from gpuscaler.backtest.series import BacktestError, demand_for, load_series_csv, on_grid, to_grid
from gpuscaler.config import ForecastConfig
from gpuscaler.core.model import FloatArray

METHODS = ("gpuscaler", "naive", "window_mean", "statsmodels_arima")
AGGREGATIONS = ("mean", "sum", "max", "count")


def backtest(
    path: str | Path,
    cfg: ForecastConfig,
    horizon: float,
    window: float,
    resample: float | None = None,
    agg: str = "mean",
    max_origins: int = 400,
    reference: Reference | None = None,
    demand_path: str | Path | None = None,
    demand_agg: str | None = None,
) -> dict[str, Any]:
    """Every series of the CSV scored per series and pooled; `worst` names the series on
    which the forecaster did worst relative to the last value. A constant series is
    scored like any other (the last value's error is 0 there). With `demand_path`, each
    series' demand (same name, or the file's only series) is the leading signal."""
    for a in (agg, demand_agg or agg):
        if a not in AGGREGATIONS:
            raise BacktestError(f"--agg must be one of {', '.join(AGGREGATIONS)}, not {a!r}")
    raw = load_series_csv(path)
    demands = load_series_csv(demand_path) if demand_path is not None else None
    methods = METHODS + (("gpuscaler_load_only",) if demands is not None else ())
    if agg == "count" and len(raw) > 1 and len({len(s) for s in raw.values()}) == 1:
        # Counting rows per bin gives the same series whatever the value column.
        first = next(iter(raw.values()))
        if all(np.array_equal(s.index, first.index) for s in raw.values()):
            raw = {"count": first}
    per_series: dict[str, dict[str, Scores]] = {}
    pooled: dict[str, Errors] = {m: Errors([], [], []) for m in methods}
    for name, s in raw.items():
        grid = to_grid(name, s, resample, agg, str(path))
        demand = None
        if demands is not None:
            d = demand_for(name, demands, str(demand_path))
            demand = on_grid(to_grid(name, d, resample, demand_agg or agg, str(demand_path)), grid)
        try:
            errors = evaluate_series(
                grid, cfg, horizon, window, max_origins, reference=reference, demand=demand
            )
        except BacktestError as e:
            raise BacktestError(f"{path}: series {name!r}: {e}") from e
        per_series[name] = scores(errors)
        for m, errs in errors.items():
            # Pool relative errors by scaling each series by its own naive MAE, so a
            # series with large values does not drown the rest.
            scale = _scale(per_series[name]["naive"].mae, grid.values)
            pooled[m].abs_err += [x / scale for x in errs.abs_err]
            pooled[m].peak_err += [x / scale for x in errs.peak_err]
            pooled[m].inside += errs.inside
            pooled[m].won += errs.won
    overall = scores(pooled)
    return {
        "horizon_s": horizon,
        "overall": {m: _overall(overall[m], per_series, m) for m in methods},
        "series": {n: {m: sc.as_dict() for m, sc in s.items()} for n, s in per_series.items()},
        "worst": _worst(per_series),
    }


def _scale(naive_mae: float, values: FloatArray) -> float:
    """What a series' errors are divided by when pooled: its naive MAE, or for a series
    the last value forecasts perfectly (constant), its mean absolute level (1 if 0)."""
    if naive_mae and math.isfinite(naive_mae):
        return naive_mae
    finite = values[np.isfinite(values)]
    level = float(np.mean(np.abs(finite))) if finite.size else 0.0
    return level or 1.0


def _worst(per_series: dict[str, dict[str, Scores]]) -> dict[str, Any]:
    """The series where gpuscaler is worst against the last value (by MAE when no series
    has a relative figure, e.g. all constant)."""
    if not per_series:
        return {}

    def key(name: str) -> tuple[float, float]:
        g = per_series[name]["gpuscaler"]
        rel = g.relative_to_naive if math.isfinite(g.relative_to_naive) else -math.inf
        return rel, g.mae if math.isfinite(g.mae) else -math.inf

    name = max(per_series, key=key)
    return {"series": name, **per_series[name]["gpuscaler"].as_dict()}


def _overall(
    scores: Scores, per_series: dict[str, dict[str, Scores]], method: str
) -> dict[str, float | int | None]:
    """Overall: relative_to_naive and coverage pooled across series (each series' errors
    scaled by its own naive MAE); mae and peak_mae averaged over series in their units."""
    d = scores.as_dict()
    d["mae"] = rounded(float(np.mean([s[method].mae for s in per_series.values()])))
    d["peak_mae"] = rounded(float(np.mean([s[method].peak_mae for s in per_series.values()])))
    return d
