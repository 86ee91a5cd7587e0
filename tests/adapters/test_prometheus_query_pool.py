"""The reader's queries run on one thread pool kept for the process, never more in flight
than `prometheus.max_concurrent_queries`, none once closed."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import numpy as np
import pytest

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.adapters.prometheus.transport import Transport
from gpuscaler.config import Config, parse_config
from gpuscaler.sources import PrometheusSource

T0 = 1_800_000_000.0


def _config(concurrent: int) -> Config:
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
    config = _config(concurrent)
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
