"""Load traces: a CSV with a time column then a numeric column of requests per bin.

Times are unix seconds or ISO-8601; spacing must be regular. Errors are `TraceError`s
that say what is wrong and where; never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from gpuscaler.core.model import FloatArray
from gpuscaler.errors import InputError

BUNDLED_TRACE = "azure_llm_2024_conversation_10s.csv.gz"
MAX_SLOTS = 10_000_000
"""Bins a trace may span, gaps included (80 MB of float64): 3 years of 10 s bins. A
larger span is a bad timestamp or a gap, refused before anything is allocated."""


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

    @property
    def rate(self) -> FloatArray:
        """Requests per second of each bin."""
        return self.counts / self.bin_seconds

    @property
    def duration(self) -> float:
        return self.bin_seconds * len(self.counts)


def bundled_trace_path() -> Path:
    return Path(str(resources.files("gpuscaler") / "data" / BUNDLED_TRACE))


def parse_times(column: pd.Series, where: str) -> FloatArray:
    """Unix seconds from a column of unix seconds or ISO-8601 strings."""
    numeric = pd.to_numeric(column, errors="coerce")
    if numeric.notna().sum() == column.notna().sum():  # numbers, and maybe empty cells
        return numeric.to_numpy(dtype=np.float64)
    try:
        parsed = pd.to_datetime(column.astype(str), utc=True, format="ISO8601")
        seconds = (parsed - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
    except (ValueError, TypeError, OverflowError) as e:  # OutOfBoundsDatetime is a ValueError
        raise TraceError(f"{where}: time column is neither unix seconds nor ISO-8601 ({e})") from e
    return np.asarray(seconds.to_numpy(dtype=np.float64), dtype=np.float64)


def finite_times(times: FloatArray, frame: pd.DataFrame, where: str) -> FloatArray:
    """`times`, or TraceError naming the first row (1 = the header) without a finite time."""
    bad = np.flatnonzero(~np.isfinite(times))
    if bad.size:
        raw = frame.iloc[int(bad[0]), 0]
        raise TraceError(f"{where}: row {int(bad[0]) + 2}: time {raw!r} is not a finite time")
    return times


def bounded_span(times: FloatArray, step: float, where: str) -> None:
    """Refuse, before anything is allocated, a grid of more than MAX_SLOTS bins of `step`."""
    span = (times[-1] - times[0]) / step + 1
    if span > MAX_SLOTS:
        gap = int(np.argmax(np.diff(times))) if times.size > 1 else 0
        raise TraceError(
            f"{where}: spans {span:.3g} bins of {step:g}s, at most {MAX_SLOTS:,}; the largest "
            f"gap is between rows {gap + 2} and {gap + 3} ({times[gap + 1] - times[gap]:.3g}s)"
        )


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
    if frame.empty:
        raise TraceError(f"{where}: no data rows")
    return frame


def load_trace(path: str | Path | None = None) -> Trace:
    p = bundled_trace_path() if path is None else Path(path)
    where = str(p) if path is not None else f"bundled trace {BUNDLED_TRACE}"
    frame = read_csv(p, where)
    if frame.shape[1] < 2:
        raise TraceError(f"{where}: needs a time column and a numeric column, found 1 column")
    numeric_name = None
    for name in frame.columns[1:]:
        values = pd.to_numeric(frame[name], errors="coerce")
        if values.notna().sum() > 0:
            numeric_name = name
            break
    if numeric_name is None:
        raise TraceError(f"{where}: no numeric column after the time column")
    times = finite_times(parse_times(frame[frame.columns[0]], where), frame, where)
    counts = pd.to_numeric(frame[numeric_name], errors="coerce").to_numpy(dtype=np.float64)
    if np.any(counts[np.isfinite(counts)] < 0):
        raise TraceError(f"{where}: column {numeric_name!r} has negative request counts")
    step = regular_step(times, where) if len(times) > 1 else 0.0
    if step == 0.0:
        raise TraceError(f"{where}: a single row is not a trace")
    bounded_span(times, step, where)
    # Put missing rows back as NaN so the grid is regular.
    slots = np.round((times - times[0]) / step).astype(np.int64)
    grid = np.full(int(slots[-1]) + 1, np.nan)
    grid[slots] = counts
    return Trace(name=p.name, start=float(times[0]), bin_seconds=step, counts=grid)
