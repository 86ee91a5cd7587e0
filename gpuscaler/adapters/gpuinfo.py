"""GPU memory per node for the scheduler extender: ONE grouped instant query per refresh
through the project's Prometheus transport (auth, TLS, timeouts, retries, scrubbing).

dcgm-exporter exports, per GPU (labels `gpu`, `UUID`, `pci_bus_id`, and `Hostname`, being
renamed `hostname`), `DCGM_FI_DEV_FB_USED`, `DCGM_FI_DEV_FB_FREE` and
`DCGM_FI_DEV_FB_RESERVED` in MiB. The query tags each with a `field` label and takes the
max per GPU (pod attribution would otherwise repeat a GPU once per pod):

    total = used + free + reserved;  used (for placement) = used + reserved

since driver-reserved memory is as unavailable to a pod as used memory. A GPU without
both `used` and `free`, or with a non-finite value, is left out (never guessed). The
`Hostname` label is taken as the Kubernetes node name (dcgm-exporter's DaemonSet sets it
from NODE_NAME).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gpuscaler.adapters.prometheus.transport import SourceError, Transport
from gpuscaler.config import format_duration
from gpuscaler.core.gpufit import Gpu, NodeGpus

FIELDS = {
    "used": "DCGM_FI_DEV_FB_USED",
    "free": "DCGM_FI_DEV_FB_FREE",
    "reserved": "DCGM_FI_DEV_FB_RESERVED",
}
GROUP_BY = ("field", "UUID", "gpu", "pci_bus_id", "Hostname", "hostname")


def grouped_query(max_age: float) -> str:
    """Every GPU's used, free and reserved memory in one PromQL expression."""
    window = format_duration(max_age)
    parts = [
        f'label_replace(last_over_time({metric}[{window}]), "field", "{name}", "", "")'
        for name, metric in FIELDS.items()
    ]
    return f"max by ({', '.join(GROUP_BY)}) ({' or '.join(parts)})"


def decode_gpus(result: Any, sampled_at: float) -> dict[str, NodeGpus]:
    """Nodes and their GPUs from the vector result of `grouped_query`."""
    if not isinstance(result, list):
        raise SourceError("data.result is not a list")
    fields: dict[tuple[str, str], dict[str, Any]] = {}
    for item in result:
        if not isinstance(item, dict) or not isinstance(item.get("metric"), dict):
            raise SourceError("result item has no metric labels")
        labels: dict[str, str] = item["metric"]
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            raise SourceError('a sample is not [timestamp, "value"]') from None
        node = labels.get("Hostname") or labels.get("hostname")
        key = labels.get("UUID") or labels.get("pci_bus_id") or labels.get("gpu")
        if not node or not key:
            continue
        entry = fields.setdefault((node, key), {"index": labels.get("gpu", "")})
        entry[labels.get("field", "")] = value
    nodes: dict[str, list[Gpu]] = {}
    for (node, key), entry in fields.items():
        gpu = _gpu(key, entry)
        if gpu is not None:
            nodes.setdefault(node, []).append(gpu)
    return {
        name: NodeGpus(name, tuple(sorted(gpus, key=lambda g: (g.index, g.uuid))), sampled_at)
        for name, gpus in nodes.items()
    }


def _gpu(key: str, entry: dict[str, Any]) -> Gpu | None:
    used, free = entry.get("used"), entry.get("free")
    reserved = entry.get("reserved", 0.0)
    if used is None or free is None:
        return None
    if not all(math.isfinite(v) and v >= 0 for v in (used, free, reserved)):
        return None
    total = used + free + reserved
    if total <= 0:
        return None
    index = int(entry["index"]) if str(entry["index"]).isdigit() else -1
    return Gpu(key, index, total, used + reserved)


class PrometheusGpus:
    """The extender's GPU source: one query per `fetch`."""

    def __init__(self, transport: Transport, max_age: float, wall: Callable[[], float]):
        self.transport = transport
        self.query = grouped_query(max_age)
        self.wall = wall
        self.queries = 0

    def fetch(self) -> dict[str, NodeGpus]:
        self.queries += 1
        at = self.wall()
        return decode_gpus(self.transport.query(self.query), at)
