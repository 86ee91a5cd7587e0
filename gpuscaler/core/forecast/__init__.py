"""Forecasting: series in, forecasts with intervals and a peak out. Pure computation.

- `members`: the windows as bucket means, and the flat members' levels (smoothing,
  window means);
- `arima`: ARIMA(p, d, 0) fitted for every series at once by least squares, its paths, and
  the stability rules a fit must pass (statsmodels' ARIMA as the reference);
- `ensemble`: the members scored on each series' own recent history, weighted by evidence;
- `intervals`: split-conformal intervals at an adaptive level, and the peak's offset;
- `state`: what is carried from tick to tick, one typed value per series;
- `pipeline`: `forecast`, the batch put together;
- `leading`: a workload's demand forecast and mapped to GPU load, used when it has been
  the more accurate signal.
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
