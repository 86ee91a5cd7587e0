"""Load traces: a CSV with a time column then a numeric column of requests per bin.

Times are unix seconds or ISO-8601; spacing must be regular. Errors are `TraceError`s
that say what is wrong and where; never a traceback.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from gpuscaler.core.model import FloatArray
from gpuscaler.errors import InputError

BUNDLED_TRACE = "azure_llm_2024_conversation_10s.csv.gz"


class TraceError(InputError):
    """A trace that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True, eq=False)
class Trace:
    name: str
    start: float
    """Unix seconds of the first bin's start."""
    bin_seconds: float
    counts: FloatArray
    """Requests per bin (NaN where missing)."""
    source: str = ""
    """Where the counts came from (the column, or how rows were binned)."""

    @property
    def rate(self) -> FloatArray:
        """Requests per second of each bin."""
        return self.counts / self.bin_seconds

    @property
    def duration(self) -> float:
        return self.bin_seconds * len(self.counts)


def bundled_trace_path() -> Path:
    return Path(str(resources.files("gpuscaler") / "data" / BUNDLED_TRACE))


def parse_times(frame: pd.DataFrame, where: str) -> FloatArray:
    """Unix seconds from the first column (unix seconds or ISO-8601 strings), or TraceError
    naming the first row (1 = the header) without a finite time."""
    column = frame.iloc[:, 0]
    numeric = pd.to_numeric(column, errors="coerce")
    if numeric.notna().sum() == column.notna().sum():  # numbers, and maybe empty cells
        times = numeric.to_numpy(dtype=np.float64)
    else:
        try:
            parsed = pd.to_datetime(column.astype(str), utc=True, format="ISO8601")
            seconds = (parsed - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
        except (ValueError, TypeError, OverflowError) as e:  # OutOfBoundsDatetime: ValueError
            why = f"time column is neither unix seconds nor ISO-8601 ({e})"
            raise TraceError(f"{where}: {why}") from e
        times = np.asarray(seconds.to_numpy(dtype=np.float64), dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(times))
    if bad.size:
        raw = frame.iloc[int(bad[0]), 0]
        raise TraceError(f"{where}: row {int(bad[0]) + 2}: time {raw!r} is not a finite time")
    return times


def regular_step(times: FloatArray, where: str) -> float:
    """The grid spacing of `times`; raises unless strictly increasing and regular (missing
    rows allowed: every gap must be a whole number of steps)."""
    diffs = np.diff(times)
    if np.any(diffs <= 0):
        i = int(np.flatnonzero(diffs <= 0)[0])
        raise TraceError(
            f"{where}: time goes backwards or repeats at row {i + 2} "
            f"({times[i]:.3f} then {times[i + 1]:.3f})"
        )
    step = float(np.min(diffs))
    ratio = diffs / step
    if np.any(np.abs(ratio - np.round(ratio)) > 0.01):
        raise TraceError(f"{where}: irregular spacing (not a multiple of the {step:g}s step)")
    return step


def read_csv(path: Path, where: str) -> pd.DataFrame:
    if not path.exists():
        raise TraceError(f"{where}: file not found")
    if path.is_dir():
        raise TraceError(f"{where}: is a directory, expected a CSV file")
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError as e:
        raise TraceError(f"{where}: empty file") from e
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as e:
        raise TraceError(f"{where}: not a readable CSV ({e})") from e
    except (EOFError, zlib.error) as e:  # a compressed file cut short or corrupt
        raise TraceError(f"{where}: a truncated or corrupt compressed file ({e})") from e
    if frame.empty:
        raise TraceError(f"{where}: no data rows")
    return frame


MAX_BINS = 50_000_000
"""Longest regular grid a trace may need (400 MB of float64): a gap beyond is refused."""
MAX_RATE = 1e9
"""Requests per second no service sees: a bin above is a broken trace, refused before the
simulator draws arrivals from it."""


def _plausible(trace: Trace, where: str) -> Trace:
    rate = trace.rate
    high = np.flatnonzero(rate > MAX_RATE)  # NaN compares False
    if high.size:
        raise TraceError(
            f"{where}: {high.size} bin(s) above {MAX_RATE:g} requests per second, e.g. "
            f"{rate[high[0]]:g} at {trace.start + high[0] * trace.bin_seconds:g}s: not a load trace"
        )
    return trace


def _value_column(frame: pd.DataFrame, column: str | None, where: str) -> str:
    if column is not None:
        if column not in frame.columns[1:]:
            raise TraceError(
                f"{where}: no column {column!r}; columns after the time column: "
                f"{', '.join(map(str, frame.columns[1:]))}"
            )
        if pd.to_numeric(frame[column], errors="coerce").notna().sum() == 0:
            raise TraceError(f"{where}: column {column!r} has no numeric values")
        return column
    for name in frame.columns[1:]:
        if pd.to_numeric(frame[name], errors="coerce").notna().sum() > 0:
            return str(name)
    raise TraceError(f"{where}: no numeric column after the time column")


def bounded_span(times: FloatArray, step: float, where: str) -> int:
    """Bins of `step` from the first time to the last, refused beyond MAX_BINS."""
    span = float(times[-1] - times[0])
    bins = int(span / step) + 1
    if bins > MAX_BINS:
        raise TraceError(
            f"{where}: the trace spans {span / 3600:.1f} h, {bins:,} bins of {step:g}s "
            f"(more than {MAX_BINS:,}): cut the gap out of the file or pass a coarser "
            "--resample"
        )
    return bins


def _binned(times: FloatArray, values: FloatArray | None, width: float, where: str) -> FloatArray:
    """Per-bin sums of `values` (row counts when None); an empty bin holds 0 requests."""
    if np.any(np.diff(times) < 0):
        i = int(np.flatnonzero(np.diff(times) < 0)[0])
        raise TraceError(f"{where}: time goes backwards at row {i + 2}")
    bins = np.floor((times - times[0]) / width).astype(np.int64)
    size = bounded_span(times, width, where)
    weights = None if values is None else np.nan_to_num(values, nan=0.0)
    return np.bincount(bins, weights=weights, minlength=size).astype(np.float64)


def load_trace(
    path: str | Path | None = None, resample: float | None = None, column: str | None = None
) -> Trace:
    """A trace from a CSV: a time column then requests per bin (the first numeric
    column, or `column`). With `resample` (seconds), rows are binned: each row counts as
    one request (a per-request log), or `column`'s values are summed per bin."""
    p = bundled_trace_path() if path is None else Path(path)
    where = str(p) if path is not None else f"bundled trace {BUNDLED_TRACE}"
    frame = read_csv(p, where)
    if frame.shape[1] < 2 and resample is None:
        raise TraceError(f"{where}: needs a time column and a numeric column, found 1 column")
    times = parse_times(frame, where)
    name = None if resample is not None and column is None else _value_column(frame, column, where)
    values = None if name is None else pd.to_numeric(frame[name], errors="coerce").to_numpy(float)
    if values is not None and np.any(values[np.isfinite(values)] < 0):
        raise TraceError(f"{where}: column {name!r} has negative request counts")
    if resample is not None:
        grid = _binned(times, values, resample, where)
        if len(grid) < 2:
            raise TraceError(f"{where}: all rows fall in one {resample:g}s bin: not a trace")
        what = "rows counted as requests" if name is None else f"column {name!r} summed"
        trace = Trace(p.name, float(times[0]), resample, grid, f"{what} per {resample:g}s bin")
        return _plausible(trace, where)
    assert values is not None
    if np.any(np.isinf(values)):
        raise TraceError(f"{where}: column {name!r} has infinite values")
    step = regular_step(times, where) if len(times) > 1 else 0.0
    if step == 0.0:
        raise TraceError(f"{where}: a single row is not a trace")
    grid = on_regular_grid(times, values, step, where)
    return _plausible(Trace(p.name, float(times[0]), step, grid, f"column {name!r}"), where)


def on_regular_grid(times: FloatArray, values: FloatArray, step: float, where: str) -> FloatArray:
    """`values` on the `step` grid from the first time: missing rows put back as NaN."""
    bounded_span(times, step, where)
    slots = np.round((times - times[0]) / step).astype(np.int64)
    grid = np.full(int(slots[-1]) + 1, np.nan)
    grid[slots] = values
    return grid
