"""The windows' faster bookkeeping (issue 18) gives the core exactly what the code before
it gave: the window, its read and its range check as they were at 3aaf376 are kept here
as the oracle, and both read the same randomized answers (gaps, late and off-grid
samples, NaN and Inf, values out of range, targets appearing and disappearing, failed
queries, ticks that skip, repeat or go back)."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from gpuscaler.adapters.prometheus.source import Metrics, PrometheusMetrics
from gpuscaler.adapters.prometheus.transport import SourceError
from gpuscaler.adapters.prometheus.window import (
    Window,
    decode_matrix,
    drop_outside,
    out_of_range,
)
from gpuscaler.config import Config, parse_config
from gpuscaler.core.model import FloatArray, Series

STEP = 0.5


# ------------------------------------------------------------- the oracle (3aaf376's code)


def _old_out_of_range(values: FloatArray, bounds: tuple[float, float]) -> str | None:
    lo, hi = bounds
    finite = values[np.isfinite(values)]
    bad = finite[(finite < lo) | (finite > hi)]
    if bad.size == 0:
        return None
    return f"{bad.size} value(s) outside {lo:g}..{hi:g}, e.g. {bad[0]:g}: invalid input"


@dataclass
class OldWindow:
    step: float
    size: int
    end: float | None = None
    values: FloatArray = field(default_factory=lambda: np.empty(0))
    fetched_until: float | None = None

    def advance(self, end: float) -> None:
        new = np.full(self.size, np.nan)
        if self.end is not None and self.values.size:
            shift = round((end - self.end) / self.step)
            keep = self.size - shift
            if 0 < keep <= self.size:
                new[:keep] = self.values[shift:]
            elif shift <= 0:
                new = self.values.copy()
        self.values, self.end = new, end

    def write(self, times: FloatArray, values: FloatArray) -> None:
        assert self.end is not None
        idx = np.round((times - self.end) / self.step).astype(np.int64) + self.size - 1
        ok = (idx >= 0) & (idx < self.size)
        self.values[idx[ok]] = values[ok]

    def series(self) -> Series:
        assert self.end is not None
        return Series(
            start=self.end - self.step * (self.size - 1), step=self.step, values=self.values
        )


class OldMetrics(PrometheusMetrics):
    """`PrometheusMetrics` with 3aaf376's `_fetch_once` and `_read_span`."""

    def _fetch_once(
        self, key: str, query: str, now: float, bounds: tuple[float, float]
    ) -> tuple[Series | None, str | None]:
        step = self.config.metrics.step
        size = round(self.config.metrics.window / step)
        window: Any = self.windows.setdefault(key, OldWindow(step=step, size=size))  # type: ignore[arg-type]
        end = math.floor(now / step) * step
        window.advance(end)
        first = end - step * (size - 1)
        if window.fetched_until is not None:
            start = max(first, window.fetched_until - self.config.prometheus.overlap)
        else:
            start = first
        try:
            had_bad, absurd, got_any = self._read_span(window, query, start, end, bounds)
        except SourceError as e:
            self._transport_errors.append(f"{key}: {e}")
            return window.series(), str(e)
        if got_any or window.series().last_sample_time() is not None:
            window.fetched_until = end
        if absurd is not None:
            return window.series(), absurd
        if had_bad:
            return window.series(), "NaN or Inf in the newest samples"
        if not got_any and window.series().last_sample_time() is None:
            return window.series(), "empty result: no series matches"
        return window.series(), None

    def _read_span(
        self, window: Any, query: str, start: float, end: float, bounds: tuple[float, float]
    ) -> tuple[bool, str | None, bool]:
        step = self.config.metrics.step
        had_bad = False
        absurd: str | None = None
        got_any = False
        chunk = math.floor(10_000 * step)
        last = math.floor(end)
        t = math.floor(start)
        while True:
            chunk_end = min(last, t + chunk)
            times, values, bad = decode_matrix(
                self.transport.query_range(query, t, chunk_end, step)
            )
            absurd = absurd or _old_out_of_range(values, bounds)
            values[(values < bounds[0]) | (values > bounds[1])] = np.nan
            window.write(times, values)
            had_bad |= bad
            got_any |= times.size > 0
            if chunk_end >= last:
                return had_bad, absurd, got_any
            t = chunk_end


# ------------------------------------------------------------------ randomized answers


class RandomAnswers:
    """The same answer for the same (query, start, end), whoever asks and in what order."""

    def __init__(self, seed: int):
        self.seed = seed

    def _rng(self, *parts: object) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(repr(parts).encode())])

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Any]:
        rng = self._rng(query, start, end)
        kind = rng.random()
        if kind < 0.08:
            raise SourceError("timed out after 5s")
        if kind < 0.2:
            return []  # the target is not there this time
        times = np.arange(start, end + 1e-9, step)
        times = times[rng.random(times.size) > rng.choice([0.0, 0.1, 0.6])]  # gaps
        if rng.random() < 0.3:  # late, off-grid and outside-the-window samples
            extra = [start - rng.uniform(0, 900), end + rng.uniform(0, 5), start + 0.2]
            times = np.concatenate([times, extra])
        if rng.random() < 0.1:
            rng.shuffle(times)
        values = rng.normal(50, 30 if rng.random() < 0.3 else 5, times.size)
        values[rng.random(times.size) < 0.02] = np.nan
        values[rng.random(times.size) < 0.01] = np.inf
        if rng.random() < 0.5:  # decoded by orjson (fast.py) or as the JSON strings
            return [{"metric": {}, "values": [], "arrays": (times, values)}]
        return [
            {
                "metric": {},
                "values": [[t, repr(float(v))] for t, v in zip(times, values, strict=True)],
            }
        ]

    def query(self, query: str, time: float | None = None) -> list[Any]:
        rng = self._rng(query, time)
        if rng.random() < 0.2:
            return []
        return [{"metric": {}, "value": [time, repr(float(rng.uniform(0, 90_000)))]}]


