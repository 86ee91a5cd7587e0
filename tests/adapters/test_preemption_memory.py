"""Tier 3's memory check against a real Prometheus: released, held, taken by another pod,
or never attributed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from promserver import STEP, planted_window, prometheus, write_openmetrics

from gpuscaler.adapters.prometheus.memory import GpuMemoryProbe
from gpuscaler.adapters.prometheus.transport import Transport
from gpuscaler.config import parse_config
from gpuscaler.core.preemption import VictimState

POINTS = 1200  # 10 minutes at 500 ms
START, END = planted_window(POINTS, 10)  # set again by the fixture that plants them
GONE_AT_POINT = 600  # the victims leave halfway


def _gpu(uuid: str, pod: str | None) -> dict[str, str]:
    labels = {"UUID": uuid, "gpu": "0", "Hostname": "gpu-0", "modelName": "NVIDIA A100"}
    if pod is not None:
        labels |= {"namespace": "batch", "pod": pod}
    return labels


def _before(value: float) -> Any:
    return lambda i: value if i < GONE_AT_POINT else None


def _after(value: float) -> Any:
    return lambda i: value if i >= GONE_AT_POINT else None


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuMemoryProbe]:
    global START, END
    START, END = planted_window(POINTS, 10)
    fb: list[tuple[dict[str, str], Any]] = [
        # released: attributed while running, then 0 MiB with no pod
        (_gpu("GPU-released", "released"), _before(30_000.0)),
        (_gpu("GPU-released", None), _after(0.0)),
        # leaked: attributed while running, then 30 GiB held by no pod, GPU idle
        (_gpu("GPU-leaked", "leaked"), _before(30_000.0)),
        (_gpu("GPU-leaked", None), _after(30_000.0)),
        # reused: another pod took the GPU at once
        (_gpu("GPU-reused", "reused"), _before(30_000.0)),
        (_gpu("GPU-reused", "next-job"), _after(40_000.0)),
    ]
    util: list[tuple[dict[str, str], Any]] = [
        (_gpu("GPU-leaked", None), _after(0.0)),
        (_gpu("GPU-released", None), _after(0.0)),
    ]
    data = tmp_path_factory.mktemp("prom") / "data.om"
    write_openmetrics(
        data, {"DCGM_FI_DEV_FB_USED": fb, "DCGM_FI_DEV_GPU_UTIL": util}, START, POINTS
    )
    with prometheus(data) as url:
        config = parse_config(f'prometheus: {{url: "{url}", timeout: 5s, retries: 0}}')
        yield GpuMemoryProbe(config, Transport(config.prometheus))


def _state(pod: str) -> VictimState:
    gone = START + GONE_AT_POINT * STEP
    victim = f"batch/{pod}"
    return VictimState(
        victim, "serving/critical", "gpu-0", 1, 10, "cleanup", gone, START + 10, gone_at=gone
    )


@pytest.mark.parametrize(
    ("pod", "released"),
    [("released", True), ("leaked", False), ("reused", True), ("never-attributed", None)],
    ids=[
        "memory fell to zero after the pod left",
        "memory stayed held on an idle GPU with no pod",
        "another pod took the GPU",
        "no per-pod series: not measurable, so no quarantine",
    ],
)
def test_the_memory_of_a_gone_victim_is_judged_from_dcgm_series(
    probe: GpuMemoryProbe, pod: str, released: bool | None
) -> None:
    assert probe.released(_state(pod), END + 1) is released


def test_prometheus_down_means_not_measurable() -> None:
    config = parse_config('prometheus: {url: "http://127.0.0.1:1", timeout: 1s, retries: 0}')
    probe = GpuMemoryProbe(config, Transport(config.prometheus))
    assert probe.released(_state("leaked"), END + 1) is None
