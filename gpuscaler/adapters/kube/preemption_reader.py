"""What the preemption decider observes, read from the cluster (or a kubectl dump)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.adapters.kube.api import KubeError, json_body
from gpuscaler.adapters.kube.cluster import pool_nodes, schedulable_on
from gpuscaler.adapters.kube.objects import ClusterObjects, GpuPod, Node, parse_time
from gpuscaler.adapters.kube.preemption_records import (
    CHECKPOINT_DONE,
    GPU_MEMORY,
    LAST_CHECKPOINT,
    PREEMPTIBLE,
    parse_record,
    read_records,
)
from gpuscaler.adapters.kube.reader import ClusterReader
from gpuscaler.adapters.prometheus.memory import GpuMemoryProbe
from gpuscaler.config import Config
from gpuscaler.core.gpufit import GPUS_PER_NUMA_LABEL, TOPOLOGY_ANNOTATION
from gpuscaler.core.node_agent import gpus_per_numa_domain
from gpuscaler.core.parsing import parse_count
from gpuscaler.core.preemption import NodeView, PodView, PreemptionObservation, VictimState


def pod_view(
    p: GpuPod, never: set[str], pdb_blocked: bool, nodes: tuple[Node, ...] = ()
) -> PodView:
    memory = p.annotations.get(GPU_MEMORY)
    try:
        gpu_memory = float(memory) if memory is not None else None
    except ValueError:
        gpu_memory = None
    return PodView(
        key=p.key,
        uid=p.uid,
        namespace=p.namespace,
        node=p.node,
        gpus=p.gpus,
        priority=p.priority,
        phase=p.phase,
        start_time=p.start_time,
        unschedulable_since=p.unschedulable_since,
        terminating_since=p.terminating_since,
        labels=p.labels,
        opted_out=p.annotations.get(PREEMPTIBLE) == "false",
        preemption_never=p.priority_class in never,
        pdb_blocked=pdb_blocked,
        checkpoint_at=parse_time(p.annotations.get(LAST_CHECKPOINT)),
        checkpoint_done_at=parse_time(p.annotations.get(CHECKPOINT_DONE)),
        gpu_memory_gib=gpu_memory,
        allowed_nodes=frozenset(n.name for n in nodes if schedulable_on(p, n))
        if p.node is None
        else None,
        devices=p.devices,
        wanted_devices=p.wanted_devices,
        wanted_capacity=p.wanted_capacity,
    )


class PreemptionReader:
    """Pods, nodes, PriorityClasses, PDBs and the records, as the core's observation."""

    def __init__(
        self,
        api: client.ApiClient,
        config: Config,
        cluster: ClusterReader,
        namespace: str,
        memory: GpuMemoryProbe | None = None,
    ):
        self.config = config
        self.cluster = cluster
        self.namespace = namespace
        self.core = client.CoreV1Api(api)
        self.scheduling = client.SchedulingV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.memory = memory

    def reconfigure(self, config: Config) -> None:
        self.config = config

    # The reads a watch cache answers instead (`cache.CachedPreemptionReader`).
    def records_data(self) -> Mapping[str, str]:
        cm = read_records(self.core, self.namespace)
        return (cm or {}).get("data") or {}

    def listed(self, kind: str) -> list[dict[str, Any]]:
        list_all: Any = {  # the client is untyped
            "PriorityClass": self.scheduling.list_priority_class,
            "PodDisruptionBudget": self.policy.list_pod_disruption_budget_for_all_namespaces,
        }[kind]
        return json_body(list_all(_preload_content=False)).get("items") or []

    def states(self) -> tuple[VictimState, ...]:
        return tuple(parse_record(k, raw) for k, raw in sorted(self.records_data().items()))

    def observe(self, now: float) -> PreemptionObservation:
        try:
            objects = self.cluster.last_objects or self.cluster.objects()
            classes = self.listed("PriorityClass")
            pdbs = self.listed("PodDisruptionBudget")
            states = self.states()
        except (KubeError, ApiException, KeyError) as e:
            return PreemptionObservation(problem=f"cannot read preemption state: {e}")
        released: dict[str, bool | None] = {}
        for s in states:
            if s.tier == "cleanup":
                released[s.victim] = self.memory.released(s, now) if self.memory else None
        return preemption_observation(objects, self.config, classes, pdbs, states, released)


def preemption_observation(
    objects: ClusterObjects,
    config: Config,
    priority_classes: list[dict[str, Any]],
    pdbs: list[dict[str, Any]],
    states: tuple[VictimState, ...] = (),
    released: Mapping[str, bool | None] | None = None,
) -> PreemptionObservation:
    """What the core needs, from cluster objects (read live, or from a kubectl dump)."""
    never = {
        c["metadata"]["name"] for c in priority_classes if c.get("preemptionPolicy") == "Never"
    }
    blocked = _pdb_blocked(objects.pods, pdbs)
    pods = tuple(pod_view(p, never, p.key in blocked, objects.nodes) for p in objects.pods)
    nodes = []
    reserve = config.fragments.memory_reserve_ratio
    for pool in config.node_pools:
        for n in pool_nodes(objects, pool):
            per_gpu = max(1, n.fragments or 1)
            memory = n.gpu_memory_mib / 1024 if n.gpu_memory_mib else pool.gpu_memory_gib
            numa = n.labels.get(GPUS_PER_NUMA_LABEL, "")
            domain = gpus_per_numa_domain(n.annotations.get(TOPOLOGY_ANNOTATION))  # the agent's
            if domain is None and numa:
                with suppress(ValueError):  # a label that is no number: as if absent
                    domain = max(0, parse_count(numa))
            nodes.append(
                NodeView(
                    n.name,
                    (n.gpu_count or 0) * per_gpu,
                    memory * (1 - reserve) / per_gpu,
                    domain * per_gpu if domain is not None else None,
                    pool.name,
                    n.dra_devices,
                    n.dra_allocated,
                    not n.dra_only,
                    n.dra_shared,
                )
            )
    return PreemptionObservation(
        pods, tuple(nodes), states, released or {}, claim_holders=objects.claim_holders
    )


def _pdb_blocked(pods: tuple[GpuPod, ...], pdbs: list[dict[str, Any]]) -> set[str]:
    """Pods selected (matchLabels) by a PodDisruptionBudget that allows no disruption now."""
    out = set()
    for pdb in pdbs:
        if int((pdb.get("status") or {}).get("disruptionsAllowed", 0)) > 0:
            continue
        ns = pdb["metadata"].get("namespace")
        match = ((pdb.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        for p in pods:
            if p.namespace == ns and all(p.labels.get(k) == v for k, v in match.items()):
                out.add(p.key)
    return out
