"""Preemption against a real cluster: what the core needs to decide, and its steps done.

State: one ConfigMap (`gpuscaler-preemptions` in gpuscaler's namespace) holds every
victim's record (tier, beneficiary, node, GPUs, priority, reason, timestamps) as JSON
under the key `<namespace>.<pod>`. It outlives the victim pod, is written with its
resourceVersion BEFORE each step acts (write-ahead), and every write re-checks the stored
tier against the transition table, so a restart at any tier resumes and never repeats a
step, forgets a victim or evicts twice. The victim (`gpuscaler.io/preemption`,
`gpuscaler.io/checkpoint-requested`) and the beneficiary (`gpuscaler.io/preempting`)
carry annotations mirroring it, for whoever looks at the pods.

Steps:
- request_checkpoint: record soft, annotate the victim, Event, optional HTTP POST;
- evict: record hard (the evidence, written first), Event, then the Eviction API with
  gracePeriodSeconds (the API server itself sets the victim's DisruptionTarget condition,
  reason EvictionByEvictionAPI, overwriting any set before: kubernetes
  pkg/registry/core/pod/storage/eviction.go); a 429 (PDB) is recorded as an attempt and
  retried later by the core;
- force_delete / delete: delete the pod (grace 0 for a pod stuck Terminating);
- quarantine: taint and label the node so nothing lands on the held GPU, Warning Event;
- record_gone, abort, give_up, confirm_released: the record only.

GPU memory release (tier 3) is read from Prometheus: the GPUs (UUID) dcgm-exporter
attributed to the victim pod, then their frame buffer after it left.
"""

from __future__ import annotations

import json
import logging
import math
import re
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.adapters.cluster import (
    ClusterObjects,
    GpuPod,
    Node,
    parse_time,
    pool_nodes,
    rfc3339,
    schedulable_on,
)
from gpuscaler.adapters.kubernetes import (
    MAX_CONFLICT_RETRIES,
    ClusterReader,
    KubeError,
    Writer,
    _api_error,
    _json,
    _read,
)
from gpuscaler.adapters.prometheus import SourceError, Transport, escape_label_value
from gpuscaler.config import Config
from gpuscaler.core.model import Decision
from gpuscaler.core.node_agent import TOPOLOGY_ANNOTATION, gpus_per_numa_domain
from gpuscaler.core.preemption import (
    IN_FLIGHT,
    NodeView,
    PodView,
    PreemptionObservation,
    VictimState,
    check_transition,
)

log = logging.getLogger("gpuscaler.preemption")

STATE_CONFIGMAP = "gpuscaler-preemptions"
KEEP_FINISHED = 24 * 3600
"""Finished records are kept a day: evidence for operators, and the per-hour limit."""
CHECKPOINT_REQUESTED = "gpuscaler.io/checkpoint-requested"
CHECKPOINT_DONE = "gpuscaler.io/checkpoint-done"
LAST_CHECKPOINT = "gpuscaler.io/last-checkpoint"
PREEMPTIBLE = "gpuscaler.io/preemptible"
GPU_MEMORY = "gpuscaler.io/gpu-memory-gib"
VICTIM_ANNOTATION = "gpuscaler.io/preemption"
BENEFICIARY_ANNOTATION = "gpuscaler.io/preempting"
QUARANTINE_TAINT = "gpuscaler.io/gpu-memory-held"
NUMA_LABEL = "gpuscaler.io/gpus-per-numa-node"
AGENT_POD_GPU = "gpuscaler_agent_pod_gpu_device"
"""The node agent's pod-to-GPU mapping (kubelet pod-resources), for GPUs dcgm-exporter
cannot attribute to pods (MPS)."""
"""Set by whoever knows the node's topology (e.g. from `nvidia-smi topo -m`)."""


def _record_key(victim: str) -> str:
    return victim.replace("/", ".")


# --------------------------------------------------------------------------- reading


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
    )


def parse_record(key: str, raw: str) -> VictimState:
    try:
        return VictimState(**json.loads(raw))
    except (ValueError, TypeError) as e:
        raise KubeError(f"ConfigMap {STATE_CONFIGMAP} key {key}: unreadable record: {e}") from None


def parse_states(data: Mapping[str, str]) -> tuple[VictimState, ...]:
    return tuple(parse_record(key, raw) for key, raw in sorted(data.items()))


