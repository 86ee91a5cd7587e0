"""Warm start against a real Prometheus: a restarted source asks only for the gap and
ends with the windows of a source that never stopped."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from promserver import planted_window, prometheus, write_openmetrics

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.adapters.prometheus.transport import Transport
from gpuscaler.adapters.prometheus.warm import WarmStart, load_windows, save_windows
from gpuscaler.config import Config, parse_config
from gpuscaler.sources import PrometheusSource

POINTS = 600  # 5 minutes at 500 ms


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    start, end = planted_window(POINTS, lag=3)
    labels = {"Hostname": "node-a", "UUID": "GPU-1", "pod": "chat-0", "namespace": "ml"}
    data = tmp_path_factory.mktemp("warm") / "data.om"
    write_openmetrics(
        data,
        {
            "DCGM_FI_DEV_GPU_UTIL": [(labels, lambda i: 50 + 20 * math.sin(i / 30))],
            "nvidia_gpu_stall_percentage": [(labels, lambda i: 5.0)],
        },
        start,
        POINTS,
    )
    with prometheus(data) as url:
        yield url, end


def _config(url: str, window: str = "10m") -> Config:
    return parse_config(
        f"""
prometheus: {{url: "{url}", retries: 0}}
metrics: {{step: 0.5s, window: {window}}}
node_pools:
  - {{name: a, selector: {{label: pool, value: a}}, gpu_memory_gib: 80, metrics_matchers: {{Hostname: node-a}}}}
workloads:
  - {{namespace: ml, kind: ScaledObject, name: chat}}
"""
    )


class Recording(Transport):
    """The real transport, noting the span of each range query."""

    spans: list[float]

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Any]:
        self.spans.append(end - start)
        return super().query_range(query, start, end, step)


def _source(config: Config) -> tuple[PrometheusSource, Recording]:
    transport = Recording(config.prometheus)
    transport.spans = []
    return PrometheusSource(config, CurrentState(), transport), transport


def test_a_restart_fetches_only_the_gap_and_ends_with_the_same_windows(
    planted: tuple[str, float], tmp_path: Path
) -> None:
    url, end = planted
    config = _config(url)
    path = str(tmp_path / "windows.npz")
    running, running_transport = _source(config)
    running.observe(end - 60)
    assert save_windows(running, path) == len(running.windows) > 0

    restarted, transport = _source(config)
    assert load_windows(restarted, path) == len(running.windows)
    restarted.observe(end)
    running_transport.spans = []
    running.observe(end)
    # The same requests as a source that never stopped: the gap for series with data
    # (60 s + overlap); no frame-buffer series is planted, and an empty window is
    # backfilled every tick by either.
    assert sorted(transport.spans) == sorted(running_transport.spans)
    assert min(transport.spans) <= 60 + config.prometheus.overlap + 1
    for key, window in running.windows.items():
        restored = restarted.windows[key].series().values
        assert np.array_equal(restored, window.series().values, equal_nan=True), key
    cold, cold_transport = _source(config)
    cold.observe(end)
    assert max(cold_transport.spans) >= config.metrics.window - 1  # what warm start saves


def test_a_file_for_another_grid_or_unreadable_is_ignored(
    planted: tuple[str, float], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url, end = planted
    path = tmp_path / "windows.npz"
    source, _ = _source(_config(url))
    source.observe(end)
    save_windows(source, str(path))
    other, _ = _source(_config(url, window="20m"))
    assert load_windows(other, str(path)) == 0 and other.windows == {}
    with np.load(path) as data:  # a file of another format: refused, not misread
        arrays = dict(data)
    arrays["meta"] = np.frombuffer(b'{"step": 0.5, "window": 3600.0, "windows": []}', np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    with caplog.at_level(logging.INFO, logger="gpuscaler.prometheus"):
        assert load_windows(source, str(path)) == 0
    assert "another format" in caplog.text
    path.write_bytes(b"not a zip")
    assert load_windows(other, str(path)) == 0
    assert "cannot read" in caplog.text
    assert load_windows(other, str(tmp_path / "missing.npz")) == 0


def test_windows_are_saved_at_most_every_interval_and_atomically(
    planted: tuple[str, float], tmp_path: Path
) -> None:
    url, end = planted
    path = tmp_path / "windows.npz"
    source, _ = _source(_config(url))
    source.observe(end)
    warm = WarmStart(source, str(path), every=120)
    assert warm.restored == 0
    warm.after_tick(end)
    first = path.stat().st_mtime_ns
    warm.after_tick(end + 60)  # too soon: not written again
    assert path.stat().st_mtime_ns == first
    assert not (tmp_path / "windows.npz.tmp").exists()
    assert WarmStart(_source(_config(url))[0], str(path), 120).restored == len(source.windows)
