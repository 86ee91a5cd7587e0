"""A live exporter in the test process, scraped by a real Prometheus every 500 ms, with the
shipped stall recording rule loaded."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from promserver import free_port, prometheus, shipped_rules

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.config import parse_config
from gpuscaler.core.model import Series
from gpuscaler.sources import PrometheusSource


class Exporter:
    """dcgm-exporter's series for one GPU, values set by the test."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["gpu", "UUID", "Hostname", "modelName"]
        self.util = Gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization", labels, registry=self.registry)
        self.engine = Gauge(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "engine active", labels, registry=self.registry
        )
        self.sm = Gauge("DCGM_FI_PROF_SM_ACTIVE", "SM active", labels, registry=self.registry)
        self.port = free_port()
        self.server, self.thread = start_http_server(
            self.port, addr="127.0.0.1", registry=self.registry
        )

    def set(self, util: float, engine: float, sm: float) -> None:
        labels = ("0", "GPU-live", "node-live", "NVIDIA A100")
        self.util.labels(*labels).set(util)
        self.engine.labels(*labels).set(engine)
        self.sm.labels(*labels).set(sm)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Exporter, str]]:
    rules = shipped_rules(tmp_path_factory.mktemp("rules"))
    exporter = Exporter()
    exporter.set(util=73.0, engine=0.8, sm=0.5)
    try:
        with prometheus(scrape_target=f"127.0.0.1:{exporter.port}", rule_file=rules) as url:
            yield exporter, url
    finally:
        exporter.close()


def _source(url: str) -> PrometheusSource:
    config = parse_config(
        f"""
prometheus: {{url: "{url}", timeout: 5s}}
metrics: {{window: 1m, staleness: 10s}}
forecast: {{min_history: 20s, fit_step: 2s, horizon: 10s}}
node_pools:
  - {{name: live, selector: {{label: pool, value: live}}, gpu_memory_gib: 80,
     metrics_matchers: {{Hostname: node-live}}}}
"""
    )
    return PrometheusSource(config, CurrentState())


def _finite(series: Series | None) -> np.ndarray:
    assert series is not None
    return series.values[np.isfinite(series.values)]


def _wait_for(source: PrometheusSource, count: int, timeout: float = 30) -> tuple[Series, Series]:
    deadline = time.monotonic() + timeout
    while True:
        pool = source.observe(time.time()).pools[0]
        util, stall = pool.utilization, pool.stall
        if (
            util is not None
            and stall is not None
            and min(_finite(util).size, _finite(stall).size) >= count
        ):
            return util, stall
        if time.monotonic() > deadline:
            pytest.fail(f"fewer than {count} samples within {timeout:g}s: {pool.problem}")
        time.sleep(0.5)


def test_a_live_exporter_is_read_at_500_ms_with_the_stall_rule_applied(
    live: tuple[Exporter, str],
) -> None:
    _, url = live
    source = _source(url)
    util, stall = _wait_for(source, count=6)
    assert util.step == 2.0  # the window holds forecast.fit_step buckets of the reads
    recent = _finite(util)
    assert recent[-1] == pytest.approx(73.0)
    # Six or more buckets in a row, read at 500 ms without the holes of a coarser scrape.
    idx = np.flatnonzero(np.isfinite(util.values))
    assert np.median(np.diff(idx)) == 1
    assert not source.spacing.measured
    assert _finite(stall)[-1] == pytest.approx(100 * (0.8 - 0.5) / 0.8)  # 37.5 %


def test_new_samples_reach_the_window_on_the_next_cycle(live: tuple[Exporter, str]) -> None:
    exporter, url = live
    source = _source(url)
    _wait_for(source, count=4)
    exporter.set(util=20.0, engine=0.8, sm=0.8)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pool = source.observe(time.time()).pools[0]
        util, stall = _finite(pool.utilization), _finite(pool.stall)
        # The rule's output follows its inputs by up to one evaluation: wait for both.
        if util[-1] == pytest.approx(20.0) and math.isclose(stall[-1], 0.0, abs_tol=1e-9):
            assert pool.problem is None
            return
        time.sleep(0.5)
    pytest.fail("the new value never arrived")


def test_the_shipped_rules_pass_promtool(tmp_path: Path) -> None:
    import subprocess

    from promserver import binaries

    _, promtool = binaries()
    rules = shipped_rules(tmp_path)
    out = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # stall: record + alert; workloads: record; pools: 2 records; scheduling: 4 alerts
    assert "9 rules found" in out.stdout
