"""Steady reads done at once (`adapters/prometheus/bulk.py`, issue 18) give the core what
the per-target reads gave: a grouped reader with them and one without read the same
randomized grouped answers (targets missing, gaps, late, off-grid and outside-the-window
samples, unsorted, NaN, Inf, out of range, failed queries, answers not decoded by orjson,
ticks that repeat, skip or go back, the background backfill) and must agree on every
observation, problem, window and `fetched_until`."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest
from test_prometheus_window_equivalence import RandomAnswers, _same_metrics, _ticks

import gpuscaler.adapters.prometheus.grouped as grouped_module
import gpuscaler.adapters.prometheus.memo as memo_module
from gpuscaler.adapters.prometheus.bulk import steady_reads
from gpuscaler.adapters.prometheus.grouped import GroupedPrometheusMetrics
from gpuscaler.adapters.prometheus.memo import INSTANT, Chunk
from gpuscaler.adapters.prometheus.transport import SourceError
from gpuscaler.config import Config, parse_config

WORKLOADS = [("n", f"w{i}") for i in range(4)]


def _config() -> Config:
    names = "\n".join(
        f"  - {{namespace: {ns}, kind: ScaledObject, name: {n}}}" for ns, n in WORKLOADS
    )
    return parse_config(
        'prometheus: {url: "http://fake:1", pool_recording_rules: false}\n'
        "metrics: {window: 10m, step: 500ms}\n"
        "forecast: {min_history: 90s}\n"
        "node_pools:\n"
        "  - {name: a, selector: {label: pool, value: a}, gpu_memory_gib: 80, metrics_matchers: {modelName: A}}\n"
        "  - {name: b, selector: {label: pool, value: b}, gpu_memory_gib: 80, metrics_matchers: {modelName: B}}\n"
        "  - {name: h, selector: {label: pool, value: h}, gpu_memory_gib: 80, metrics_matchers: {Hostname: n1}}\n"
        f"workloads:\n{names}\n"
        "  - {namespace: n, kind: ScaledObject, name: lead, leading_query: 'sum(rate(x[1m]))'}\n"
    )


class GroupedAnswers:
    """The same answer for the same (query, chunk), whoever asks and in what order."""

    def __init__(self, seed: int):
        self.seed = seed
        self.points = RandomAnswers(seed)

    def _rng(self, *parts: object) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(repr(parts).encode())])

    def _labels(self, query: str) -> list[dict[str, str]]:
        if "by (namespace, workload)" in query:
            return [{"namespace": ns, "workload": n} for ns, n in WORKLOADS]
        if "by (modelName)" in query:
            return [{"modelName": v} for v in ("A", "B")]
        return [{}]

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Any]:
        """Each target's points as the per-target oracle test draws them (gaps, late,
        off-grid and outside-the-window samples, NaN, Inf, out of range, decoded or not);
        a target it fails or finds empty for is not in the grouped answer."""
        labels = self._labels(query)
        if labels == [{}]:
            return self.points.query_range(query, start, end, step)
        if self._rng(query, start, end).random() < 0.05:
            raise SourceError("timed out after 5s")
        out: list[Any] = []
        for metric in labels:
            if self._rng(query, start, end, metric).random() < 0.05:  # a series, no point
                out.append({"metric": metric, "values": [], "arrays": (np.empty(0), np.empty(0))})
                continue
            try:
                got = self.points.query_range(f"{query} {metric}", start, end, step)
            except SourceError:
                continue
            out += [{**item, "metric": metric} for item in got]
        return out

    def query(self, query: str, time: float | None = None) -> list[Any]:
        rng = self._rng(query, time)
        return [
            {"metric": m, "value": [time, repr(float(rng.uniform(0, 90_000)))]}
            for m in self._labels(query)
            if rng.random() > 0.1
        ]

    def answer(self, query: str, chunk: Chunk) -> list[Any] | SourceError:
        try:
            if chunk[1] == INSTANT:
                return self.query(query, chunk[0])
            return self.query_range(query, chunk[0], chunk[1], 0.5)
        except SourceError as e:
            return e


def _reader(answers: GroupedAnswers) -> GroupedPrometheusMetrics:
    metrics = GroupedPrometheusMetrics(_config(), answers)

    def query(query: str, chunk: Chunk, counted: bool = True) -> list[Any] | SourceError:
        return answers.answer(query, chunk)

    metrics._query = query  # type: ignore[method-assign]
    return metrics


@pytest.mark.parametrize("seed", range(10))
def test_steady_reads_at_once_give_the_core_what_reads_one_by_one_gave(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = GroupedAnswers(seed)
    monkeypatch.setattr(
        memo_module, "fast_query_range", lambda t, q, s, e, step: t.query_range(q, s, e, step)
    )
    done: list[int] = []

    def counted(*args: Any) -> Any:
        out = steady_reads(*args)
        done.append(len(out))
        return out

    bulk, single = _reader(answers), _reader(answers)
    for now in _ticks(np.random.default_rng(seed), 25):
        monkeypatch.setattr(grouped_module, "steady_reads", counted)
        got = bulk.read(now)
        monkeypatch.setattr(grouped_module, "steady_reads", lambda *args: {})
        want = single.read(now)
        _same_metrics(got, want)
        assert bulk._transport_errors == single._transport_errors
        assert bulk.windows.keys() == single.windows.keys()
        for key, window in bulk.windows.items():
            other = single.windows[key]
            assert (window.end, window.fetched_until) == (other.end, other.fetched_until)
            np.testing.assert_array_equal(window.values, other.values)
        for m in (bulk, single):
            m.after_tick()
            assert m.backfill.wait(timeout=10)
    assert sum(done) > 25  # most steady reads were done at once


def test_a_series_handed_out_keeps_its_values_after_a_steady_read_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = GroupedAnswers(100)
    monkeypatch.setattr(
        memo_module, "fast_query_range", lambda t, q, s, e, step: t.query_range(q, s, e, step)
    )
    metrics = _reader(answers)
    now = 1_800_000_000.0
    metrics.read(now)
    metrics.after_tick()
    assert metrics.backfill.wait(timeout=10)
    first = metrics.read(now + 30)  # the backfill written in: a steady read from now on
    kept = [None if w.load is None else w.load.values.copy() for w in first.workloads]
    for k in range(2, 5):
        metrics.read(now + 30 * k)
    for w, values in zip(first.workloads, kept, strict=True):
        if values is not None:
            assert w.load is not None
            np.testing.assert_array_equal(w.load.values, values)
    assert any(values is not None for values in kept)