def read_records(core: client.CoreV1Api, namespace: str) -> dict[str, Any] | None:
    """The records ConfigMap as JSON, None while it does not exist (no preemption yet)."""
    try:
        return _json(
            core.read_namespaced_config_map(STATE_CONFIGMAP, namespace, _preload_content=False)
        )
    except ApiException as e:
        if e.status == 404:
            return None
        raise _api_error(f"read ConfigMap {namespace}/{STATE_CONFIGMAP}", e) from None


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

    # issue 18: the three reads a watch cache answers instead (adapters/kube/cache.py)
    def records_data(self) -> Mapping[str, str]:
        cm = read_records(self.core, self.namespace)
        return (cm or {}).get("data") or {}

    def listed(self, kind: str) -> list[dict[str, Any]]:
        answer: Any
        if kind == "PriorityClass":
            answer = self.scheduling.list_priority_class(_preload_content=False)
        else:
            answer = self.policy.list_pod_disruption_budget_for_all_namespaces(
                _preload_content=False
            )
        return _json(answer).get("items") or []

    def states(self) -> tuple[VictimState, ...]:
        return parse_states(self.records_data())

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
        return preemption_observation(
            objects,
            self.config,
            classes,
            pdbs,
            states,
            released,
        )


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
            numa = n.labels.get(NUMA_LABEL, "")
            domain = gpus_per_numa_domain(n.annotations.get(TOPOLOGY_ANNOTATION))  # the agent's
            if domain is None and numa.isdigit():
                domain = int(numa)
            nodes.append(
                NodeView(
                    n.name,
                    (n.gpu_count or 0) * per_gpu,
                    memory * (1 - reserve) / per_gpu,
                    domain * per_gpu if domain is not None else None,
                    pool.name,
                )
            )
    return PreemptionObservation(pods, tuple(nodes), states, released or {})


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


