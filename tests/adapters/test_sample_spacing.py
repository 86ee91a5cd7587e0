"""Series scraped more coarsely than metrics.step: the spacing measured, said once (log,
Event, metric), and each point read from the newest sample within it; on a real Prometheus
and the real control plane."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from controlplane import Kube
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from promserver import STEP, planted_window, prometheus, write_openmetrics

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.adapters.prometheus.spacing import (
    RECHECK_EVERY,
    SpacingTracker,
    lookback_ms,
    measure_spacing,
)
from gpuscaler.config import parse_config
from gpuscaler.controller.assembly import cluster_controller
from gpuscaler.observability import ControllerMetrics
from gpuscaler.sources import PrometheusSource


def _runs(spacing: float, count: int, per_run: int = 2, skip: tuple[int, ...] = ()) -> np.ndarray:
    """Points a 500 ms grid query with a 1 s lookback returns for samples `spacing` apart."""
    return np.array(
        [k * spacing + j * STEP for k in range(count) if k not in skip for j in range(per_run)]
    )


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        (np.arange(0, 600, STEP), None),
        (_runs(15, 40), 15.0),
        (_runs(30, 20), 30.0),
        (_runs(15, 40, skip=(7, 21)), 15.0),
        (_runs(15, 3), None),
        (np.array([]), None),
        (_runs(1.0, 100, per_run=2), None),
        (np.array([0.0, 0.5, 100.0, 100.5, 400.0, 400.5, 401.0, 900.0]), None),
        (np.concatenate([np.arange(k * 600, k * 600 + 200, STEP) for k in range(6)]), None),
        (_runs(15, 40, per_run=3), 15.0),
    ],
    ids=[
        "contiguous points",
        "15 s scrapes",
        "30 s scrapes",
        "15 s with two missed scrapes",
        "too few runs to tell",
        "no points",
        "1 s scrapes leave no hole at a 1 s lookback",
        "irregular holes are no scrape interval",
        "200 s outages every 10 min are gaps, not a scrape interval",
        "three points a sample (a sample on a grid edge)",
    ],
)
def test_the_sample_spacing_is_measured_from_the_holes_between_runs(
    times: np.ndarray, expected: float | None
) -> None:
    assert measure_spacing(times, STEP) == expected


def test_a_fine_series_is_measured_again_only_every_ten_reads_and_a_coarse_one_told_once() -> None:
    tracker = SpacingTracker(STEP)
    told: list[str] = []
    tracker.listeners.append(lambda key, spacing, step: told.append(key))
    fine, coarse = np.arange(0, 600, STEP), _runs(15, 40)
    measured = []
    for read in range(RECHECK_EVERY + 1):  # the scrape becomes coarse after the first read
        measured.append(tracker.observe("pool:a:util", fine if read == 0 else coarse))
    assert measured == [False] * RECHECK_EVERY + [True]  # seen at the first recheck
    assert tracker.observe("pool:a:util", coarse) is False and told == ["pool:a:util"]
    tracker.reset(STEP, keep=lambda key: False)
    assert tracker.measured == {}


def test_the_lookback_covers_the_measured_spacing_plus_two_steps() -> None:
    assert lookback_ms(0.5, None) == "1000ms"
    assert lookback_ms(0.5, 15.0) == "16000ms"


POINTS = 1800  # 15 min at 500 ms
SCRAPE = 30  # points between samples: 15 s


@pytest.fixture(scope="module")
def coarse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    """dcgm-exporter and vLLM series sampled every 15 s, as a default scrape leaves them."""
    start, end = planted_window(POINTS, 20)
    every_15s = {"gpu": "0", "UUID": "GPU-1", "Hostname": "node-a", "modelName": "NVIDIA L4"}
    vllm = {"namespace": "ml", "pod": "chat-7c-a", "model_name": "m", "engine": "0"}

    def sampled(value: float):  # type: ignore[no-untyped-def]
        return lambda i: value + (i // SCRAPE) % 3 if i % SCRAPE == 0 else None

    metrics = {
        "DCGM_FI_DEV_GPU_UTIL": [(every_15s, sampled(60.0))],
        "vllm:num_requests_running": [(vllm, sampled(10.0))],
        "vllm:num_requests_waiting": [(vllm, sampled(2.0))],
    }
    data = tmp_path_factory.mktemp("coarse") / "data.om"
    write_openmetrics(data, metrics, start, POINTS)
    with prometheus(data) as url:
        yield url, end


CONFIG = """
prometheus: {{url: "{url}", retries: 0}}
node_pools:
  - name: l4
    selector: {{label: nvidia.com/gpu.product, value: NVIDIA-L4}}
    gpu_memory_gib: 24
    metrics_matchers: {{modelName: NVIDIA L4}}
