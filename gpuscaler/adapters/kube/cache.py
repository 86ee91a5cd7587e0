"""The cluster as a watch cache: every object a tick reads, listed once and then kept
current by watches (`informer.Informer`), so a tick reads memory instead of listing the
cluster (tens of MB a tick on a 10,000-GPU cluster).

What is watched, and how narrowly:
- Nodes, all of them (a pool's selector may be any label, and pools change on reload),
  each kept as only the fields `cluster.parse_node` reads (no images, no conditions);
- Pods, all of them: the API server has no field selector on resource requests (the
  pod fields it can select on are name, namespace, nodeName, restartPolicy,
  schedulerName, serviceAccountName, hostNetwork, phase, podIP(s) and nominatedNodeName:
  kubernetes pkg/registry/core/pod/strategy.go `ToSelectableFields`), so pods that
  request no `nvidia.com/gpu` are dropped as they arrive and only GPU pods are kept,
  already parsed;
- ScaledObjects (none while KEDA is not installed) and HPAs, all namespaces;
- PriorityClasses and PodDisruptionBudgets (preemption);
- the preemption records ConfigMap, by field selector `metadata.name` in gpuscaler's
  namespace (one object, and RBAC can name it).

A tick reads the cache through `CachedClusterReader` and `CachedPreemptionReader`, which
answer exactly what the listing readers answer (tests/adapters/test_watch_cache.py compares them on
the real API server). When a watch has been down longer than
`kubernetes.watch_stale_after`, reading fails like a failed list: every target is flagged
and nothing is decided on an old picture.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from gpuscaler.adapters.kube.api import KubeError
from gpuscaler.adapters.kube.floor_facts import floor_field, floor_managers
from gpuscaler.adapters.kube.informer import CacheUnavailable, Informer, Json, Resource
from gpuscaler.adapters.kube.objects import (
    GPU_RESOURCE,
    ClusterObjects,
    ClusterStateError,
    GpuPod,
    Node,
    parse_node,
    parse_objects,
    parse_pod,
)
from gpuscaler.adapters.kube.preemption_reader import PreemptionReader
from gpuscaler.adapters.kube.preemption_records import STATE_CONFIGMAP
from gpuscaler.adapters.kube.reader import ClusterReader
from gpuscaler.config import Config, KubernetesConfig

SCALE_KINDS = {
    "ScaledObject": "/apis/keda.sh/v1alpha1/scaledobjects",
    "HorizontalPodAutoscaler": "/apis/autoscaling/v2/horizontalpodautoscalers",
}


@dataclass(frozen=True)
class Broken:
    """An object that arrived but cannot be parsed: reading the cache fails with this
    message, as a list holding it would."""

    message: str


def node_fields(obj: Json) -> Json:
    """A Node as `parse_node` reads it: metadata without managedFields, taints, and the
    GPU capacity (a node's status also carries its images and conditions: most of it)."""
    meta = obj.get("metadata") or {}
    capacity = ((obj.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE)
    return {
        "kind": "Node",
        "metadata": {k: v for k, v in meta.items() if k != "managedFields"},
        "spec": {"taints": (obj.get("spec") or {}).get("taints")},
        "status": {"capacity": {GPU_RESOURCE: capacity} if capacity is not None else {}},
    }


def gpu_pod(obj: Json) -> GpuPod | Broken | None:
    """The pod parsed if it requests GPUs, None (not kept) if it does not."""
    try:
        return parse_pod(obj)
    except ClusterStateError as e:
        return Broken(str(e))


def with_kind(kind: str) -> Any:
    def keep(obj: Json) -> Json:
        meta = obj.get("metadata") or {}
        slim = {k: v for k, v in meta.items() if k != "managedFields"}
        if kind in SCALE_KINDS:  # who owns the floor field is read (GitOps refusals)
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
        """The first lists are waited for until then (one read timeout after start, for
        all kinds together), not a read timeout per kind."""

        def informer(resource: Resource, transform: Any) -> Informer:
            return Informer(
                api,
                resource,
                transform,
                watch_timeout=limits.watch_timeout,
                connect_timeout=limits.connect_timeout,
                read_timeout=limits.read_timeout,
                stale_after=limits.watch_stale_after,
            )

        self.informers: dict[str, Informer] = {
            "Node": informer(Resource("Node", "/api/v1/nodes"), node_fields),
            "Pod": informer(Resource("Pod", "/api/v1/pods"), gpu_pod),
            **{
                kind: informer(Resource(kind, path), with_kind(kind))
                for kind, path in SCALE_KINDS.items()
            },
            "PriorityClass": informer(
                Resource("PriorityClass", "/apis/scheduling.k8s.io/v1/priorityclasses"),
                with_kind("PriorityClass"),
            ),
            "PodDisruptionBudget": informer(
                Resource("PodDisruptionBudget", "/apis/policy/v1/poddisruptionbudgets"),
                with_kind("PodDisruptionBudget"),
            ),
            "records": informer(
                Resource(
                    "ConfigMap",
                    f"/api/v1/namespaces/{namespace}/configmaps",
                    field_selector=f"metadata.name={STATE_CONFIGMAP}",
                ),
                with_kind("ConfigMap"),
            ),
        }

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
        """The cached objects of `kind` (waiting for the first lists, at most one read
        timeout after start); KubeError when the cache cannot be trusted."""
        informer = self.informers[kind]
        informer.wait_tried(max(0.0, self._first_lists_by - time.monotonic()))
        try:
            return informer.items()
        except CacheUnavailable as e:
            raise KubeError(f"watch cache: {e}") from None

    @property
    def lists(self) -> int:
        return sum(i.lists for i in self.informers.values())


class CachedClusterReader(ClusterReader):
    """`ClusterReader` answering from the watch cache instead of four lists a tick."""

    def __init__(self, api: client.ApiClient, config: Config, cache: ClusterCache):
        super().__init__(api, config)
        self.cache = cache
        self._nodes: dict[tuple[str, str], tuple[Config, Node]] = {}
        """Parsed nodes by (name, resourceVersion), for the config they were parsed with."""

    def _node(self, obj: Json) -> Node:
        key = _version_key(obj)
        memo = self._nodes.get(key)
        if memo is None or memo[0] is not self.config:
            memo = (self.config, parse_node(obj, self.config))
            self._nodes[key] = memo
        return memo[1]

    def objects(self) -> ClusterObjects:
        raw_nodes = self.cache.items("Node")
        nodes = tuple(self._node(obj) for obj in raw_nodes)
        for key in self._nodes.keys() - {_version_key(obj) for obj in raw_nodes}:
            del self._nodes[key]  # deleted or changed since
        pods = []
        for pod in self.cache.items("Pod"):
            if isinstance(pod, Broken):
                raise ClusterStateError(pod.message)
            pods.append(pod)
        scale = self.cache.items("ScaledObject") + self.cache.items("HorizontalPodAutoscaler")
        scale_objects = parse_objects(scale, self.config).scale_objects
        return ClusterObjects(nodes, tuple(pods), scale_objects)


def _version_key(obj: Json) -> tuple[str, str]:
    meta = obj["metadata"]
    return str(meta.get("name")), str(meta.get("resourceVersion"))


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