class GpuMemoryProbe:
    """Was a gone victim's GPU memory released? From dcgm-exporter series in Prometheus:
    the GPUs attributed to the pod while it ran, then their frame buffer since it left.
    True: some sample at or below `released_below_mib`, or another pod now uses the GPU;
    False: every sample above it, the GPU idle (util < 5 %) and no pod on it; None: not
    measurable (no per-pod attribution, no samples, Prometheus failing). Where
    dcgm-exporter has no per-pod series (MPS), the GPUs and the pods on them come from the
    node agent's `gpuscaler_agent_pod_gpu_device` instead."""

    def __init__(self, config: Config, transport: Transport):
        self.config = config
        self.transport = transport

    def _series(self, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        result = self.transport.query_range(query, start, end, step)
        return [r for r in result if isinstance(r, dict) and isinstance(r.get("values"), list)]

    def released(self, s: VictimState, now: float) -> bool | None:
        namespace, pod = s.victim.split("/", 1)
        gone = s.gone_at or s.since
        try:
            attributed = self._series(
                f"DCGM_FI_DEV_FB_USED{{namespace={escape_label_value(namespace)},"
                f"pod={escape_label_value(pod)}}}",
                s.requested_at - 60,
                gone,
                5.0,
            )
            uuids = sorted({r["metric"].get("UUID") for r in attributed} - {None})
            by_agent = not uuids  # MPS: no per-pod series; the node agent's mapping instead
            if by_agent:
                uuids = self._agent_gpus(namespace, pod, s.requested_at - 60, gone)
            if not uuids:
                return None
            match = "|".join(re.escape(u) for u in uuids)
            selector = f"UUID=~{escape_label_value(match)}"
            start = math.floor(gone)
            memory = self._series(f"DCGM_FI_DEV_FB_USED{{{selector}}}", start, now, 1.0)
            util = self._series(f"DCGM_FI_DEV_GPU_UTIL{{{selector}}}", start, now, 1.0)
            others = self._agent_pods(match, start, now) - {(namespace, pod)} if by_agent else set()
        except SourceError as e:
            log.warning("memory check of %s: %s", s.victim, e)
            return None
        if others or any(r["metric"].get("pod") not in (None, "", pod) for r in memory):
            return True  # another pod holds the GPU now: it is in use, not leaked
        values = [float(v) for r in memory for _, v in r["values"]]
        busy = [float(v) for r in util for _, v in r["values"]]
        if not values:
            return None
        if min(values) <= self.config.preemption.released_below_mib:
            return True
        if busy and max(busy) < 5:
            return False
        return None

    def _agent_gpus(self, namespace: str, pod: str, start: float, end: float) -> list[str]:
        """GPU UUIDs the kubelet allocated to the pod, from the node agent's
        `gpuscaler_agent_pod_gpu_device` (pod-resources API)."""
        series = self._series(
            f"{AGENT_POD_GPU}{{namespace={escape_label_value(namespace)},"
            f"pod={escape_label_value(pod)}}}",
            start,
            end,
            5.0,
        )
        return sorted({r["metric"].get("gpu") for r in series} - {None})

    def _agent_pods(self, uuid_match: str, start: float, end: float) -> set[tuple[str, str]]:
        """(namespace, pod) the agent saw holding these GPUs in the window."""
        series = self._series(
            f"{AGENT_POD_GPU}{{gpu=~{escape_label_value(uuid_match)}}}", start, end, 5.0
        )
        return {(r["metric"].get("namespace", ""), r["metric"].get("pod", "")) for r in series}


# --------------------------------------------------------------------------- acting


def _delete_options(uid: str, grace: int | None) -> client.V1DeleteOptions:
    """Delete options that only ever reach the victim itself: with its UID as a
    precondition the API server answers 409 for a same-name replacement."""
    preconditions = client.V1Preconditions(uid=uid) if uid else None
    return client.V1DeleteOptions(grace_period_seconds=grace, preconditions=preconditions)


class KubePreemption:
    """Carries out the core's preemption steps; see the module docstring."""

    def __init__(self, api: client.ApiClient, config: Config, writer: Writer, namespace: str):
        self.config = config
        self.core = client.CoreV1Api(api)
        self.writer = writer
        self.namespace = namespace

    # ------------------------------------------------------------------ records

    def _write_state(self, new: VictimState, expect: str | None) -> VictimState:
        """Store `new` after checking the stored tier allows it (`expect` is the tier the
        decision was made from); creates the ConfigMap on first use."""
        for _ in range(MAX_CONFLICT_RETRIES + 1):
            cm = read_records(self.core, self.namespace)
            data = (cm or {}).get("data") or {}
            key = _record_key(new.victim)
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
            body: dict[str, Any] = {"data": {_record_key(new.victim): json.dumps(asdict(new))}}
            for other, raw in data.items():  # prune finished records older than a day
                old = parse_record(other, raw)
                if old.tier not in IN_FLIGHT and new.since - old.since > KEEP_FINISHED:
                    body["data"][other] = None
            self.writer.gate(f"preemption record of {new.victim}")
            try:
                if cm is None:
                    body["data"] = {k: v for k, v in body["data"].items() if v is not None}
                    self.core.create_namespaced_config_map(
                        self.namespace,
                        client.V1ConfigMap(
                            metadata=client.V1ObjectMeta(
                                name=STATE_CONFIGMAP, namespace=self.namespace
                            ),
                            data=body["data"],
                        ),
                        _preload_content=False,
                    )
                else:
                    body["metadata"] = {"resourceVersion": cm["metadata"]["resourceVersion"]}
                    self.core.patch_namespaced_config_map(
                        STATE_CONFIGMAP, self.namespace, body, _preload_content=False
                    )
                return new
            except ApiException as e:
                if e.status == 409:
                    continue
                raise _api_error(f"write ConfigMap {STATE_CONFIGMAP}", e) from None
        raise KubeError(f"ConfigMap {STATE_CONFIGMAP}: still conflicting")

    def _stored(self, victim: str) -> VictimState:
        key = _record_key(victim)
        raw = ((read_records(self.core, self.namespace) or {}).get("data") or {}).get(key)
        if raw is None:
            raise KubeError(f"{victim}: no preemption record")
        return parse_record(key, raw)

    # ------------------------------------------------------------------ pods

    def _pod_ref(self, key: str) -> client.V1ObjectReference:
        ns, name = key.split("/", 1)
        return client.V1ObjectReference(api_version="v1", kind="Pod", name=name, namespace=ns)

    def _annotate(self, key: str, annotations: dict[str, str | None]) -> None:
        ns, name = key.split("/", 1)
        self.writer.gate(f"annotate pod {key}")
        try:
            self.core.patch_namespaced_pod(
                name, ns, {"metadata": {"annotations": annotations}}, _preload_content=False
            )
        except ApiException as e:
            if e.status != 404:  # a pod already gone needs no annotation
                raise _api_error(f"annotate pod {key}", e) from None

    def _event(self, key: str, reason: str, note: str, type_: str = "Normal") -> None:
        self.writer.event(self._pod_ref(key), key.split("/", 1)[0], reason, "Preempt", note, type_)

    def _ask_checkpoint(self, key: str, s: VictimState) -> None:
        endpoint = self.config.preemption.checkpoint_endpoint
        if not endpoint:
            return
        ns, name = key.split("/", 1)
        try:
            pod = _json(self.core.read_namespaced_pod(name, ns, _preload_content=False))
            ip = (pod.get("status") or {}).get("podIP")
            if not ip:
                return
            body = json.dumps(
                {
                    "reason": s.reason,
                    "deadline": rfc3339(s.since + self.config.preemption.soft_grace),
                }
            )
            request = urllib.request.Request(
                endpoint.format(pod_ip=ip),
                data=body.encode(),
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=2) as answer:
                answer.read(1024)
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
            raise _api_error(f"evict {s.victim}", e) from None
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
                raise _api_error(f"delete {s.victim}", e) from None

    def _quarantine(self, s: VictimState) -> None:
        node = _read(
            f"read node {s.node}", lambda: self.core.read_node(s.node, _preload_content=False)
        )
        meta = node.get("metadata") or {}
        if (meta.get("labels") or {}).get("gpuscaler.io/enabled") != "true":
            self.writer.event(
                client.V1ObjectReference(api_version="v1", kind="Node", name=s.node),
                self.config.kubernetes.events_namespace,
                "GPUMemoryHeld",
                "Quarantine",
                f"GPU memory held after {s.victim} left; node not opted in, not tainted",
                "Warning",
            )
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
            raise _api_error(f"taint node {s.node}", e) from None
        self.writer.event(
            client.V1ObjectReference(api_version="v1", kind="Node", name=s.node),
            self.config.kubernetes.events_namespace,
            "GPUMemoryHeld",
            "Quarantine",
            f"GPU memory still held after {s.victim} left: tainted {QUARANTINE_TAINT} until "
            "a node-side cleanup removes the taint",
            "Warning",
        )

    # ------------------------------------------------------------------ steps

    def apply_one(self, d: Decision) -> bool:
        detail = dict(d.detail or {})
        action = str(detail.get("action"))
        now = d.time
        if action == "request_checkpoint":
            s = VictimState(
                victim=d.target,
                beneficiary=str(detail["beneficiary"]),
                node=str(detail["node"]),
                gpus=int(detail.get("gpus") or 0),
                priority=int(detail.get("priority") or 0),
                uid=str(detail.get("uid") or ""),
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
        s = self._stored(d.target)
        if s.tier != d.from_value:
            raise KubeError(
                f"{d.target}: stored tier is {s.tier}, the decision was made from "
                f"{d.from_value}; not repeated"
            )
        to = str(d.to_value)
        if action == "evict" and s.evicted_at is not None:
            raise KubeError(f"{d.target}: evicted already at {rfc3339(s.evicted_at)}; never twice")
        if action == "evict":
            grace = float(
                detail.get("grace_seconds") or self.config.preemption.eviction_grace_period
            )
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
        if action in ("force_delete", "delete"):
            self._write_state(replace(s, evicted_at=s.evicted_at or now, reason=d.reason), "hard")
            self._delete(s, 0 if action == "force_delete" else None)
            self._event(d.target, "PreemptionDeleted", d.reason, "Warning")
            return True
        if action == "quarantine":
            self._write_state(replace(s, tier=to, since=now, reason=d.reason), s.tier)
            self._quarantine(s)
            return True
        extra = {"gone_at": now} if action == "record_gone" else {}
        self._write_state(replace(s, tier=to, since=now, reason=d.reason, **extra), s.tier)  # type: ignore[arg-type]
        if action == "abort":
            self._annotate(
                d.target,
                {
                    CHECKPOINT_REQUESTED: None,
                    VICTIM_ANNOTATION: json.dumps({"tier": "aborted", "for": s.beneficiary}),
                },
            )
        return True
