"""The backtest's input: series from CSV, on the forecast's grid."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from gpuscaler.core.model import Series
from gpuscaler.errors import InputError
from gpuscaler.sim.trace import (
    TraceError,
    bounded_span,
    on_regular_grid,
    parse_times,
    read_csv,
    regular_step,
)


class BacktestError(InputError):
    """Input the backtest cannot use; the message says what and where."""


@contextmanager
def _as_backtest_error(suffix: str = "") -> Iterator[None]:
    """A trace helper's TraceError raised as a BacktestError (with `suffix`)."""
    try:
        yield
    except TraceError as e:
        raise BacktestError(f"{e}{suffix}") from e


def load_series_csv(path: str | Path) -> dict[str, pd.Series]:
    """Named time series (float values indexed by unix seconds) from a CSV: a time column,
    then either a value column and an optional non-numeric series column, or several
    numeric columns, one series each."""
    p = Path(path)
    with _as_backtest_error():
        frame = read_csv(p, str(p))
        if frame.shape[1] < 2:
            raise BacktestError(f"{p}: needs a timestamp column and a value column")
        times = parse_times(frame, str(p))
    rest = frame.iloc[:, 1:]
    numeric = {c: pd.to_numeric(rest[c], errors="coerce") for c in rest.columns}
    is_numeric = {c: bool(v.notna().any()) for c, v in numeric.items()}
    out: dict[str, pd.Series] = {}
    if len(rest.columns) >= 2 and not is_numeric[rest.columns[1]]:
        value_col, series_col = rest.columns[0], rest.columns[1]
        if not is_numeric[value_col]:
            raise BacktestError(f"{p}: column {value_col!r} has no numeric values")
        for name, idx in frame.groupby(frame[series_col].astype(str)).groups.items():
            values = numeric[value_col].loc[idx].to_numpy(dtype=np.float64)
            out[str(name)] = pd.Series(values, index=times[np.asarray(idx)])
    else:
        for column in rest.columns:
            if is_numeric[column]:
                out[str(column)] = pd.Series(
                    numeric[column].to_numpy(dtype=np.float64), index=times
                )
        if not out:
            raise BacktestError(f"{p}: no numeric value column")
    for name, s in out.items():
        if not np.all(np.diff(s.index.to_numpy()) >= 0):
            raise BacktestError(f"{p}: series {name!r}: timestamps go backwards")
    return out


def to_grid(name: str, s: pd.Series, resample: float | None, agg: str, where: str) -> Series:
    """A regular grid: resampled into `resample`-second bins, or checked to be regular."""
    t = s.index.to_numpy(dtype=np.float64)
    v = s.to_numpy(dtype=np.float64)
    if resample is not None:
        with _as_backtest_error():
            bounded_span(t, resample, where)
        bins = np.floor((t - t[0]) / resample).astype(np.int64)
        frame = pd.DataFrame({"bin": bins, "v": v})
        grouped = frame.groupby("bin")["v"]
        counts = grouped.count() if agg != "count" else grouped.size()
        values = grouped.agg(agg) if agg != "count" else grouped.size().astype(float)
        grid = np.full(int(bins[-1]) + 1, np.nan)
        grid[values.index.to_numpy()] = values.to_numpy(dtype=np.float64)
        if agg != "count":
            grid[counts.index.to_numpy()[counts.to_numpy() == 0]] = np.nan
        return Series(start=float(t[0]), step=resample, values=grid)
    if len(t) < 2:
        raise BacktestError(f"{where}: series {name!r} has fewer than 2 points")
    with _as_backtest_error("; pass --resample to put it on a grid"):
        step = regular_step(t, f"{where}: series {name!r}")
    with _as_backtest_error():
        return Series(start=float(t[0]), step=step, values=on_regular_grid(t, v, step, where))


def demand_for(name: str, demands: dict[str, pd.Series], where: str) -> pd.Series:
    """The demand series named like the load series, or the file's only one."""
    if name in demands:
        return demands[name]
    if len(demands) == 1:
        return next(iter(demands.values()))
    names = ", ".join(sorted(demands))
    raise BacktestError(f"{where}: no demand series named {name!r} (it has {names})")


def on_grid(s: Series, grid: Series) -> Series:
    """`s` on `grid`'s time slots (NaN where `s` has no slot); both share one step."""
    if abs(s.step - grid.step) > 1e-9 * grid.step:
        raise BacktestError(f"demand step {s.step:g}s differs from the series' {grid.step:g}s")
    slots = np.round((grid.start - s.start) / s.step).astype(np.int64) + np.arange(len(grid.values))
    inside = (slots >= 0) & (slots < len(s.values))
    values = np.full(len(grid.values), np.nan)
    values[inside] = s.values[slots[inside]]
    return Series(grid.start, grid.step, values)
