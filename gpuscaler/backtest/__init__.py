"""Rolling-origin backtest of the forecaster against baselines (the last value, a window
mean, statsmodels' ARIMA) on any CSV of `timestamp,value[,series]`, every method seeing
the same history at each origin; with a demand CSV, the leading signal too. The scores
are documented in docs/forecasting.md ("Backtesting a series")."""

from __future__ import annotations

from gpuscaler.backtest.report import backtest
from gpuscaler.backtest.series import BacktestError, load_series_csv, on_grid, to_grid

__all__ = ["BacktestError", "backtest", "load_series_csv", "on_grid", "to_grid"]
