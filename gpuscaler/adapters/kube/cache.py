"""The cluster as a watch cache: every object a tick reads, listed once and then kept
current by watches (`informer.Informer`), so a tick reads memory instead of listing.

Nodes are kept as the fields `parse_node` reads; pods as parsed GPU pods (the API server
cannot select on resource requests, so the others are dropped as they arrive); the
records ConfigMap by its name. `CachedClusterReader` and `CachedPreemptionReader` answer
what the listing readers answer; a watch down longer than `kubernetes.watch_stale_after`
fails a read like a failed list.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from gpuscaler.adapters.kube.api import KubeError
from gpuscaler.adapters.kube.informer import CacheUnavailable, Informer, Json, Resource
from gpuscaler.adapters.kube.objects import (
    GPU_RESOURCE,
    ClusterObjects,
    ClusterStateError,
    GpuPod,
    floor_field,
    floor_managers,
    parse_node,
    parse_objects,
    parse_pod,
    with_dra,
)
from gpuscaler.adapters.kube.preemption_reader import PreemptionReader
from gpuscaler.adapters.kube.preemption_records import STATE_CONFIGMAP
from gpuscaler.adapters.kube.reader import DRA, DRA_SHARING, ClusterReader
from gpuscaler.adapters.kube.workloads import SCALE_APIS
from gpuscaler.config import Config, KubernetesConfig


@dataclass(frozen=True)
class Broken:
    """An object that cannot be parsed: reading the cache fails, as a list holding it would."""

    message: str


def node_fields(obj: Json) -> Json:
    """A Node as `parse_node` reads it (without its images and conditions: most of it)."""
    meta = obj.get("metadata") or {}
    capacity = ((obj.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE)
    return {
        "kind": "Node",
        "metadata": {k: v for k, v in meta.items() if k != "managedFields"},
        "spec": {"taints": (obj.get("spec") or {}).get("taints")},
        "status": {"capacity": {GPU_RESOURCE: capacity} if capacity is not None else {}},
    }


def gpu_pod(obj: Json) -> GpuPod | Broken | None:
    try:
        return parse_pod(obj)
    except ClusterStateError as e:
        return Broken(str(e))


def with_kind(kind: str) -> Any:
    def keep(obj: Json) -> Json:
        meta = obj.get("metadata") or {}
        slim = {k: v for k, v in meta.items() if k != "managedFields"}
        if kind in SCALE_APIS:  # who owns the floor field is read (GitOps refusals)
            owners = floor_managers(meta, kind)
            slim["managedFields"] = [
                {"manager": m, "fieldsV1": {"f:spec": {"f:" + floor_field(kind): {}}}}
                for m in owners
            ]
        return {**obj, "kind": kind, "metadata": slim}  # watch events carry kind; lists not

    return keep


class ClusterCache:
    """The informers a controller tick reads from, started and stopped together."""

    def __init__(self, api: client.ApiClient, namespace: str, limits: KubernetesConfig):
        self.limits = limits
        self._first_lists_by = 0.0
        """The first lists are waited for until one read timeout after start, all kinds."""
        paths = {
            "Node": "/api/v1/nodes",
            "Pod": "/api/v1/pods",
            **{kind: f"/apis/{g}/{v}/{plural}" for kind, (g, v, plural) in SCALE_APIS.items()},
            "PriorityClass": "/apis/scheduling.k8s.io/v1/priorityclasses",
            "PodDisruptionBudget": "/apis/policy/v1/poddisruptionbudgets",
            **{k: "/apis/{}/{}/{}".format(*v) for k, v in DRA.items() if limits.dra.enabled},
        }
        transforms = {"Node": node_fields, "Pod": gpu_pod}
        self.informers: dict[str, Informer] = {
            kind: Informer(
                api, Resource(kind, path), transforms.get(kind) or with_kind(kind), limits
            )
            for kind, path in paths.items()
        }
        records = Resource(
            "ConfigMap",
            f"/api/v1/namespaces/{namespace}/configmaps",
            field_selector=f"metadata.name={STATE_CONFIGMAP}",
        )
        self.informers["records"] = Informer(api, records, with_kind("ConfigMap"), limits)
        for kind, (g, v, plural) in DRA_SHARING.items() if limits.dra.enabled else ():
            opted = Resource(kind, f"/apis/{g}/{v}/{plural}", label_selector=limits.dra.pool_label)
            self.informers[kind] = Informer(api, opted, with_kind(kind), limits)

    def start(self) -> ClusterCache:
        self._first_lists_by = time.monotonic() + self.limits.read_timeout
        for informer in self.informers.values():
            informer.start()
        return self

    def stop(self) -> None:
        for informer in self.informers.values():
            informer.halt()
        for informer in self.informers.values():
            informer.stop()

    def items(self, kind: str) -> list[Any]:
        """The cached objects of `kind`; KubeError when the cache cannot be trusted."""
        informer = self.informers[kind]
        informer.tried.wait(max(0.0, self._first_lists_by - time.monotonic()))
        try:
            return informer.items()
        except CacheUnavailable as e:
            raise KubeError(f"watch cache: {e}") from None


class CachedClusterReader(ClusterReader):
    """`ClusterReader` answering from the watch cache instead of four lists a tick."""

    def __init__(self, api: client.ApiClient, config: Config, cache: ClusterCache):
        super().__init__(api, config)
        self.cache = cache

    def objects(self) -> ClusterObjects:
        nodes = tuple(parse_node(obj, self.config) for obj in self.cache.items("Node"))
        pods = []
        for pod in self.cache.items("Pod"):
            if isinstance(pod, Broken):
                raise ClusterStateError(pod.message)
            pods.append(pod)
        scale = self.cache.items("ScaledObject") + self.cache.items("HorizontalPodAutoscaler")
        scale_objects = parse_objects(scale, self.config).scale_objects
        slices, claims, classes, templates = (
            self.cache.items(k) if k in self.cache.informers else [] for k in (*DRA, *DRA_SHARING)
        )
        return with_dra(
            ClusterObjects(nodes, tuple(pods), scale_objects),
            slices,
            claims,
            self.config,
            classes + templates,
        )


class CachedPreemptionReader(PreemptionReader):
    """`PreemptionReader` with PriorityClasses, PDBs and the records from the cache."""

    def __init__(self, *args: Any, cache: ClusterCache, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.cache = cache

    def records_data(self) -> Mapping[str, str]:
        found = self.cache.items("records")
        return (found[0].get("data") or {}) if found else {}

    def listed(self, kind: str) -> list[Json]:
        return self.cache.items(kind)
