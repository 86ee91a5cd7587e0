"""Rolling-origin backtest of the forecaster against baselines on any CSV of
`timestamp,value[,series]`.

At each origin every method sees the same window of history and forecasts the horizon;
scores are averaged over origins and over the horizon's steps:

- `mae`: mean absolute error over the horizon path;
- `relative_to_naive`: MAE / the last-value forecast's MAE (below 1 beats it);
- `peak_mae`: error of the forecast's maximum over the horizon against the actual maximum;
- `coverage`: share of actual points inside the method's prediction interval.

Methods: `gpuscaler` (the production forecaster, run origin after origin with the fit
states the controller threads from tick to tick: refits, the adaptive interval level; its
peak is `Forecast.peak`), `naive` (last value), `window_mean` (mean of the last
12 points), `statsmodels_arima` (statsmodels ARIMA of the configured order, refitted at
each origin). Baselines' intervals are the empirical quantiles of their own errors at each
step within the window.

With a demand CSV (`--demand`: the workloads' request rate or queue length, same series
names, or one series for all), `gpuscaler` forecasts with the leading signal as the
controller does (`gpuscaler.core.forecast.leading`), `gpuscaler_load_only` without it, and
`demand_won` is the share of origins where the demand-mapped forecast won.
"""

from __future__ import annotations

from gpuscaler.backtest.evaluate import Scores, evaluate_series
from gpuscaler.backtest.report import AGGREGATIONS, METHODS, backtest
from gpuscaler.backtest.series import BacktestError, load_series_csv, on_grid, to_grid

__all__ = [
    "AGGREGATIONS",
    "METHODS",
    "BacktestError",
    "Scores",
    "backtest",
    "evaluate_series",
    "load_series_csv",
    "on_grid",
    "to_grid",
]
