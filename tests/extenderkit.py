"""Builders for the extender tests: GPU nodes, kube-scheduler request bodies (shaped as
k8s.io/kube-scheduler/extender/v1 ExtenderArgs and a real v1.Pod), an in-memory cluster."""

from __future__ import annotations

import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, start_http_server
from promserver import free_port

from gpuscaler.config import SchedulerConfig
from gpuscaler.core.gpufit import Gpu, NodeGpus, NodeMeta, PodRecord
from gpuscaler.extender.metrics import ExtenderMetrics
from gpuscaler.extender.server import ExtenderApp
from gpuscaler.extender.service import Extender, KubeError
from gpuscaler.extender.state import GpuState

A100 = 40960.0
MIB = A100


def gpu_node(
    name: str, used: list[float], numa: list[int] | None = None, at: float | None = None
) -> NodeGpus:
    gpus = tuple(Gpu(f"{name}-gpu{i}", i, A100, u) for i, u in enumerate(used))
    node = NodeGpus(name, gpus, time.time() if at is None else at)
    if numa is not None:
        from gpuscaler.core.gpufit import with_numa

        node = with_numa(node, {g.uuid: numa[i] for i, g in enumerate(gpus)})
    return node


def pod(
    name: str = "p",
    memory: str | None = "8192",
    count: str | None = None,
    uid: str | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    annotations = {}
    if memory is not None:
        annotations["gpu-scheduler/memory-mb"] = memory
    if count is not None:
        annotations["gpu-scheduler/gpu-count"] = count
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "annotations": annotations,
            "creationTimestamp": "2026-11-29T10:00:00Z",
        },
        "spec": {
            "schedulerName": "gpu-scheduler",
            "containers": [{"name": "main", "image": "vllm", "resources": {}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        },
        "status": {"phase": "Pending"},
    }


def args(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """ExtenderArgs as kube-scheduler sends it with nodeCacheCapable: Nodes is null."""
    return {"Pod": p, "Nodes": None, "NodeNames": names}


class MemoryCluster:
    """Nodes and pods in memory; ClusterSource and Binder for in-process tests."""

    def __init__(self, gpus: dict[str, NodeGpus], meta: dict[str, NodeMeta] | None = None):
        self.gpus = gpus
        self.meta = meta if meta is not None else {n: NodeMeta(n) for n in gpus}
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.bound: dict[str, str] = {}
        self.bind_delay = 0.0
        self.lock = threading.Lock()

    def add(self, p: dict[str, Any]) -> None:
        self.objects[(p["metadata"]["namespace"], p["metadata"]["name"])] = p

    def fetch(self) -> dict[str, NodeGpus]:
        return dict(self.gpus)

    def nodes(self) -> dict[str, NodeMeta]:
        return self.meta

    def pods(self) -> list[PodRecord]:
        from gpuscaler.adapters.scheduling import pod_record

        return [pod_record(p) for p in self.objects.values()]

    def get_pod(self, namespace: str, name: str) -> PodRecord:
        from gpuscaler.adapters.scheduling import pod_record

        p = self.objects.get((namespace, name))
        if p is None:
            raise KubeError(f"read pod {namespace}/{name}: HTTP 404 Not Found")
        return pod_record(p)

    def annotate(self, namespace: str, name: str, uid: str, values: dict[str, str | None]) -> None:
        p = self.objects[(namespace, name)]
        annotations = p["metadata"].setdefault("annotations", {})
        for k, v in values.items():
            if v is None:
                annotations.pop(k, None)
            else:
                annotations[k] = v

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        time.sleep(self.bind_delay)
        with self.lock:
            if uid in self.bound:
                raise KubeError(f"bind pod {namespace}/{name}: HTTP 409 Conflict")
            self.bound[uid] = node


def make_extender(
    cluster: MemoryCluster, config: SchedulerConfig | None = None, clock: Any = time.time
) -> tuple[ExtenderApp, GpuState]:
    config = config or SchedulerConfig()
    state = GpuState(cluster, cluster, config.memory_margin, config.reservation_ttl, clock)
    state.refresh()
    extender = Extender(state, cluster, config, lambda: True, clock)
    return ExtenderApp(extender, ExtenderMetrics(), lambda: None), state


class DcgmExporter:
    """dcgm-exporter's frame-buffer series for a few GPUs, values set by the test."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["gpu", "UUID", "pci_bus_id", "Hostname", "hostname", "modelName"]
        self.gauges = {
            f: Gauge(f"DCGM_FI_DEV_FB_{f.upper()}", f"FB {f} (MiB)", labels, registry=self.registry)
            for f in ("used", "free", "reserved")
        }
        self.port = free_port()
        self.server, self.thread = start_http_server(
            self.port, addr="127.0.0.1", registry=self.registry
        )

    def gpu(self, node: str, index: int, used: float, lowercase: bool = False) -> None:
        host = ("", node) if lowercase else (node, "")
        labels = (str(index), f"GPU-{node}-{index}", f"0000:{index:02x}:00.0", *host, "A100")
        reserved = 512.0
        self.gauges["used"].labels(*labels).set(used)
        self.gauges["free"].labels(*labels).set(MIB - used - reserved)
        self.gauges["reserved"].labels(*labels).set(reserved)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
