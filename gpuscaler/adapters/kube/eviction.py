"""Preemption steps carried out on a real cluster, each recorded before it acts:
- request_checkpoint: record soft, annotate the victim, Event, optional HTTP POST;
- evict: record hard (the evidence first), Event, then the Eviction API (which sets the
  victim's DisruptionTarget condition); a 429 (PDB) is recorded as an attempt;
- force_delete / delete: delete the pod (grace 0 for a pod stuck Terminating);
- quarantine: taint and label the node so nothing lands on the held GPU, Warning Event;
- record_gone, abort, give_up, confirm_released: the record only.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, replace
from functools import partial
from typing import Any

import requests
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.adapters.kube.api import KubeError, api_error, json_body, read_json, written
from gpuscaler.adapters.kube.objects import rfc3339
from gpuscaler.adapters.kube.preemption_records import (
    BENEFICIARY_ANNOTATION,
    CHECKPOINT_REQUESTED,
    KEEP_FINISHED,
    QUARANTINE_TAINT,
    STATE_CONFIGMAP,
    VICTIM_ANNOTATION,
    parse_record,
    read_records,
    record_key,
)
from gpuscaler.adapters.kube.writer import MAX_CONFLICT_RETRIES, Writer
from gpuscaler.config import Config
from gpuscaler.core.decisions import CheckpointRequest, Eviction, PreemptionStep
from gpuscaler.core.preemption import IN_FLIGHT, VictimState, check_transition

log = logging.getLogger("gpuscaler.preemption")


def _delete_options(uid: str, grace: int | None) -> client.V1DeleteOptions:
    """With the victim's UID as a precondition: a same-name replacement answers 409."""
    preconditions = client.V1Preconditions(uid=uid) if uid else None
    return client.V1DeleteOptions(grace_period_seconds=grace, preconditions=preconditions)


