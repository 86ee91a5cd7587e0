"""GPU memory per node for the scheduler extender: ONE grouped instant query per refresh
through the project's Prometheus transport (auth, TLS, timeouts, retries, scrubbing).

dcgm-exporter exports, per GPU (labels `gpu`, `UUID`, `pci_bus_id`, and `Hostname`, being
renamed `hostname`), `DCGM_FI_DEV_FB_USED`, `DCGM_FI_DEV_FB_FREE` and
`DCGM_FI_DEV_FB_RESERVED` in MiB. The query tags each with a `field` label and takes the
max per GPU (pod attribution would otherwise repeat a GPU once per pod):

    total = used + free + reserved;  used (for placement) = used + reserved

since driver-reserved memory is as unavailable to a pod as used memory. A GPU without
both `used` and `free` is left out (never guessed), and so is one with a value the
controller would refuse too (non-finite, negative, above a TiB), with a warning. The
`Hostname` label is taken as the Kubernetes node name (dcgm-exporter's DaemonSet sets it
from NODE_NAME).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from gpuscaler.adapters.prometheus.transport import SourceError, Transport
from gpuscaler.adapters.prometheus.window import MEMORY_MIB, drop_outside
from gpuscaler.config import format_duration
from gpuscaler.core.gpufit import Gpu, NodeGpus
from gpuscaler.core.parsing import parse_count

log = logging.getLogger("gpuscaler.extender")

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
    """Nodes and their GPUs from the vector result of `grouped_query`. A series that is
    malformed, or a GPU with a value outside MEMORY_MIB (the controller's bound) or an
    index that is not ASCII digits, is left out and logged: never the whole refresh."""
    if not isinstance(result, list):
        raise SourceError("data.result is not a list")
    fields: dict[tuple[str, str], dict[str, Any]] = {}
    dropped: list[str] = []
    for item in result:
        labels = item.get("metric") if isinstance(item, dict) else None
        try:
            value: float | None = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            value = None
        if not isinstance(labels, dict) or value is None:
            dropped.append('a sample is not {"metric": {...}, "value": [time, "number"]}')
            continue
        node = labels.get("Hostname") or labels.get("hostname")
        key = labels.get("UUID") or labels.get("pci_bus_id") or labels.get("gpu")
        if not node or not key:
            continue
        entry = fields.setdefault((node, key), {"index": labels.get("gpu", "")})
        entry[labels.get("field", "")] = value
    nodes: dict[str, list[Gpu]] = {}
    for (node, key), entry in fields.items():
        gpu = _gpu(key, entry)
        if isinstance(gpu, str):
            dropped.append(f"node {node} GPU {key}: {gpu}")
        elif gpu is not None:
            nodes.setdefault(node, []).append(gpu)
    if dropped:
        log.warning("dcgm series left out: %d, e.g. %s", len(dropped), dropped[0][:200])
    return {
        name: NodeGpus(name, tuple(sorted(gpus, key=lambda g: (g.index, g.uuid))), sampled_at)
        for name, gpus in nodes.items()
    }


def _gpu(key: str, entry: dict[str, Any]) -> Gpu | str | None:
    """The GPU, None without both used and free, else what is wrong with it."""
    used, free = entry.get("used"), entry.get("free")
    if used is None or free is None:
        return None
    values = np.array([used, free, entry.get("reserved", 0.0)])
    if not np.isfinite(values).all():
        return "frame buffer NaN or infinite"
    if problem := drop_outside(values, MEMORY_MIB):
        return problem
    total = float(values.sum())
    if total <= 0:
        return "no frame buffer"
    try:
        index = parse_count(str(entry["index"])) if entry["index"] != "" else -1
    except ValueError as e:
        return f"label gpu: {e}"
    if index < 0 and entry["index"] != "":
        return f"label gpu: {index} is negative"
    return Gpu(key, index, total, float(values[0] + values[2]))


class PrometheusGpus:
    """The extender's GPU source: one query per `fetch`."""

    def __init__(self, transport: Transport, max_age: float, wall: Callable[[], float]):
        self.transport = transport
        self.query = grouped_query(max_age)
        self.wall = wall

    def fetch(self) -> dict[str, NodeGpus]:
        at = self.wall()
        return decode_gpus(self.transport.query(self.query), at)