def _config() -> Config:
    return parse_config(
        'prometheus: {url: "http://fake:1"}\n'
        "metrics: {window: 10m, step: 500ms}\n"
        "node_pools:\n"
        "  - {name: a, selector: {label: pool, value: a}, gpu_memory_gib: 80, metrics_matchers: {modelName: A}}\n"
        "  - {name: b, selector: {label: pool, value: b}, gpu_memory_gib: 80, metrics_matchers: {modelName: B}}\n"
        "  - {name: c, selector: {label: pool, value: c}, gpu_memory_gib: 80}\n"
        "workloads:\n"
        "  - {namespace: n, kind: ScaledObject, name: w0}\n"
        "  - {namespace: n, kind: ScaledObject, name: w1, leading_query: 'sum(rate(x[1m]))'}\n"
        "  - {namespace: m, kind: ScaledObject, name: w2}\n"
    )


def _same_series(a: Series | None, b: Series | None) -> None:
    assert (a is None) == (b is None)
    if a is not None and b is not None:
        assert (a.start, a.step) == (b.start, b.step)
        np.testing.assert_array_equal(a.values, b.values)  # NaN equal to NaN


def _same_metrics(new: Metrics, old: Metrics) -> None:
    assert new.time == old.time
    for p, q in zip(new.pools, old.pools, strict=True):
        assert (p.name, p.problem, p.unmatched) == (q.name, q.problem, q.unmatched)
        assert (p.memory_used_gib, p.memory_total_gib) == (q.memory_used_gib, q.memory_total_gib)
        _same_series(p.utilization, q.utilization)
        _same_series(p.stall, q.stall)
    for w, v in zip(new.workloads, old.workloads, strict=True):
        assert (w.key, w.problem, w.demand_problem) == (v.key, v.problem, v.demand_problem)
        _same_series(w.load, v.load)
        _same_series(w.demand, v.demand)


def _ticks(rng: np.random.Generator, count: int) -> list[float]:
    now, out = 1_800_000_000.0, []
    for _ in range(count):
        now += float(rng.choice([30.0, 30.0, 30.0, 29.7, 0.0, -30.0, 700.0, 95.3]))
        out.append(now)
    return out


# ---------------------------------------------------------------------------- tests


@pytest.mark.parametrize("seed", range(12))
def test_random_answers_give_the_core_the_same_observations_as_the_code_before(
    seed: int,
) -> None:
    answers = RandomAnswers(seed)
    new = PrometheusMetrics(_config(), answers)  # type: ignore[arg-type]
    old = OldMetrics(_config(), answers)  # type: ignore[arg-type]
    for now in _ticks(np.random.default_rng(seed), 25):
        _same_metrics(new.read(now), old.read(now))
        assert new._transport_errors == old._transport_errors
        assert (new.health.ok, new.health.failures) == (old.health.ok, old.health.failures)
        assert new.windows.keys() == old.windows.keys()
        for key, window in new.windows.items():
            assert window.fetched_until == old.windows[key].fetched_until


@pytest.mark.parametrize("seed", range(20))
def test_a_window_advanced_and_written_at_random_holds_what_the_old_window_held(
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 40))
    new, old = Window(step=STEP, size=size), OldWindow(step=STEP, size=size)
    end = 1000.0
    for _ in range(60):
        end += STEP * float(rng.choice([0, 1, 3, -2, size - 1, size, size + 5, -size - 3]))
        new.advance(end)
        old.advance(end)
        times = end + STEP * rng.integers(-size - 3, 4, int(rng.integers(0, 12)))
        times = times + rng.choice([0.0, 0.1, -0.2], times.size)
        values = rng.normal(size=times.size)
        values[rng.random(times.size) < 0.3] = np.nan
        new.write(times, values.copy())
        old.write(times, values.copy())
        _same_series(new.series(), old.series())
        assert new.empty() == (old.series().last_sample_time() is None)


def test_a_series_handed_out_keeps_its_values_when_the_window_moves_on() -> None:
    window = Window(step=STEP, size=4)
    window.advance(10.0)
    window.write(np.array([9.0, 10.0]), np.array([1.0, 2.0]))
    before = window.series()
    window.advance(10.5)
    window.write(np.array([10.5]), np.array([3.0]))
    np.testing.assert_array_equal(before.values, [np.nan, 1.0, np.nan, 2.0])  # 8.5 to 10 s
    np.testing.assert_array_equal(window.series().values, [1.0, np.nan, 2.0, 3.0])


@pytest.mark.parametrize("seed", range(20))
def test_dropping_values_out_of_range_names_the_problem_the_old_check_named(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.normal(50, 60, int(rng.integers(0, 30)))
    values[rng.random(values.size) < 0.2] = np.nan
    expected = values.copy()
    problem = _old_out_of_range(expected, (0.0, 100.0))
    expected[(expected < 0.0) | (expected > 100.0)] = np.nan
    assert drop_outside(values, (0.0, 100.0)) == problem
    assert out_of_range(expected, (0.0, 100.0)) is None
    np.testing.assert_array_equal(values, expected)
