"""Tier 3's memory check where dcgm-exporter cannot attribute GPUs to pods (MPS): the GPUs
a gone victim held come from the node agent's pod-resources metric, in a real Prometheus."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from promserver import STEP, planted_window, prometheus, write_openmetrics

from gpuscaler.adapters.prometheus.memory import AGENT_POD_GPU, GpuMemoryProbe
from gpuscaler.adapters.prometheus.transport import Transport
from gpuscaler.config import parse_config
from gpuscaler.core.preemption import VictimState

POINTS = 1200
GONE_AT_POINT = 600
WINDOW = {"start": 0.0, "end": 0.0}


def _gpu(uuid: str) -> dict[str, str]:  # dcgm-exporter under MPS: no pod labels
    return {"UUID": uuid, "gpu": "0", "Hostname": "gpu-0", "modelName": "NVIDIA A100"}


def _device(uuid: str, pod: str) -> dict[str, str]:  # gpuscaler agent, pod-resources
    return dict(namespace="batch", pod=pod, container="main", gpu=uuid, device=f"{uuid}::1")


def _while(value: float, gone: bool | None = None) -> Any:
    """`value` before the victim left (gone False), after it (True) or throughout (None)."""
    return lambda i: value if gone is None or (i >= GONE_AT_POINT) == gone else None


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuMemoryProbe]:
    start, end = planted_window(POINTS, 10)
    WINDOW.update(start=start, end=end)
    series = {
        "DCGM_FI_DEV_FB_USED": [
            (_gpu("GPU-mps-leaked"), _while(30_000.0)),
            (_gpu("GPU-mps-released"), lambda i: 30_000.0 if i < GONE_AT_POINT else 200.0),
            (_gpu("GPU-mps-shared"), _while(30_000.0)),
        ],
        "DCGM_FI_DEV_GPU_UTIL": [
            (_gpu(u), _while(0.0)) for u in ("GPU-mps-leaked", "GPU-mps-shared")
        ],
        AGENT_POD_GPU: [
            (_device("GPU-mps-leaked", "leaked"), _while(1.0, False)),
            (_device("GPU-mps-released", "released"), _while(1.0, False)),
            (_device("GPU-mps-shared", "shared"), _while(1.0, False)),
            (_device("GPU-mps-shared", "neighbour"), _while(1.0)),  # another MPS client stays
        ],
    }
    data = tmp_path_factory.mktemp("prom") / "data.om"
    write_openmetrics(data, series, start, POINTS)
    with prometheus(data) as url:
        config = parse_config(f'prometheus: {{url: "{url}", timeout: 5s, retries: 0}}')
        yield GpuMemoryProbe(config, Transport(config.prometheus))


def _state(pod: str) -> VictimState:
    gone = WINDOW["start"] + GONE_AT_POINT * STEP
    asked = WINDOW["start"] + 10
    return VictimState(f"batch/{pod}", "serving/critical", "gpu-0", 1, 10, "cleanup", gone, asked, gone_at=gone)  # fmt: skip


@pytest.mark.parametrize(
    ("pod", "released"),
    [
        pytest.param("leaked", False, id="held on an idle GPU the agent mapped to the gone pod"),
        pytest.param("released", True, id="fell below the threshold after the pod left"),
        pytest.param("shared", True, id="another MPS client of the GPU is still there: in use"),
        pytest.param("unknown-pod", None, id="neither dcgm-exporter nor the agent knows the pod: not measurable"),
    ],
)  # fmt: skip
def test_the_agents_pod_to_gpu_mapping_makes_mps_gpus_measurable(
    probe: GpuMemoryProbe, pod: str, released: bool | None
) -> None:
    assert probe.released(_state(pod), WINDOW["end"] + 1) is released
