"""Rolling-origin backtest of the forecaster against baselines (the last value, a window
mean, statsmodels' ARIMA) on any CSV of `timestamp,value[,series]`, every method seeing
the same history at each origin; with a demand CSV, the leading signal too. The scores
are documented in docs/forecasting.md ("Backtesting a series")."""

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
