"""What the forecaster carries from one tick to the next, per series: the fitted
coefficients, the ensemble's scoring, and the adaptive interval's level with the
intervals issued and not yet observed. One typed value in, a new one out.

Arrays with a row per series, one `Rows` per batch of series that share a forecast
section; a tick gathers its series' rows by key.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
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
    recent: FloatArray  # (n, steps, origins) the chosen method's absolute errors at its
    # recent origins, a ring along the last axis (NaN: not scored yet): its conformal
    # interval at any level, sorted along contiguous memory
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
    spread: FloatArray  # (n, steps) the fit's forecast standard error
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
            changes[f.name] = np.take(value, idx, axis=0)
        elif dataclasses.is_dataclass(value):
            changes[f.name] = take(value, idx)
    if keys is not None:
        changes["keys"] = keys
    return dataclasses.replace(rows, **changes)  # type: ignore[type-var]


def joined(batches: Sequence[T]) -> T:
    """The rows of several batches (state dataclasses of arrays) one after another."""
    first = batches[0]
    if len(batches) == 1:
        return first
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(first):  # type: ignore[arg-type]
        values = [getattr(b, f.name) for b in batches]
        if isinstance(values[0], np.ndarray):
            changes[f.name] = np.concatenate(values)
        elif dataclasses.is_dataclass(values[0]):
            changes[f.name] = joined(values)
        elif isinstance(values[0], tuple):
            changes[f.name] = tuple(k for v in values for k in v)
    return dataclasses.replace(first, **changes)  # type: ignore[type-var]


def same_shape(a: object, b: object) -> bool:
    """Whether two states' arrays have the same shape past the row axis."""
    for f in dataclasses.fields(a):  # type: ignore[arg-type]
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray) and x.shape[1:] != y.shape[1:]:
            return False
        if dataclasses.is_dataclass(x) and not same_shape(x, y):
            return False
    return True


def gathered(
    state: ForecastState, keys: tuple[str, ...], new: Callable[[tuple[str, ...]], Rows]
) -> tuple[Rows, BoolArray]:
    """The batch's rows (read only: they may be `state`'s own): each key's row from `state`
    where it has one shaped as `new`'s (a changed section starts the series afresh), else
    from `new` (rows of keys never seen); and which rows were found."""
    sources = [old for old in state.batches if same_shape(old, new(()))]
    where = {k: (s, i) for s, old in enumerate(sources) for i, k in enumerate(old.keys)}
    found = np.array([k in where for k in keys], dtype=bool)
    missing = tuple(k for k in keys if k not in where)
    if missing:
        where.update((k, (len(sources), i)) for i, k in enumerate(missing))
        sources.append(new(missing))
    used = sorted({where[k][0] for k in keys})
    sizes = [len(sources[s].keys) for s in used]
    start = dict(zip(used, np.cumsum([0, *sizes[:-1]]).tolist(), strict=True))
    rows = joined([sources[s] for s in used])
    if rows.keys == keys:  # the same keys in the same order (every tick's usual case)
        return rows, found
    idx = np.array([start[s] + i for s, i in (where[k] for k in keys)], dtype=np.int64)
    return take(rows, idx, keys), found


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


def errors_dict(row: Sequence[float]) -> dict[str, float]:
    """A row of `Scorings.errors` as the forecast reports it: the finite ones by name."""
    return {k: v for k, v in zip(CANDIDATES, row, strict=True) if math.isfinite(v)}
