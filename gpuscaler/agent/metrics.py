"""The node agent's Prometheus metrics and its /healthz, /readyz answers.

Labels: GPUs by index (a node has a handful), fixed lists of outcomes and owners, and, for
the pod-to-GPU mapping only, the pods on this node (pod-resources; cleared each poll, so a
gone pod's series goes with it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from gpuscaler.adapters.podresources import PodDevice, gpu_of_device


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        gauge, counter = partial(Gauge, registry=r), partial(Counter, registry=r)
        self.polls = counter(
            "gpuscaler_agent_polls", "Agent polls by outcome (ok, failed).", ["outcome"]
        )
        self.source_up = gauge(
            "gpuscaler_agent_source_up",
            "1 when the last poll could read the source (nvml, kubernetes, pod_resources).",
            ["source"],
        )
        self.time_slice = gauge(
            "gpuscaler_agent_time_slice_level",
            "Time-slice level the agent applied to a GPU (0 default, 1 short, 2 medium, 3 long).",
            ["gpu"],
        )
        self.time_slice_sets = counter(
            "gpuscaler_agent_time_slice_sets",
            "nvidia-smi --set-timeslice calls by outcome (ok, failed, dry_run), and MIG GPUs "
            "skipped (skipped).",
            ["outcome"],
        )
        self.memory_used = gauge(
            "gpuscaler_agent_gpu_memory_used_mib", "Frame buffer used (NVML).", ["gpu"]
        )
        self.processes = gauge(
            "gpuscaler_agent_gpu_processes",
            "Compute processes per GPU by owner: pod (its pod exists), host (no pod UID), "
            "orphan (its pod is gone), unknown (cgroup not understood).",
            ["gpu", "owner"],
        )
        self.signals = counter(
            "gpuscaler_agent_orphan_signals",
            "Signals to orphaned GPU processes by signal and outcome (sent, gone, reused, "
            "refused, dry_run).",
            ["signal", "outcome"],
        )
        self.freed = counter(
            "gpuscaler_agent_orphan_memory_freed_mib",
            "GPU memory held by orphans that exited after a signal.",
        )
        self.quarantined = gauge(
            "gpuscaler_agent_node_quarantined",
            "1 while the node carries the gpu-memory-held taint or the cleanup label.",
        )
        self.lifts = counter(
            "gpuscaler_agent_quarantine_lifts",
            "Quarantines lifted by outcome (ok, failed, dry_run).",
            ["outcome"],
        )
        self.pod_gpu = gauge(
            "gpuscaler_agent_pod_gpu_device",
            "1 per device the kubelet allocated to a pod's container (pod-resources API); gpu "
            "is the GPU UUID, device the plugin's device ID (UUID::n when shared).",
            ["namespace", "pod", "container", "gpu", "device"],
        )

    def set_pod_devices(self, devices: Iterable[PodDevice]) -> None:
        self.pod_gpu.clear()
        for d in devices:
            self.pod_gpu.labels(
                d.namespace, d.pod, d.container, gpu_of_device(d.device_id), d.device_id
            ).set(1)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


@dataclass
class AgentHealth:
    """Healthy while polls complete; ready once one has."""

    interval: float
    clock: Callable[[], float] = time.time
    started: float = 0.0
    last_success: float | None = None
    polls: int = 0

    def __post_init__(self) -> None:
        self.started = self.clock()

    def record(self, ok: bool) -> None:
        self.polls += 1
        if ok:
            self.last_success = self.clock()

    def healthy(self) -> tuple[bool, str]:
        limit = 3 * self.interval + 30  # three missed polls, plus a slow first one
        since = self.clock() - (self.last_success or self.started)
        if since > limit:
            return False, f"no poll completed for {since:.0f}s (limit {limit:.0f}s)"
        return True, "polls complete"

    def ready(self) -> tuple[bool, str]:
        if self.last_success is None:
            return False, "no poll has completed yet"
        return True, "ready"
