"""dcgm-exporter's DRA mode (--kubernetes-enable-dra) on a real Prometheus: a GPU's series
carries the pod, namespace and container of each container holding it through a claim,
plus dra_claim_name, dra_claim_namespace, dra_driver_name, dra_pool_name and
dra_device_name, and is copied once per such container (NVIDIA/dcgm-exporter
internal/pkg/transformation/const.go, kubernetes.go). The UUID, pool, device and claim are
those of its TestPodDRAInfo (internal/pkg/transformation/kubernetes_test.go)."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import yaml
from promserver import SHIPPED_RULE, planted_window, prometheus, write_openmetrics

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.config import parse_config
from gpuscaler.sources import PrometheusSource

POINTS = 1500  # 12.5 min at 500 ms: more than forecast.min_history
SHARED = "GPU-8a748984-0fe7-297f-916c-4b998ce202d1"


def dra_series(pod: str, container: str, claim: str, uuid: str, device: str) -> dict[str, str]:
    return {
        "UUID": uuid,
        "gpu": "0" if uuid == SHARED else "1",
        "Hostname": "dra-node",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "pod": pod,
        "namespace": "ml",
        "container": container,
        "dra_claim_name": claim,
        "dra_claim_namespace": "ml",
        "dra_driver_name": "gpu.nvidia.com",
        "dra_pool_name": "poolA",
        "dra_device_name": device,
    }


@pytest.fixture(scope="module")
def dra_mode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    """The shared GPU (60 %) held by chat-7d4f8b9c6-x2x4z's claim from both its containers and by
    embed-0's claim; another GPU (40 %) held by chat-7d4f8b9c6-bq5mn."""
    start, end = planted_window(POINTS, 20)
    copies = [
        (dra_series("chat-7d4f8b9c6-x2x4z", "main", "claim1", SHARED, "gpu-x"), 60.0),
        (dra_series("chat-7d4f8b9c6-x2x4z", "sidecar", "claim1", SHARED, "gpu-x"), 60.0),
        (dra_series("embed-0", "main", "claim2", SHARED, "gpu-x"), 60.0),
        (dra_series("chat-7d4f8b9c6-bq5mn", "main", "claim3", "GPU-other", "gpu-y"), 40.0),
    ]
    data = tmp_path_factory.mktemp("dra") / "data.om"
    metrics = {"DCGM_FI_DEV_GPU_UTIL": [(s, lambda i, v=v: v) for s, v in copies]}
    write_openmetrics(data, metrics, start, POINTS)  # type: ignore[arg-type]
    with prometheus(data) as url:
        yield url, end


def _rule_values(url: str, at: float) -> dict[tuple[str, str], float]:
    """The shipped workload rule's expression, evaluated by the real Prometheus at `at`."""
    (group,) = [
        g
        for g in yaml.safe_load(SHIPPED_RULE.read_text())["spec"]["groups"]
        if g["name"] == "gpuscaler-workloads"
    ]
    query = urllib.parse.urlencode({"query": group["rules"][0]["expr"], "time": f"{at:.3f}"})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=10) as answer:
        result = json.load(answer)["data"]["result"]
    return {
        (r["metric"]["namespace"], r["metric"]["workload"]): float(r["value"][1]) for r in result
    }


@pytest.mark.parametrize(
    ("workload", "load"),
    [("chat", 100.0), ("embed", 60.0)],
    ids=[
        "a pod's GPU counts once however many of its containers hold it",
        "a GPU shared with another workload's claim counts for that one too",
    ],
)
def test_dra_mode_series_are_a_workloads_gpus_each_once_per_pod(
    dra_mode: tuple[str, float], workload: str, load: float
) -> None:
    url, end = dra_mode
    config = parse_config(
        f'prometheus: {{url: "{url}", retries: 0}}\n'
        f"workloads:\n  - {{namespace: ml, kind: ScaledObject, name: {workload}}}\n"
    )
    (w,) = PrometheusSource(config, CurrentState()).observe(end + 1).workloads
    assert w.problem is None, w.problem
    assert w.load is not None
    values = w.load.values[np.isfinite(w.load.values)]
    assert values.size > 50 and np.allclose(values, load)
    assert _rule_values(url, end)[("ml", workload)] == load  # the grouped read says the same
