"""What the forecaster carries from one tick to the next, per series: the fitted
coefficients, the ensemble's scoring, and the adaptive interval's level with the
intervals issued and not yet observed. One typed value in, a new one out.

Arrays with a row per series, one `Rows` per batch of series that share a forecast
section; a tick gathers its series' rows by key.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from gpuscaler.core.forecast.arima import Coefficients
from gpuscaler.core.forecast.ensemble import MEMBERS
from gpuscaler.core.forecast.intervals import Adaptive
from gpuscaler.core.model import BoolArray, FloatArray, IntArray

METHODS = ("", "ensemble", "last_value")
"""A scoring's method by code: 0 none (too little evidence: the model's own path)."""
CANDIDATES = (*MEMBERS, "window_mean_long", "last_value", "ensemble")
"""What a scoring reports a recent error of, in the order of `Scorings.errors`."""


@dataclass(frozen=True, eq=False)
class Scorings:
    """Rows' ensemble scorings: made at a refit, their errors rolled on every tick."""

    scored: BoolArray  # (n,) a scoring was made (else: scored again next tick)
    method: IntArray  # (n,) index into METHODS
    weights: FloatArray  # (n, members) inverse corrected recent squared error
    errors: FloatArray  # (n, candidates) recent MAE at the refit, NaN: none
    ses_best: IntArray  # (n,) index of the best-fit smoothing constant
    ses_inv: FloatArray  # (n, alphas) inverse recent squared error of each constant
    recent: FloatArray  # (n, origins, steps) the chosen method's absolute errors at its
    # recent origins, a ring (NaN: not scored yet): its conformal interval at any level
    peaks: FloatArray  # (n, origins) the chosen method's peak errors, in the same ring
    head: IntArray  # (n,) where the ring's next origin goes, in place of its oldest
    newest: FloatArray  # (n,) time of the newest origin scored


@dataclass(frozen=True, eq=False)
class Rows:
    """A batch's state, a row per key (every array's first axis)."""

    keys: tuple[str, ...]
    fitted_at: FloatArray  # (n,) NaN: never fitted
    coefficients: Coefficients
    modulus: FloatArray  # (n,) largest inverse root modulus: the fit is used only below 1
    scorings: Scorings
    adaptive: Adaptive


@dataclass(frozen=True, eq=False)
class ForecastState:
    """Every series' state: the batches of the tick that made it."""

    batches: tuple[Rows, ...] = ()

    def get(self, key: str) -> Rows | None:
        """The series' state as a batch of one (None: not known)."""
        for rows in self.batches:
            if key in rows.keys:
                return take(rows, [rows.keys.index(key)], (key,))
        return None


EMPTY = ForecastState()

T = TypeVar("T")


def take(rows: T, idx: Any, keys: tuple[str, ...] | None = None) -> T:
    """`rows` (a state dataclass of arrays) at the row index `idx`, nested ones too."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(rows):  # type: ignore[arg-type]
        value = getattr(rows, f.name)
        if isinstance(value, np.ndarray):
            changes[f.name] = value[idx]
        elif dataclasses.is_dataclass(value):
            changes[f.name] = take(value, idx)
    if keys is not None:
        changes["keys"] = keys
    return dataclasses.replace(rows, **changes)  # type: ignore[type-var]


def put(into: T, at: Any, rows: T, idx: Any) -> None:
    """Write `rows`' rows `idx` into `into`'s rows `at`, in place (fresh arrays only)."""
    for f in dataclasses.fields(into):  # type: ignore[arg-type]
        target = getattr(into, f.name)
        if isinstance(target, np.ndarray):
            target[at] = getattr(rows, f.name)[idx]
        elif dataclasses.is_dataclass(target):
            put(target, at, getattr(rows, f.name), idx)


def same_shape(a: object, b: object) -> bool:
    """Whether two states' arrays have the same shape past the row axis."""
    for f in dataclasses.fields(a):  # type: ignore[arg-type]
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray) and x.shape[1:] != y.shape[1:]:
            return False
        if dataclasses.is_dataclass(x) and not same_shape(x, y):
            return False
    return True


def gathered(state: ForecastState, keys: Sequence[str], fresh: Rows) -> tuple[Rows, BoolArray]:
    """`fresh` (the batch's rows, all new) with each key's row from `state` where it has
    one of the same shape (a changed section starts the series afresh); and which rows
    were found."""
    found = np.zeros(len(keys), dtype=bool)
    position = {key: r for r, key in enumerate(keys)}
    for old in state.batches:
        if not same_shape(old, fresh):
            continue
        pairs = [(position[k], i) for i, k in enumerate(old.keys) if k in position]
        if pairs:
            at, idx = (list(p) for p in zip(*pairs, strict=True))
            put(fresh, at, old, idx)
            found[at] = True
    return fresh, found


def reissued(
    state: ForecastState, key: str, now: float, lower: FloatArray, upper: FloatArray
) -> ForecastState:
    """`state` with the interval `key`'s series issued at `now` replaced by `lower`,
    `upper` (the one that finally reached a decision), so its adaptive level tracks it."""
    batches = list(state.batches)
    for b, rows in enumerate(batches):
        if key not in rows.keys:
            continue
        r = rows.keys.index(key)
        slots = np.flatnonzero(np.abs(rows.adaptive.issued_at[r] - now) < 1e-9)
        if slots.size:
            bounds = rows.adaptive.bounds.copy()
            bounds[r, slots[0], 0], bounds[r, slots[0], 1] = lower, upper
            adaptive = dataclasses.replace(rows.adaptive, bounds=bounds)
            batches[b] = dataclasses.replace(rows, adaptive=adaptive)
    return ForecastState(tuple(batches))


def merged(*states: ForecastState) -> ForecastState:
    """The batches of several states together (the batches of one tick)."""
    return ForecastState(tuple(rows for s in states for rows in s.batches))


def errors_dict(row: FloatArray) -> dict[str, float]:
    """A row of `Scorings.errors` as the forecast reports it: the finite ones by name."""
    return {k: v for k, v in zip(CANDIDATES, row.tolist(), strict=True) if math.isfinite(v)}
