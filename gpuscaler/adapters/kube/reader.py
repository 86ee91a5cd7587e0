"""Reading the cluster: nodes, pods, ScaledObjects and HPAs as JSON, parsed by `objects`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.adapters.kube.api import KubeError, api_error, json_body
from gpuscaler.adapters.kube.cluster import current_state, unavailable_state
from gpuscaler.adapters.kube.objects import (
    ClusterObjects,
    ClusterStateError,
    CurrentState,
    parse_objects,
)
from gpuscaler.adapters.kube.workloads import SCALE_APIS
from gpuscaler.config import Config

log = logging.getLogger("gpuscaler.kubernetes")

DRA = {
    "ResourceSlice": ("resource.k8s.io", "v1", "resourceslices"),
    "ResourceClaim": ("resource.k8s.io", "v1", "resourceclaims"),
}
DRA_SHARING = {
    "DeviceClass": ("resource.k8s.io", "v1", "deviceclasses"),
    "ResourceClaimTemplate": ("resource.k8s.io", "v1", "resourceclaimtemplates"),
}
"""Read only when labelled `kubernetes.dra.pool_label`: those opted in to a pool's sharing."""


class ClusterReader:
    def __init__(self, api: client.ApiClient, config: Config):
        self.config = config
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.healthy = True
        self.last_objects: ClusterObjects | None = None
        self._prefetched: ClusterObjects | None = None

    def reconfigure(self, config: Config) -> None:
        self.config = config

    def _items(self, kind: str, fetch: Callable[[], Any]) -> list[dict[str, Any]]:
        try:
            answer = fetch()
        except ApiException as e:
            if kind in ("ScaledObject", *DRA, *DRA_SHARING) and e.status == 404:
                return []  # KEDA is not installed: HPAs only; DRA not served: no DRA GPUs
            raise api_error(f"list {kind}", e) from None
        items = json_body(answer).get("items") or []
        return [{**item, "kind": kind} for item in items]  # list items carry no kind

    def objects(self) -> ClusterObjects:
        lists: dict[str, Callable[[], Any]] = {
            "Node": partial(self.core.list_node, _preload_content=False),
            "Pod": partial(self.core.list_pod_for_all_namespaces, _preload_content=False),
            **{
                kind: partial(self.custom.list_cluster_custom_object, *api)
                for kind, api in SCALE_APIS.items()
            },
        }
        if self.config.kubernetes.dra.enabled:
            lists |= {
                kind: partial(self.custom.list_cluster_custom_object, *DRA[kind]) for kind in DRA
            }
            label = self.config.kubernetes.dra.pool_label
            lists |= {
                kind: partial(self.custom.list_cluster_custom_object, *api, label_selector=label)
                for kind, api in DRA_SHARING.items()
            }
        items = [item for kind, call in lists.items() for item in self._items(kind, call)]
        return parse_objects(items, self.config)

    def prefetch(self) -> ClusterObjects | None:
        """Read the objects first in a tick (discovery needs them), for the next `state()`;
        None when the cluster cannot be read now (`state()` then says why)."""
        try:
            self._prefetched = self.objects()
        except (KubeError, ClusterStateError, ValueError):
            self._prefetched = None
        return self._prefetched

    def drop_prefetched(self) -> None:
        self._prefetched = None

    def state(self) -> CurrentState:
        """The current state; on any failure every target is flagged (no action)."""
        try:
            objects, self._prefetched = self._prefetched or self.objects(), None
            state = current_state(objects, self.config)
        except (KubeError, ClusterStateError, ValueError) as e:
            self.healthy = False
            log.warning(
                "kubernetes: cannot read cluster state: %s",
                e,
                extra={"event": "source_unhealthy", "source": "kubernetes"},
            )
            return unavailable_state(self.config, f"cannot read cluster state: {e}")
        self.healthy, self.last_objects = True, objects
        return state
