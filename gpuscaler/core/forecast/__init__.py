"""Forecasting: series in, forecasts with intervals and a peak out. Pure computation.

`members` (bucket means, flat members), `arima` (batched ARIMA(p, d, 0) and its stability
rules), `ensemble` (members weighted by recent error), `intervals` (adaptive conformal
intervals, the peak), `state` (carried between ticks), `pipeline` (`forecast`, the batch
put together), `leading` (a workload's demand mapped to GPU load, when more accurate).
"""

from gpuscaler.core.forecast.arima import Arima, StatsmodelsArima
from gpuscaler.core.forecast.ensemble import WINDOW_MEAN_POINTS
from gpuscaler.core.forecast.leading import fit_ratio, lead
from gpuscaler.core.forecast.members import bucket
from gpuscaler.core.forecast.pipeline import Clip, forecast
from gpuscaler.core.forecast.state import EMPTY, ForecastState, merged, reissued

__all__ = [
    "EMPTY",
    "WINDOW_MEAN_POINTS",
    "Arima",
    "Clip",
    "ForecastState",
    "StatsmodelsArima",
    "bucket",
    "fit_ratio",
    "forecast",
    "lead",
    "merged",
    "reissued",
]
