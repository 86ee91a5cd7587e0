"""A tick's queries: planned again only when the config, a series found coarse or the
pools recorded change (a query built from the same labels is built once), and run on one
thread pool kept for the process, never more in flight than
`prometheus.max_concurrent_queries`, none once closed."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import numpy as np
import pytest

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.adapters.prometheus.promql import build_query, matcher_sets
from gpuscaler.adapters.prometheus.source import PrometheusMetrics
from gpuscaler.adapters.prometheus.transport import Transport
from gpuscaler.config import Config, parse_config
from gpuscaler.sources import PrometheusSource

QUERIES = "sum(last_over_time(x{{{matchers}}}[{lookback}]))"


def _config(workloads: int = 3) -> Config:
    names = "\n".join(
        f"  - {{namespace: n, kind: ScaledObject, name: w{i}}}" for i in range(workloads)
    )
    return parse_config(
        'prometheus: {url: "http://fake:1"}\n'
        "metrics: {window: 10m, step: 500ms}\n"
        "node_pools:\n"
        "  - {name: a, selector: {label: pool, value: a}, gpu_memory_gib: 80, metrics_matchers: {modelName: A}}\n"
        "  - {name: b, selector: {label: pool, value: b}, gpu_memory_gib: 80, metrics_matchers: {modelName: B}}\n"
        "  - {name: h, selector: {label: pool, value: h}, gpu_memory_gib: 80, metrics_matchers: {Hostname: n1}}\n"
        f"workloads:\n{names}\n"
    )


def _plain(metrics: PrometheusMetrics) -> tuple[object, object]:
    """What the plan holds, comparable: each group's query and targets, and the singles."""
    plan = metrics._plan_now()
    return [(g.query, dict(g.targets), g.instant) for g in plan.groups], list(plan.single)


def test_a_series_found_coarse_is_planned_again_with_its_own_lookback() -> None:
    metrics = PrometheusMetrics(_config())
    metrics.spacing.measured["workload:n/ScaledObject/w1"] = 15.0
    after = metrics._plan_now()
    single = {key: query for key, query, _ in after.single}
    assert "[16000ms]" in single["workload:n/ScaledObject/w1"]  # 15 s + two steps
    workload = next(g for g in after.groups if g.by == ("namespace", "workload"))
    assert ("n", "w1") not in workload.targets
    assert _plain(metrics) != _plain(PrometheusMetrics(_config()))


def test_pools_recorded_by_prometheus_are_planned_again_from_the_recorded_series() -> None:
    metrics = PrometheusMetrics(_config())
    metrics.rules.recorded["util"] = frozenset({"A"})
    after = metrics._plan_now()
    recorded = [g for g in after.groups if g.recorded]
    assert len(recorded) == 1 and list(recorded[0].targets) == [("A",)]


def test_a_new_config_is_planned_again() -> None:
    metrics = PrometheusMetrics(_config(3))
    metrics.reconfigure(_config(5))
    after = metrics._plan_now()
    workload = next(g for g in after.groups if g.by == ("namespace", "workload"))
    assert len(workload.targets) == 5


@pytest.mark.parametrize(
    "labels",
    [
        {"modelName": "A"},
        {"modelName": "A", "zone": "z1"},
        {"zone": "z1", "modelName": "A"},
        {"Hostname": "n1"},
        {"hostname": "n1", "modelName": 'we"ird\\'},
    ],
)
def test_a_query_is_the_template_over_each_matcher_set(labels: dict[str, str]) -> None:
    want = [QUERIES.format(matchers=m, lookback="1s") for m in matcher_sets(labels)]
    expected = want[0] if len(want) == 1 else " or ".join(f"({p})" for p in want)
    assert build_query(QUERIES, labels, "1s") == expected


def test_an_invalid_label_name_is_refused_every_time_it_is_asked() -> None:
    for _ in range(2):
        with pytest.raises(ValueError, match="invalid Prometheus label name"):
            build_query(QUERIES, {"bad-name": "x"}, "1s")


T0 = 1_800_000_000.0


def _pool_config(concurrent: int) -> Config:
    pools = "\n".join(
        f"  - {{name: p{i}, selector: {{label: pool, value: p{i}}}, gpu_memory_gib: 80, "
        f"metrics_matchers: {{Hostname: n{i}}}}}"  # not grouped: a query per pool and signal
        for i in range(6)
    )
    return parse_config(
        f'prometheus: {{url: "http://fake:1", max_concurrent_queries: {concurrent}}}\n'
        "metrics: {window: 10m, step: 500ms}\n"
        f"node_pools:\n{pools}\nworkloads: []\n"
    )


class Slow(Transport):
    """Every series at 50 %, every frame buffer at 1 GiB; each answer takes 5 ms; records
    the threads that asked and the most queries in flight at once."""

    def __init__(self, config: Config):
        super().__init__(config.prometheus)
        self.lock = threading.Lock()
        self.inflight = self.most = 0
        self.threads: set[str] = set()

    def _enter(self) -> None:
        with self.lock:
            self.inflight += 1
            self.most = max(self.most, self.inflight)
            self.threads.add(threading.current_thread().name)
        time.sleep(0.005)
        with self.lock:
            self.inflight -= 1

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Any]:
        self._enter()
        times = np.arange(math.floor(start), math.floor(end) + 1e-9, step).tolist()
        return [{"metric": {}, "values": [[t, "50"] for t in times]}]

    def query(self, query: str, time: float | None = None) -> list[Any]:
        self._enter()
        return [{"metric": {}, "value": [time, "1024"]}]


@pytest.mark.parametrize("concurrent", [1, 3])
def test_queries_run_on_one_bounded_pool_kept_from_tick_to_tick(concurrent: int) -> None:
    config = _pool_config(concurrent)
    transport = Slow(config)
    source = PrometheusSource(config, CurrentState(), transport)
    for k in range(3):
        obs = source.observe(T0 + 30 * k)
        assert all(p.problem is None for p in obs.pools), [p.problem for p in obs.pools]
        source.after_tick()
    assert source.queries_last_tick >= 6 * 3  # util, stall and used of each pool
    assert transport.most <= concurrent
    assert len(transport.threads) <= concurrent  # the pool's threads, the backfill's too
    assert all(name.startswith("prometheus") for name in transport.threads), transport.threads
    source.close()
    obs = source.observe(T0 + 120)  # a read after close is refused, not a hang or a crash
    assert all(p.problem is not None for p in obs.pools)