workloads:
  - {{namespace: ml, kind: ScaledObject, name: chat, demand: {{preset: vllm, per_replica: 8}}}}
"""


def test_series_sampled_every_15s_are_read_without_gaps_and_announced_once(
    coarse: tuple[str, float], caplog: pytest.LogCaptureFixture
) -> None:
    url, end = coarse
    source = PrometheusSource(parse_config(CONFIG.format(url=url)), CurrentState())
    announced: list[tuple[str, float]] = []
    source.spacing.listeners.append(lambda key, spacing, step: announced.append((key, spacing)))
    with caplog.at_level(logging.WARNING, logger="gpuscaler.prometheus"):
        first = source.observe(end + 1)
        second = source.observe(end + 31)
    (pool,) = first.pools
    (workload,) = second.workloads
    for series in (pool.utilization, workload.load):
        assert series is not None
        present = np.flatnonzero(np.isfinite(series.values))
        assert present.size > 50  # 15 min of 10 s buckets
        assert np.isfinite(series.values[present[0] : present[-1] + 1]).all()  # no hole
    assert workload.load is not None
    load = workload.load.values[np.isfinite(workload.load.values)]
    assert ((load >= 12.0) & (load <= 16.0)).all()  # means of the scraped 12, 14 and 16
    assert source.spacing.measured["pool:l4:util"] == 15.0
    assert source.spacing.measured["workload:ml/ScaledObject/chat"] == 15.0
    keys = sorted(k for k, _ in announced)
    assert "pool:l4:util" in keys and "workload:ml/ScaledObject/chat" in keys
    assert len(keys) == len(set(keys))  # once each, over two ticks
    lines = [r for r in caplog.records if getattr(r, "event", None) == "coarse_samples"]
    assert len(lines) == len(keys) and "15s apart" in lines[0].getMessage()


@pytest.mark.controlplane
def test_coarse_samples_become_an_event_on_the_controllers_pod_and_a_metric(
    coarse: tuple[str, float], kube: Kube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, end = coarse
    home = kube.namespace()
    monkeypatch.setenv("POD_NAME", "gpuscaler-abc")
    monkeypatch.setenv("POD_NAMESPACE", home)
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "gpuscaler-abc", "namespace": home},
            "spec": {"containers": [{"name": "gpuscaler", "image": "gpuscaler:0.1.0"}]},
        }
    )
    config = parse_config(CONFIG.format(url=url))
    parts = cluster_controller(config, kube.api, dry_run=True, leader_election=False)
    metrics = ControllerMetrics()
    metrics.attach(parts.controller)
    try:
        parts.controller.tick(end + 1)
        parts.controller.tick(end + 31)
    finally:
        parts.stop()  # its watch cache's threads end with the test
    events = [
        e
        for e in kube.get(f"/apis/events.k8s.io/v1/namespaces/{home}/events")["items"]
        if e["reason"] == "CoarseSamples"
    ]
    (event,) = events  # one for the tick that found them, none for the next
    assert event["regarding"]["name"] == "gpuscaler-abc" and event["type"] == "Warning"
    assert "pool:l4:util every 15s" in event["note"]
    assert "workload:ml/ScaledObject/chat every 15s" in event["note"]
    text = metrics.exposition().decode()
    assert 'gpuscaler_sample_spacing_seconds{series="pool:l4:util"} 15.0' in text


@settings(max_examples=200, deadline=None)
@given(
    spacing_steps=st.integers(min_value=3, max_value=240),
    count=st.integers(min_value=20, max_value=200),
    missed=st.sets(st.integers(min_value=1, max_value=199), max_size=3),
    per_run=st.integers(min_value=1, max_value=3),
    offset=st.floats(min_value=0, max_value=1e6, allow_nan=False),
)
def test_any_regular_scrape_is_measured_at_its_interval_despite_a_few_missed_scrapes(
    spacing_steps: int, count: int, missed: set[int], per_run: int, offset: float
) -> None:
    assume(per_run < spacing_steps)  # else the samples leave no hole: nothing to measure
    spacing = spacing_steps * STEP
    times = _runs(spacing, count, per_run=per_run, skip=tuple(missed)) + round(offset / STEP) * STEP
    assert measure_spacing(times, STEP) == spacing


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=3600, allow_nan=False), max_size=300))
def test_a_measured_spacing_is_always_coarser_than_the_step(points: list[float]) -> None:
    times = np.unique(np.round(np.array(points) / STEP) * STEP)
    spacing = measure_spacing(times, STEP)
    assert spacing is None or spacing > 1.5 * STEP
