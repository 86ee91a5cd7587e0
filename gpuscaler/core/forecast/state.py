"""What the forecaster carries from one tick to the next, per series: the fitted
coefficients (refitted every `forecast.refit_every`), the ensemble's scoring made at the
refit and rolled on since, and the adaptive interval's level with the intervals issued and
not yet observed. One typed value in, a new one out: nothing is kept anywhere else."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from gpuscaler.core.forecast.intervals import Adaptive, fresh
from gpuscaler.core.model import FloatArray


@dataclass(frozen=True, eq=False)
class Scoring:
    """One series' ensemble scoring: made at a refit, its errors rolled on every tick."""

    method: str | None
    """"ensemble" or "last_value"; None: too little recent evidence (the model's path)."""
    weights: FloatArray
    """Per member (`ensemble.MEMBERS`): inverse corrected recent squared error."""
    errors: Mapping[str, float]
    """Recent MAE per member and candidate at the refit (the forecast's `errors`)."""
    ses_best: int
    """Index of the best-fit smoothing constant in SES_ALPHAS."""
    ses_inv: FloatArray
    """Inverse recent squared error of each smoothing constant."""
    recent: FloatArray
    """The chosen method's absolute errors (ASSESS_ORIGINS, steps), oldest origin first,
    NaN before the first origin scored: its conformal interval at any level."""
    peaks: FloatArray
    """The chosen method's peak errors (ASSESS_ORIGINS,), in the same order."""
    newest: float
    """Time of the newest origin scored."""


@dataclass(frozen=True, eq=False)
class SeriesState:
    """One series' forecasting state."""

    fitted_at: float
    intercept: float
    phi: FloatArray
    sigma2: float
    modulus: float
    """Largest inverse root modulus of `phi`: the fit is used only below 1."""
    scoring: Scoring | None
    """None: not scored yet (a young window), tried again every tick."""
    level: float
    points: int
    misses: int
    checked_at: float
    issued_at: FloatArray
    """(slots,) when each pending interval was issued; NaN: an empty slot."""
    bounds: FloatArray
    """(slots, 2, steps) each pending interval's lower and upper bounds."""


@dataclass(frozen=True, eq=False)
class ForecastState:
    """Every series' state by its key (a pool's or a workload's)."""

    series: Mapping[str, SeriesState] = field(default_factory=lambda: MappingProxyType({}))


EMPTY = ForecastState()


def adaptive_of(
    found: Sequence[SeriesState | None], slots: int, steps: int, nominal: float
) -> Adaptive:
    """The rows' adaptive states as arrays (a row without a state, or with one for another
    horizon, starts afresh)."""
    a = fresh(len(found), slots, steps, nominal)
    rows = [r for r, s in enumerate(found) if s is not None and s.bounds.shape == (slots, 2, steps)]
    if rows:
        kept = [s for r in rows if (s := found[r]) is not None]
        a.level[rows] = [s.level for s in kept]
        a.points[rows] = [s.points for s in kept]
        a.misses[rows] = [s.misses for s in kept]
        a.checked_at[rows] = [s.checked_at for s in kept]
        a.issued_at[rows] = np.stack([s.issued_at for s in kept])
        a.bounds[rows] = np.stack([s.bounds for s in kept])
    return a
