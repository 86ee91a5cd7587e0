"""GPU memory release (preemption tier 3), read from Prometheus."""

from __future__ import annotations

import logging
import math
import re

import numpy as np

from gpuscaler.adapters.prometheus.promql import escape_label_value
from gpuscaler.adapters.prometheus.transport import SourceError, Transport
from gpuscaler.adapters.prometheus.window import decode_range
from gpuscaler.config import Config
from gpuscaler.core.model import FloatArray
from gpuscaler.core.preemption import VictimState

log = logging.getLogger("gpuscaler.preemption")
AGENT_POD_GPU = "gpuscaler_agent_pod_gpu_device"
"""The node agent's pod-to-GPU mapping (kubelet pod-resources)."""


class GpuMemoryProbe:
    """Was a gone victim's GPU memory released? The GPUs dcgm-exporter attributed to the
    pod (under MPS, the node agent's mapping), then their frame buffer since it left.
    True: a sample at or below `released_below_mib`, or another pod on the GPU; False:
    every sample above it and the GPU idle (util < 5 %); None: not measurable."""

    def __init__(self, config: Config, transport: Transport):
        self.config = config
        self.transport = transport

    def _series(
        self, query: str, start: float, end: float, step: float
    ) -> list[tuple[dict[str, str], FloatArray]]:
        """Each series' labels and finite values; a malformed answer is a SourceError."""
        out = []
        for s in decode_range(self.transport.query_range(query, start, end, step)):
            if s.error is not None:
                raise SourceError(s.error)
            out.append((s.metric, s.values[np.isfinite(s.values)]))
        return out

    def released(self, s: VictimState, now: float) -> bool | None:
        namespace, pod = s.victim.split("/", 1)
        gone, since = s.gone_at or s.since, s.requested_at - 60
        of_pod = f"namespace={escape_label_value(namespace)},pod={escape_label_value(pod)}"
        try:
            attributed = self._series(f"DCGM_FI_DEV_FB_USED{{{of_pod}}}", since, gone, 5.0)
            uuids = sorted({m["UUID"] for m, _ in attributed if "UUID" in m})
            by_agent = not uuids  # MPS: no per-pod series; the node agent's mapping instead
            if by_agent:
                mapped = self._series(f"{AGENT_POD_GPU}{{{of_pod}}}", since, gone, 5.0)
                uuids = sorted({m["gpu"] for m, _ in mapped if "gpu" in m})
            if not uuids:
                return None
            match = "|".join(re.escape(u) for u in uuids)
            selector = f"UUID=~{escape_label_value(match)}"
            start = math.floor(gone)
            memory = self._series(f"DCGM_FI_DEV_FB_USED{{{selector}}}", start, now, 1.0)
            util = self._series(f"DCGM_FI_DEV_GPU_UTIL{{{selector}}}", start, now, 1.0)
            others: set[tuple[str, str]] = set()
            if by_agent:
                on_gpus = f"{AGENT_POD_GPU}{{gpu=~{escape_label_value(match)}}}"
                mapped = self._series(on_gpus, start, now, 5.0)
                others = {(m.get("namespace", ""), m.get("pod", "")) for m, _ in mapped}
                others -= {(namespace, pod)}
        except SourceError as e:
            log.warning("memory check of %s: %s", s.victim, e)
            return None
        if others or any(m.get("pod") not in (None, "", pod) for m, _ in memory):
            return True  # another pod holds the GPU now: it is in use, not leaked
        values = np.concatenate([v for _, v in memory] or [np.empty(0)])
        busy = np.concatenate([v for _, v in util] or [np.empty(0)])
        if not values.size:
            return None
        if values.min() <= self.config.preemption.released_below_mib:
            return True
        if busy.size and busy.max() < 5:
            return False
        return None
