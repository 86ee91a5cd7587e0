"""The Kubernetes calls of the scheduler extender: nodes (topology annotation, NUMA label,
pool), the GPU scheduler's pods (their reservation annotations), pod annotation patches
guarded by UID, and the Binding. Every call has a timeout; answers are read as raw JSON
(the official client cannot deserialize the Status a Binding create returns)."""

from __future__ import annotations

import logging
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.adapters.kube.api import KubeError, json_body
from gpuscaler.adapters.kube.cluster import in_pool
from gpuscaler.adapters.kube.objects import parse_time
from gpuscaler.config import Config
from gpuscaler.core.gpufit import (
    ASSUME_TIME_ANNOTATION,
    GPUS_PER_NUMA_LABEL,
    TOPOLOGY_ANNOTATION,
    NodeMeta,
    PodRecord,
)

log = logging.getLogger("gpuscaler.extender")

TIMEOUT = 10.0
"""Seconds for any one API call: a bind waits on it, and kube-scheduler's own extender
HTTP timeout defaults to 5 s per verb (httpTimeout), so a stuck call must end."""


def pod_record(obj: dict[str, Any]) -> PodRecord:
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = obj.get("spec") or {}
    return PodRecord(
        uid=meta.get("uid", ""),
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        phase=(obj.get("status") or {}).get("phase", ""),
        annotations=annotations,
        assumed_at=parse_time(annotations.get(ASSUME_TIME_ANNOTATION)),
        scheduler_name=spec.get("schedulerName", ""),
        node_name=spec.get("nodeName", ""),
    )


class SchedulingKube:
    def __init__(self, api: client.ApiClient, config: Config):
        self.core = client.CoreV1Api(api)
        self.config = config

    def _call(self, action: str, call: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return json_body(call(_preload_content=False, _request_timeout=TIMEOUT, **kwargs))
        except ApiException as e:
            raise KubeError(f"{action}: HTTP {e.status} {e.reason}") from None
        except (OSError, ValueError) as e:
            raise KubeError(f"{action}: {type(e).__name__}: {e}") from None

    def _pool(self, labels: dict[str, str]) -> str | None:
        return next((p.name for p in self.config.node_pools if in_pool(p, labels)), None)

    def nodes(self) -> dict[str, NodeMeta]:
        listing = self._call("list nodes", self.core.list_node)
        out = {}
        for item in listing.get("items", []):
            meta = item.get("metadata") or {}
            labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
            name = meta.get("name", "")
            out[name] = NodeMeta(
                name,
                annotations.get(TOPOLOGY_ANNOTATION),
                labels.get(GPUS_PER_NUMA_LABEL),
                self._pool(labels),
            )
        return out

    def pods(self) -> list[PodRecord]:
        selector = f"spec.schedulerName={self.config.scheduler.scheduler_name}"
        listing = self._call(
            "list pods", self.core.list_pod_for_all_namespaces, field_selector=selector
        )
        return [pod_record(item) for item in listing.get("items", [])]

    def get_pod(self, namespace: str, name: str) -> PodRecord:
        action = f"read pod {namespace}/{name}"
        return pod_record(
            self._call(action, self.core.read_namespaced_pod, name=name, namespace=namespace)
        )

    def annotate(self, namespace: str, name: str, uid: str, values: dict[str, str | None]) -> None:
        # metadata.uid in the patch: the API server refuses it if the pod was replaced
        body = {"metadata": {"uid": uid, "annotations": values}}
        self._call(
            f"annotate pod {namespace}/{name}",
            self.core.patch_namespaced_pod,
            name=name,
            namespace=namespace,
            body=body,
        )

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self._call(
            f"bind pod {namespace}/{name} to {node}",
            self.core.create_namespaced_pod_binding,  # pods/NAME/binding, as kube-scheduler
            name=name,
            namespace=namespace,
            body=binding,
        )
