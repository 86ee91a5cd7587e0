"""A workload's GPU load under stock scraping (`honorLabels: false`: the exporter's pod
labels arrive as `exported_pod`/`exported_namespace`), on a real Prometheus."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from promserver import planted_window, prometheus, write_openmetrics

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.config import parse_config
from gpuscaler.sources import PrometheusSource

POINTS = 1200


def _constant(value: float) -> Callable[[int], float | None]:
    return lambda i: value


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    start, end = planted_window(POINTS, 20)
    exporter = {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-7x2kq"}
    util = [
        (
            {**exporter, "UUID": "GPU-1", "exported_namespace": "ml", "exported_pod": "chat-5d-a"},
            60.0,
        ),
        (
            {**exporter, "UUID": "GPU-2", "exported_namespace": "ml", "exported_pod": "chat-5d-b"},
            40.0,
        ),
        (
            {**exporter, "UUID": "GPU-3", "exported_namespace": "ml", "exported_pod": "chatty-0"},
            99.0,
        ),
        ({"namespace": "ml", "pod": "embed-6f-a", "UUID": "GPU-4"}, 30.0),  # honorLabels: true
    ]
    data = tmp_path_factory.mktemp("scraped") / "data.om"
    series = [(labels, _constant(v)) for labels, v in util]
    write_openmetrics(data, {"DCGM_FI_DEV_GPU_UTIL": series}, start, POINTS)
    with prometheus(data) as url:
        yield url, end


@pytest.mark.parametrize(
    ("workload", "load"),
    [("chat", 100.0), ("embed", 30.0), ("absent", None)],
    ids=["exported_* labels", "plain labels", "no such pods"],
)
def test_a_workloads_load_is_read_under_either_label_convention(
    scraped: tuple[str, float], workload: str, load: float | None
) -> None:
    url, end = scraped
    config = parse_config(
        f'prometheus: {{url: "{url}", retries: 0}}\n'
        f"workloads:\n  - {{namespace: ml, kind: ScaledObject, name: {workload}}}\n"
    )
    raw = PrometheusSource(config, CurrentState()).observe(end + 1)
    (w,) = raw.workloads
    if load is None:
        assert w.problem is not None and "empty result" in w.problem
        return
    assert w.problem is None, w.problem
    assert w.load is not None
    values = w.load.values[np.isfinite(w.load.values)]
    assert values.size > 50 and np.allclose(values, load)  # chatty-0 never counts for chat
