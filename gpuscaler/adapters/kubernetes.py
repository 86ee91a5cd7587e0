"""Kubernetes adapter (first part of issue 5): read replica floors, write them back.

Reads each configured workload's floor, ceiling and replicas from its KEDA ScaledObject
(`spec.minReplicaCount`, `spec.maxReplicaCount`, `status` of its HPA is not needed) or
HPA (`spec.minReplicas`, `spec.maxReplicas`, `status.currentReplicas`), and sets floors:

- only on objects that opt in (label `gpuscaler.io/enabled: "true"`);
- never on the HPA that KEDA owns (owner reference to a ScaledObject): patch the
  ScaledObject instead;
- never above the object's own maximum;
- idempotent: no write when the floor already has the value;
- optimistic concurrency: the patch carries the resourceVersion read; on 409 it re-reads
  and tries again, at most `MAX_CONFLICT_RETRIES` times;
- each change records an Event on the object with the reason and an annotation
  `gpuscaler.io/last-decision` with the decision as JSON, in the same patch as the floor,
  so the two never disagree.
API errors are translated once, here, into `KubeError`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.config import Config, WorkloadConfig
from gpuscaler.core.model import Decision

log = logging.getLogger("gpuscaler.kubernetes")

OPT_IN_LABEL = "gpuscaler.io/enabled"
LAST_DECISION = "gpuscaler.io/last-decision"
MAX_CONFLICT_RETRIES = 3
"""A 409 means someone else wrote between our read and patch; three fresh reads settle any
ordinary race without spinning."""
KEDA = ("keda.sh", "v1alpha1", "scaledobjects")


class KubeError(Exception):
    """A Kubernetes API call that failed; the message names the object and the status."""


@dataclass(frozen=True)
class WorkloadState:
    floor: int | None
    max_replicas: int | None
    replicas: int | None
    opted_in: bool
    resource_version: str


class KubeWorkloads:
    """Reads and sets replica floors of the configured workloads."""

    def __init__(self, api: client.ApiClient, config: Config, identity: str = "gpuscaler"):
        self.config = config
        self.custom = client.CustomObjectsApi(api)
        self.hpa = client.AutoscalingV2Api(api)
        self.events = client.EventsV1Api(api)
        self.identity = identity

    # ------------------------------------------------------------------ reading

    def _raw(self, w: WorkloadConfig) -> dict[str, Any]:
        try:
            if w.kind == "ScaledObject":
                obj = self.custom.get_namespaced_custom_object(
                    *KEDA[:2], w.namespace, KEDA[2], w.name
                )
                if not isinstance(obj, dict):
                    raise KubeError(f"read {w.key}: answer is not an object")
                return obj
            hpa = self.hpa.read_namespaced_horizontal_pod_autoscaler(w.name, w.namespace)
            out: dict[str, Any] = self.hpa.api_client.sanitize_for_serialization(hpa)
            return out
        except ApiException as e:
            raise KubeError(f"read {w.key}: HTTP {e.status} {e.reason}") from None

    def read(self, w: WorkloadConfig) -> WorkloadState:
        obj = self._raw(w)
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        opted = (meta.get("labels") or {}).get(OPT_IN_LABEL) == "true"
        if w.kind == "ScaledObject":
            # KEDA's defaults: minReplicaCount 0, maxReplicaCount 100.
            return WorkloadState(
                floor=int(spec.get("minReplicaCount", 0)),
                max_replicas=int(spec.get("maxReplicaCount", 100)),
                replicas=None,
                opted_in=opted,
                resource_version=str(meta.get("resourceVersion", "")),
            )
        owners = meta.get("ownerReferences") or []
        if any(o.get("kind") == "ScaledObject" for o in owners):
            opted = False  # KEDA owns this HPA: its ScaledObject is the thing to set
        status = obj.get("status") or {}
        return WorkloadState(
            floor=int(spec.get("minReplicas", 1)),  # the HPA's default minimum is 1
            max_replicas=int(spec["maxReplicas"]) if "maxReplicas" in spec else None,
            replicas=int(status["currentReplicas"]) if "currentReplicas" in status else None,
            opted_in=opted,
            resource_version=str(meta.get("resourceVersion", "")),
        )

    # ------------------------------------------------------------------ writing

    def _workload(self, key: str) -> WorkloadConfig:
        for w in self.config.workloads:
            if w.key == key:
                return w
        raise KubeError(f"{key} is not a configured workload")

    def _patch(self, w: WorkloadConfig, body: dict[str, Any]) -> None:
        if w.kind == "ScaledObject":
            self.custom.patch_namespaced_custom_object(
                *KEDA[:2], w.namespace, KEDA[2], w.name, body
            )
        else:
            self.hpa.patch_namespaced_horizontal_pod_autoscaler(w.name, w.namespace, body)

    def set_floor(self, decision: Decision) -> bool:
        """Set the floor `decision` asks for; True when the object now has it (written or
        already so), False when refused (not opted in, owned by KEDA). Raises KubeError."""
        w = self._workload(decision.target)
        field = "minReplicaCount" if w.kind == "ScaledObject" else "minReplicas"
        for _ in range(MAX_CONFLICT_RETRIES + 1):
            state = self.read(w)
            if not state.opted_in:
                log.info("not touching %s: not opted in (label %s=true)", w.key, OPT_IN_LABEL)
                return False
            want = int(decision.to_value)
            if state.max_replicas is not None:
                want = min(want, state.max_replicas)  # never above the object's own maximum
            if state.floor == want:
                return True  # idempotent: nothing to write
            body = {
                "metadata": {
                    "resourceVersion": state.resource_version,
                    "annotations": {LAST_DECISION: json.dumps(decision.as_record())},
                },
                "spec": {field: want},
            }
            try:
                self._patch(w, body)
            except ApiException as e:
                if e.status == 409:
                    continue  # someone wrote first: read again
                raise KubeError(f"patch {w.key}: HTTP {e.status} {e.reason}") from None
            self._event(w, decision, state.floor, want)
            return True
        raise KubeError(f"patch {w.key}: still conflicting after {MAX_CONFLICT_RETRIES} retries")

    def _event(self, w: WorkloadConfig, d: Decision, old: int | None, new: int) -> None:
        group, version = (
            (KEDA[0] + "/" + KEDA[1], w.kind)
            if w.kind == "ScaledObject"
            else (
                "autoscaling/v2",
                w.kind,
            )
        )
        event = client.EventsV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{w.name}.", namespace=w.namespace),
            event_time=datetime.now(UTC),
            reason="ReplicaFloorChanged",
            action="SetReplicaFloor",
            note=f"floor {old} -> {new}: {d.reason}"[:1024],
            type="Normal",
            reporting_controller="gpuscaler.io/controller",
            reporting_instance=self.identity,
            regarding=client.V1ObjectReference(
                api_version=group, kind=version, name=w.name, namespace=w.namespace
            ),
        )
        try:
            self.events.create_namespaced_event(w.namespace, event)
        except ApiException as e:  # the change is made; a lost Event is logged, not fatal
            log.warning("event for %s not recorded: HTTP %s", w.key, e.status)

    def apply(self, decisions: Sequence[Decision]) -> tuple[Decision, ...]:
        """Actuator: the replica floor decisions that took effect; others are left to the
        adapters that own them."""
        done = []
        for d in decisions:
            if d.kind != "replica_floor":
                continue
            try:
                if self.set_floor(d):
                    done.append(d)
            except KubeError as e:
                log.warning("replica floor of %s not set: %s", d.target, e)
        return tuple(done)
