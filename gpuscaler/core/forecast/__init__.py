"""Forecasting: series in, forecasts with intervals and a peak out. Pure computation.

`members` (bucket means, flat members), `arima` (batched ARIMA(p, d, 0) and its stability
rules), `ensemble` (members weighted by recent error), `intervals` (adaptive conformal
intervals, the peak), `state` (carried between ticks), `pipeline` (`forecast`, the batch
put together), `leading` (a workload's demand mapped to GPU load, when more accurate).
"""

from gpuscaler.core.forecast.arima import Arima, StatsmodelsArima
from gpuscaler.core.forecast.ensemble import FALLBACK_MARGIN, WINDOW_MEAN_POINTS
from gpuscaler.core.forecast.leading import LEAD_MARGIN, Ratio, fit_ratio, lead
from gpuscaler.core.forecast.members import SES_ALPHAS, bucket
from gpuscaler.core.forecast.pipeline import Clip, forecast
from gpuscaler.core.forecast.state import EMPTY, ForecastState, Rows, merged, reissued

__all__ = [
    "EMPTY",
    "FALLBACK_MARGIN",
    "LEAD_MARGIN",
    "SES_ALPHAS",
    "WINDOW_MEAN_POINTS",
    "Arima",
    "Clip",
    "ForecastState",
    "Ratio",
    "Rows",
    "StatsmodelsArima",
    "bucket",
    "fit_ratio",
    "forecast",
    "lead",
    "merged",
    "reissued",
]