class KubePreemption:
    def __init__(self, api: client.ApiClient, config: Config, writer: Writer, namespace: str):
        self.config = config
        self.core = client.CoreV1Api(api)
        self.writer = writer
        self.namespace = namespace

    def _write_state(self, new: VictimState, expect: str | None) -> VictimState:
        """Store `new` if the stored tier is `expect` (the decision's) and allows it."""
        for _ in range(MAX_CONFLICT_RETRIES + 1):
            cm = read_records(self.core, self.namespace)
            data = (cm or {}).get("data") or {}
            key = record_key(new.victim)
            current = parse_record(key, data[key]) if key in data else None
            tier = current.tier if current is not None else "none"
            if current is not None and current.tier not in IN_FLIGHT and expect == "none":
                tier = "none"  # a finished record: this victim may be chosen again
            if tier != expect:
                raise KubeError(
                    f"{new.victim}: stored tier is {tier}, the decision was made from {expect}; "
                    "not repeated"
                )
            check_transition(tier, new.tier)
            body: dict[str, Any] = {"data": {record_key(new.victim): json.dumps(asdict(new))}}
            for other, raw in data.items():  # prune finished records older than a day
                old = parse_record(other, raw)
                if old.tier not in IN_FLIGHT and new.since - old.since > KEEP_FINISHED:
                    body["data"][other] = None
            self.writer.gate(f"preemption record of {new.victim}")
            if cm is None:  # the first record: nothing to prune
                meta = client.V1ObjectMeta(name=STATE_CONFIGMAP, namespace=self.namespace)
                created = client.V1ConfigMap(metadata=meta, data=body["data"])
                write = partial(self.core.create_namespaced_config_map, self.namespace, created)
            else:
                body["metadata"] = {"resourceVersion": cm["metadata"]["resourceVersion"]}
                write = partial(
                    self.core.patch_namespaced_config_map, STATE_CONFIGMAP, self.namespace, body
                )
            if written(
                f"write ConfigMap {STATE_CONFIGMAP}", partial(write, _preload_content=False)
            ):
                return new
        raise KubeError(f"ConfigMap {STATE_CONFIGMAP}: still conflicting")

    def _stored(self, victim: str) -> VictimState:
        key = record_key(victim)
        raw = ((read_records(self.core, self.namespace) or {}).get("data") or {}).get(key)
        if raw is None:
            raise KubeError(f"{victim}: no preemption record")
        return parse_record(key, raw)

    def _annotate(self, key: str, annotations: dict[str, str | None]) -> None:
        ns, name = key.split("/", 1)
        self.writer.gate(f"annotate pod {key}")
        try:
            self.core.patch_namespaced_pod(
                name, ns, {"metadata": {"annotations": annotations}}, _preload_content=False
            )
        except ApiException as e:
            if e.status != 404:  # a pod already gone needs no annotation
                raise api_error(f"annotate pod {key}", e) from None

    def _event(self, key: str, reason: str, note: str, type_: str = "Normal") -> None:
        ns, name = key.split("/", 1)
        pod = client.V1ObjectReference(api_version="v1", kind="Pod", name=name, namespace=ns)
        self.writer.event(pod, ns, reason, "Preempt", note, type_)

    def _ask_checkpoint(self, key: str, s: VictimState) -> None:
        endpoint = self.config.preemption.checkpoint_endpoint
        if not endpoint:
            return
        ns, name = key.split("/", 1)
        try:
            pod = json_body(self.core.read_namespaced_pod(name, ns, _preload_content=False))
            ip = (pod.get("status") or {}).get("podIP")
            if not ip:
                return
            deadline = rfc3339(s.since + self.config.preemption.soft_grace)
            body = {"reason": s.reason, "deadline": deadline}
            requests.post(endpoint.format(pod_ip=ip), json=body, timeout=2).raise_for_status()
        except (OSError, ApiException, ValueError) as e:  # the annotation is the contract
            log.info("checkpoint endpoint of %s not reached: %s", key, e)

    def _evict(self, s: VictimState, grace: float) -> bool:
        """True when the eviction was accepted, False when a PDB refused it (429)."""
        ns, name = s.victim.split("/", 1)
        self.writer.gate(f"evict {s.victim}")
        eviction = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=name, namespace=ns),
            delete_options=_delete_options(s.uid, int(grace)),
        )
        try:
            self.core.create_namespaced_pod_eviction(name, ns, eviction, _preload_content=False)
        except ApiException as e:
            if e.status == 429:
                return False
            if e.status == 404 or (e.status == 409 and s.uid):
                return True  # gone, or a new pod under its name (the uid precondition)
            raise api_error(f"evict {s.victim}", e) from None
        return True

    def _delete(self, s: VictimState, grace: int | None) -> None:
        ns, name = s.victim.split("/", 1)
        self.writer.gate(f"delete {s.victim}")
        try:
            self.core.delete_namespaced_pod(
                name, ns, body=_delete_options(s.uid, grace), _preload_content=False
            )
        except ApiException as e:
            if e.status == 409 and s.uid:
                return  # a new pod under the victim's name: not ours to delete
            if e.status != 404:
                raise api_error(f"delete {s.victim}", e) from None

    def _quarantine(self, s: VictimState) -> None:
        node = read_json(
            f"read node {s.node}", lambda: self.core.read_node(s.node, _preload_content=False)
        )
        meta = node.get("metadata") or {}
        ref = client.V1ObjectReference(api_version="v1", kind="Node", name=s.node)
        ns = self.config.kubernetes.events_namespace
        if (meta.get("labels") or {}).get("gpuscaler.io/enabled") != "true":
            note = f"GPU memory held after {s.victim} left; node not opted in, not tainted"
            self.writer.event(ref, ns, "GPUMemoryHeld", "Quarantine", note, "Warning")
            return
        taints = list((node.get("spec") or {}).get("taints") or [])
        if not any(t.get("key") == QUARANTINE_TAINT for t in taints):
            taints.append({"key": QUARANTINE_TAINT, "value": "true", "effect": "NoSchedule"})
        self.writer.gate(f"taint node {s.node}")
        try:
            self.core.patch_node(
                s.node,
                {
                    "metadata": {
                        "resourceVersion": meta.get("resourceVersion"),
                        "labels": {"gpuscaler.io/gpu-cleanup": "required"},
                    },
                    "spec": {"taints": taints},
                },
                _preload_content=False,
            )
        except ApiException as e:
            raise api_error(f"taint node {s.node}", e) from None
        note = (
            f"GPU memory still held after {s.victim} left: tainted {QUARANTINE_TAINT} until "
            "a node-side cleanup removes the taint"
        )
        self.writer.event(ref, ns, "GPUMemoryHeld", "Quarantine", note, "Warning")

    def apply_one(self, d: PreemptionStep) -> bool:
        """Carry out one step, its record written first; KubeError when the stored record
        is not at the tier the step was decided from."""
        if isinstance(d, CheckpointRequest):
            return self._start(d)
        s = self._stored(d.target)
        if s.tier != d.from_value:
            raise KubeError(
                f"{d.target}: stored tier is {s.tier}, the decision was made from "
                f"{d.from_value}; not repeated"
            )
        now = d.time
        match d:
            case Eviction():
                return self._evict_step(d, s)
            case PreemptionStep(action="force_delete" | "delete"):
                self._write_state(
                    replace(s, evicted_at=s.evicted_at or now, reason=d.reason), "hard"
                )
                self._delete(s, 0 if d.action == "force_delete" else None)
                self._event(d.target, "PreemptionDeleted", d.reason, "Warning")
                return True
            case PreemptionStep(action="quarantine"):
                self._write_state(replace(s, tier=d.to_value, since=now, reason=d.reason), s.tier)
                self._quarantine(s)
                return True
        new = replace(s, tier=d.to_value, since=now, reason=d.reason)
        if d.action == "record_gone":
            new = replace(new, gone_at=now)
        self._write_state(new, s.tier)
        if d.action == "abort":
            self._annotate(
                d.target,
                {
                    CHECKPOINT_REQUESTED: None,
                    VICTIM_ANNOTATION: json.dumps({"tier": "aborted", "for": s.beneficiary}),
                },
            )
        return True

    def _start(self, d: CheckpointRequest) -> bool:
        """The soft tier: record, annotate victim and beneficiary, Event, ask to checkpoint."""
        now = d.time
        s = VictimState(
            victim=d.target,
            beneficiary=d.beneficiary,
            node=d.node,
            gpus=d.gpus,
            priority=d.priority,
            uid=d.uid,
            tier="soft",
            since=now,
            requested_at=now,
            reason=d.reason,
        )
        self._write_state(s, "none")
        self._annotate(
            d.target,
            {
                CHECKPOINT_REQUESTED: rfc3339(now),
                VICTIM_ANNOTATION: json.dumps({"tier": "soft", "for": s.beneficiary}),
            },
        )
        self._annotate(
            s.beneficiary,
            {BENEFICIARY_ANNOTATION: json.dumps({"victim": d.target, "since": rfc3339(now)})},
        )
        self._event(d.target, "PreemptionRequested", f"checkpoint requested: {d.reason}")
        self._ask_checkpoint(d.target, s)
        return True

    def _evict_step(self, d: Eviction, s: VictimState) -> bool:
        """The hard tier: the evidence recorded first, then the Eviction API; a refusal (a
        PodDisruptionBudget) is recorded as an attempt, for the core to retry."""
        now = d.time
        if s.evicted_at is not None:
            raise KubeError(f"{d.target}: evicted already at {rfc3339(s.evicted_at)}; never twice")
        grace = d.grace_seconds or self.config.preemption.eviction_grace_period
        if s.tier == "soft":  # the evidence, before anything is done to the pod
            s = self._write_state(replace(s, tier="hard", since=now, reason=d.reason), "soft")
            self._event(
                d.target,
                "Preempting",
                f"evicting for {s.beneficiary} on node {s.node} ({s.gpus} GPU share(s), "
                f"priority {s.priority}): {d.reason}",
                "Warning",
            )
        accepted = self._evict(s, grace)
        self._write_state(
            replace(
                s,
                attempts=s.attempts + 1,
                last_attempt_at=now,
                evicted_at=now if accepted else None,
            ),
            "hard",
        )
        if not accepted:
            log.info("eviction of %s refused by a PodDisruptionBudget", d.target)
        return True
