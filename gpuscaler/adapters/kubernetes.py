"""Kubernetes adapter: read the cluster, and carry out decisions on it.

Objects travel as JSON (`_preload_content=False`): the client's models reject objects
with fields they do not expect to be empty, and gpuscaler reads only a few fields.

Reading: nodes, pods, KEDA ScaledObjects and HPAs as JSON, parsed by
`gpuscaler.adapters.cluster` (the same rules as `once --cluster-snapshot FILE`).

Writing, for every actuator:
- only objects labelled `gpuscaler.io/enabled: "true"` (never the HPA that KEDA owns:
  its ScaledObject is patched instead);
- idempotent: nothing is written when the object already has the value;
- optimistic concurrency: each patch carries the resourceVersion read; on 409 it re-reads
  and tries again, at most `MAX_CONFLICT_RETRIES` times;
- the value and the annotation with the decision travel in one patch, so they never
  disagree, and an Event with the reason is recorded on the object;
- every write spends from one `WriteBudget` (writes per minute) and asks `may_act` first,
  so a replica that lost its lease stops between two writes.

Actuators:
- replica floor: ScaledObject `spec.minReplicaCount` or HPA `spec.minReplicas`, never
  above the object's own maximum;
- fragments per GPU of a node pool: make sure the named sharing config exists in the
  device-plugin ConfigMap, then relabel `nvidia.com/device-plugin.config` on a few nodes
  per tick; a node whose pods hold more shares than the new count allows is left alone
  (that needs preemption first); later ticks finish the rollout;
- time slice level of a node pool: the node label a node-side agent reads, rolled out the
  same way.
API errors are translated once, here, into `KubeError`.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.adapters.cluster import (
    LAST_DECISION,
    NODE_DECISION,
    OPT_IN_LABEL,
    PLUGIN_CONFIG_LABEL,
    ClusterObjects,
    ClusterStateError,
    CurrentState,
    Node,
    ScaleObject,
    current_state,
    parse_objects,
    parse_scale_object,
    parse_time,
    pool_nodes,
    rfc3339,
    shares_held,
    sharing_config_name,
    unavailable_state,
)
from gpuscaler.adapters.kube.api import NO_ANSWER
from gpuscaler.adapters.kube.floor_guard import FloorGuard
from gpuscaler.config import Config, NodePoolConfig, WorkloadConfig
from gpuscaler.core.model import Decision
from gpuscaler.errors import OutsideError

if TYPE_CHECKING:  # the preemption adapter builds on this module
    pass

log = logging.getLogger("gpuscaler.kubernetes")

MAX_CONFLICT_RETRIES = 3
"""A 409 means someone else wrote between our read and patch; three fresh reads settle any
ordinary race without spinning."""
KEDA = ("keda.sh", "v1alpha1", "scaledobjects")
REPORTING_CONTROLLER = "gpuscaler.io/controller"


class KubeError(OutsideError):
    """A Kubernetes API call that failed or was refused; the message names the object."""


class ConfigNotReady(KubeError):
    """A sharing config just added, not yet safe to name on a node: try again later."""


CONFIG_ADDED = "gpuscaler.io/config-added-"
"""Annotation on the device-plugin ConfigMap, per config gpuscaler added: when."""


def _api_error(action: str, e: ApiException) -> KubeError:
    """The server's own message rides along for refusals and invalid objects: a 403 names
    the user, verb and resource RBAC lacks, a 422 the field the schema refused. A call that
    got no answer (status 0) says what happened on the wire instead."""
    if e.status == NO_ANSWER:
        return KubeError(f"{action}: {e.reason}")
    message = f"{action}: HTTP {e.status} {e.reason}"
    if e.status in (403, 422):
        try:
            detail = json.loads(e.body or "{}").get("message")
        except (ValueError, AttributeError):
            detail = None
        if isinstance(detail, str) and detail:
            message += f": {detail[:300]}"
    return KubeError(message)


def _json(response: Any) -> dict[str, Any]:
    data = response if isinstance(response, dict) else json.loads(response.data)
    if not isinstance(data, dict):
        raise KubeError("answer is not a JSON object")
    return data


def _read(action: str, call: Callable[[], Any]) -> dict[str, Any]:
    """One object, as JSON; API errors become KubeError naming `action`."""
    try:
        return _json(call())
    except ApiException as e:
        raise _api_error(action, e) from None


# --------------------------------------------------------------------------- reading


class ClusterReader:
    """Reads nodes, pods, ScaledObjects and HPAs, as JSON (no model conversion)."""

    def __init__(self, api: client.ApiClient, config: Config):
        self.config = config
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.hpa = client.AutoscalingV2Api(api)
        self.healthy = True
        self.last_error: str | None = None
        self.last_objects: ClusterObjects | None = None
        """What the last successful read saw (for workload discovery)."""

    def reconfigure(self, config: Config) -> None:
        self.config = config

    def _items(self, kind: str, fetch: Callable[[], Any]) -> list[dict[str, Any]]:
        try:
            answer = fetch()
        except ApiException as e:
            if kind == "ScaledObject" and e.status == 404:
                return []  # KEDA is not installed: HPAs only
            raise _api_error(f"list {kind}", e) from None
        doc = _json(answer)
        items = doc.get("items") or []
        return [{**item, "kind": kind} for item in items]  # list items carry no kind

    def objects(self) -> ClusterObjects:
        items = self._items("Node", lambda: self.core.list_node(_preload_content=False))
        items += self._items(
            "Pod", lambda: self.core.list_pod_for_all_namespaces(_preload_content=False)
        )
        items += self._items(
            "ScaledObject",
            lambda: self.custom.list_cluster_custom_object(*KEDA),
        )
        items += self._items(
            "HorizontalPodAutoscaler",
            lambda: self.hpa.list_horizontal_pod_autoscaler_for_all_namespaces(
                _preload_content=False
            ),
        )
        return parse_objects(items, self.config)

    def state(self) -> CurrentState:
        """The current state; on any failure every target is flagged (no action)."""
        try:
            objects = self.objects()
            state = current_state(objects, self.config)
        except (KubeError, ClusterStateError, ValueError) as e:
            self.healthy, self.last_error = False, str(e)
            log.warning(
                "kubernetes: cannot read cluster state: %s",
                e,
                extra={"event": "source_unhealthy", "source": "kubernetes"},
            )
            return unavailable_state(self.config, f"cannot read cluster state: {e}")
        self.healthy, self.last_error, self.last_objects = True, None, objects
        return state


# --------------------------------------------------------------------------- writing


class WriteBudget:
    """At most `per_minute` writes in any 60 s; `take` says whether one more may go."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic):
        self.per_minute = per_minute
        self.clock = clock
        self._times: deque[float] = deque()

    def take(self) -> bool:
        now = self.clock()
        while self._times and now - self._times[0] >= 60:
            self._times.popleft()
        if len(self._times) >= self.per_minute:
            return False
        self._times.append(now)
        return True


class Writer:
    """What every actuator shares: the write gate (leadership and budget) and Events."""

    def __init__(
        self,
        api: client.ApiClient,
        config: Config,
        identity: str,
        budget: WriteBudget | None = None,
        may_act: Callable[[], bool] = lambda: True,
    ):
        self.config = config
        self.events = client.EventsV1Api(api)
        self.identity = identity
        self.budget = budget or WriteBudget(config.kubernetes.max_writes_per_minute)
        self.may_act = may_act

    def gate(self, what: str) -> None:
        """Raise unless one more write may go now."""
        if not self.may_act():
            raise KubeError(f"{what}: not the leader (lease lost or not held); not written")
        if not self.budget.take():
            raise KubeError(
                f"{what}: write budget spent ({self.budget.per_minute}/min); retried next tick"
            )

    def event(
        self,
        regarding: client.V1ObjectReference,
        namespace: str,
        reason: str,
        action: str,
        note: str,
        type_: str = "Normal",
    ) -> None:
        event = client.EventsV1Event(
            # Named as client-go's recorder names them (tools/events/event_recorder.go:
            # "<object>.<unix nanoseconds in hex>"); a generateName may not end in ".".
            metadata=client.V1ObjectMeta(
                name=f"{regarding.name}.{time.time_ns():x}", namespace=namespace
            ),
            event_time=datetime.now(UTC),
            reason=reason,
            action=action,
            note=note[:1024],
            type=type_,
            reporting_controller=REPORTING_CONTROLLER,
            reporting_instance=self.identity,
            regarding=regarding,
        )
        try:
            self.events.create_namespaced_event(namespace, event, _preload_content=False)
        except ApiException as e:  # the change is made; a lost Event is logged, not fatal
            log.warning("%s", _api_error(f"event {reason} on {regarding.name} not recorded", e))


def _record(d: Decision) -> str:
    return json.dumps(d.as_record())


class KubeWorkloads:
    """Reads and sets replica floors of the configured workloads."""

    def __init__(
        self,
        api: client.ApiClient,
        config: Config,
        identity: str = "gpuscaler",
        writer: Writer | None = None,
    ):
        self.config = config
        self.custom = client.CustomObjectsApi(api)
        self.hpa = client.AutoscalingV2Api(api)
        self.writer = writer or Writer(api, config, identity)
        self.guard = FloorGuard(self.writer)

    def _workload(self, key: str) -> WorkloadConfig:
        for w in self.config.workloads:
            if w.key == key:
                return w
        raise KubeError(f"{key} is not a configured workload")

    def read(self, w: WorkloadConfig) -> ScaleObject:
        if w.kind == "ScaledObject":
            obj = _read(
                f"read {w.key}",
                lambda: self.custom.get_namespaced_custom_object(
                    *KEDA[:2], w.namespace, KEDA[2], w.name
                ),
            )
        else:
            obj = _read(
                f"read {w.key}",
                lambda: self.hpa.read_namespaced_horizontal_pod_autoscaler(
                    w.name, w.namespace, _preload_content=False
                ),
            )
        return parse_scale_object({**obj, "metadata": obj.get("metadata") or {}}, w.kind)

    def _patch(self, w: WorkloadConfig, body: dict[str, Any]) -> None:
        if w.kind == "ScaledObject":
            self.custom.patch_namespaced_custom_object(
                *KEDA[:2], w.namespace, KEDA[2], w.name, body
            )
        else:
            self.hpa.patch_namespaced_horizontal_pod_autoscaler(
                w.name, w.namespace, body, _preload_content=False
            )

    def set_floor(self, decision: Decision) -> bool:
        """Set the floor `decision` asks for; True when the object now has it (written or
        already so), False when refused (not opted in, owned by KEDA). Raises KubeError."""
        w = self._workload(decision.target)
        field = "minReplicaCount" if w.kind == "ScaledObject" else "minReplicas"
        for _ in range(MAX_CONFLICT_RETRIES + 1):
            state = self.read(w)
            if not state.opted_in:
                why = "owned by KEDA" if state.owned_by_keda else f"no label {OPT_IN_LABEL}=true"
                log.info("not touching %s: %s", w.key, why)
                return False
            want = int(decision.to_value)
            if state.max_replicas is not None:
                want = min(want, state.max_replicas)  # never above the object's own maximum
            if state.floor == want:
                return True  # idempotent: nothing to write
            refused = self.guard.refusal(self.config, w, state, want)  # KEDA pause, GitOps
            if refused is not None:
                raise KubeError(f"floor of {w.key} not patched: {refused}")
            self.writer.gate(f"floor of {w.key}")
            body = {
                "metadata": {
                    "resourceVersion": state.resource_version,
                    "annotations": {LAST_DECISION: _record(decision)},
                },
                "spec": {field: want},
            }
            try:
                self._patch(w, body)
            except ApiException as e:
                if e.status == 409:
                    continue  # someone wrote first: read again
                raise _api_error(f"patch {w.key}", e) from None
            api_version = "keda.sh/v1alpha1" if w.kind == "ScaledObject" else "autoscaling/v2"
            self.writer.event(
                client.V1ObjectReference(
                    api_version=api_version,
                    kind=w.kind,
                    name=w.name,
                    namespace=w.namespace,
                    uid=state.uid or None,
                ),
                w.namespace,
                "ReplicaFloorChanged",
                "SetReplicaFloor",
                f"floor {state.floor} -> {want}: {decision.reason}",
            )
            return True
        raise KubeError(f"patch {w.key}: still conflicting after {MAX_CONFLICT_RETRIES} retries")

    def apply_one(self, d: Decision) -> bool:
        return self.set_floor(d)


def sharing_config(strategy: str, fragments: int) -> str:
    """The device-plugin config document giving `fragments` replicas per GPU."""
    doc: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": "none"}}
    if fragments > 1:  # replicas 1 is no sharing at all: the plain config
        resources = [{"name": "nvidia.com/gpu", "replicas": fragments}]
        if strategy == "mps":
            doc["sharing"] = {"mps": {"renameByDefault": False, "resources": resources}}
        else:
            doc["sharing"] = {
                "timeSlicing": {
                    "renameByDefault": False,
                    "failRequestsGreaterThanOne": False,
                    "resources": resources,
                }
            }
    return yaml.safe_dump(doc, sort_keys=False)


def _config_replicas(text: str) -> tuple[str | None, int]:
    """(strategy, replicas) a device-plugin config document sets; (None, 1) for none."""
    doc = yaml.safe_load(text) or {}
    sharing = doc.get("sharing") or {}
    for key, strategy in (("timeSlicing", "time-slicing"), ("mps", "mps")):
        section = sharing.get(key)
        if section:
            for r in section.get("resources") or []:
                if r.get("name") == "nvidia.com/gpu":
                    return strategy, int(r.get("replicas", 1))
    return None, 1


class KubeNodePools:
    """Fragments and time slice of node pools, through node labels."""

    def __init__(
        self,
        api: client.ApiClient,
        config: Config,
        writer: Writer,
        reader: ClusterReader | None = None,
    ):
        self.config = config
        self.core = client.CoreV1Api(api)
        self.reader = reader or ClusterReader(api, config)
        """Shared with the source: rollouts are continued from what this tick already read
        (each write still checks the resourceVersion), not from a second listing."""
        self.writer = writer

    def _pool(self, name: str) -> NodePoolConfig:
        for p in self.config.node_pools:
            if p.name == name:
                return p
        raise KubeError(f"{name} is not a configured node pool")

    # ------------------------------------------------------------------ device plugin

    def ensure_sharing_config(self, pool: NodePoolConfig, fragments: int, now: float) -> str:
        """The name of the config giving `fragments` per GPU, once nodes may name it: added
        to the device-plugin ConfigMap when missing (with the time, in an annotation), and
        usable `kubernetes.config_propagation` after that (ConfigNotReady until then). An
        existing config of that name that says something else is never overwritten: the
        operator owns it."""
        ref = self.config.kubernetes.device_plugin_config_map
        name = sharing_config_name(pool, fragments, self.config)
        where = f"ConfigMap {ref.namespace}/{ref.name}"
        for _ in range(MAX_CONFLICT_RETRIES + 1):
            cm = _read(
                f"read {where}",
                lambda: self.core.read_namespaced_config_map(
                    ref.name, ref.namespace, _preload_content=False
                ),
            )
            data = cm.get("data") or {}
            meta = cm.get("metadata") or {}
            if name in data:
                try:
                    strategy, replicas = _config_replicas(data[name])
                except (yaml.YAMLError, AttributeError, TypeError, ValueError):
                    raise KubeError(
                        f"{where}: config {name} is not a device-plugin config"
                    ) from None
                expected = pool.sharing if fragments > 1 else None
                if (strategy, replicas) != (expected, fragments):
                    raise KubeError(
                        f"{where}: config {name} sets {strategy or 'no sharing'} with "
                        f"{replicas} replicas, not {pool.sharing} with {fragments}; "
                        "left as it is, fix or rename it"
                    )
                added = parse_time((meta.get("annotations") or {}).get(CONFIG_ADDED + name))
                self._propagated(name, added, now)
                return name
            if (meta.get("labels") or {}).get(OPT_IN_LABEL) != "true":
                raise KubeError(
                    f"{where}: config {name} is missing and the ConfigMap has no label "
                    f"{OPT_IN_LABEL}=true, so gpuscaler may not add it"
                )
            self.writer.gate(f"add {name} to {where}")
            body = {
                "metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "annotations": {CONFIG_ADDED + name: rfc3339(now)},
                },
                "data": {name: sharing_config(pool.sharing, fragments)},
            }
            try:
                self.core.patch_namespaced_config_map(
                    ref.name, ref.namespace, body, _preload_content=False
                )
            except ApiException as e:
                if e.status == 409:
                    continue
                raise _api_error(f"patch {where}", e) from None
            self.writer.event(
                client.V1ObjectReference(
                    api_version="v1",
                    kind="ConfigMap",
                    name=ref.name,
                    namespace=ref.namespace,
                    uid=meta.get("uid"),
                ),
                ref.namespace,
                "SharingConfigAdded",
                "AddSharingConfig",
                f"added device-plugin config {name} ({pool.sharing}, {fragments} per GPU)",
            )
            self._propagated(name, now, now)
            return name
        raise KubeError(f"patch {where}: still conflicting after {MAX_CONFLICT_RETRIES} retries")

    def _propagated(self, name: str, added: float | None, now: float) -> None:
        """Raise ConfigNotReady while a config gpuscaler added may not have reached every
        node's config-manager yet; a config without the annotation was there before."""
        wait = self.config.kubernetes.config_propagation
        if added is not None and now - added < wait:
            raise ConfigNotReady(
                f"config {name} was added {now - added:.0f}s ago; nodes are relabelled "
                f"{wait:.0f}s after (kubernetes.config_propagation), once the kubelet has "
                "synced it to every device plugin"
            )

    # ------------------------------------------------------------------ nodes

    def _label_for(self, kind: str, pool: NodePoolConfig, value: str) -> tuple[str, str]:
        if kind == "fragments":
            return PLUGIN_CONFIG_LABEL, sharing_config_name(pool, int(value), self.config)
        return self.config.kubernetes.time_slice_label, value

    def _relabel(self, node: Node, kind: str, label: str, value: str, record: str) -> bool:
        """Patch one node's label and decision annotation; True if written."""
        current = node
        for _ in range(MAX_CONFLICT_RETRIES + 1):
            if current.labels.get(label) == value:
                return False
            self.writer.gate(f"label {label} on node {node.name}")
            body = {
                "metadata": {
                    "resourceVersion": current.resource_version,
                    "labels": {label: value},
                    "annotations": {NODE_DECISION[kind]: record},
                }
            }
            try:
                self.core.patch_node(node.name, body, _preload_content=False)
                return True
            except ApiException as e:
                if e.status != 409:
                    raise _api_error(f"patch node {node.name}", e) from None
            fresh = _read(
                f"read node {node.name}",
                lambda: self.core.read_node(node.name, _preload_content=False),
            )
            current = parse_objects([{**fresh, "kind": "Node"}], self.config).nodes[0]
        raise KubeError(f"patch node {node.name}: still conflicting")

    def roll_out(
        self,
        kind: str,
        pool: NodePoolConfig,
        value: str,
        record: str,
        objects: ClusterObjects | None = None,
    ) -> int:
        """Relabel up to max_nodes_per_tick nodes of the pool toward `value`; the number
        relabelled. Raises KubeError when the pool may not be touched at all."""
        objects = objects or self.reader.objects()
        nodes = pool_nodes(objects, pool)
        if not nodes:
            raise KubeError(f"pool {pool.name}: no nodes")
        refused = [n.name for n in nodes if not n.opted_in]
        if refused:
            raise KubeError(
                f"pool {pool.name}: node(s) {', '.join(refused[:3])} lack {OPT_IN_LABEL}=true; "
                "a pool is changed whole or not at all"
            )
        label, label_value = self._label_for(kind, pool, value)
        pending = [n for n in nodes if n.labels.get(label) != label_value]
        if kind == "fragments":
            blocked = [
                n for n in pending if shares_held(n, objects.pods) > int(value)
            ]  # lowering below what pods hold needs preemption first
            for n in blocked:
                log.info(
                    "node %s keeps its fragments: its pods hold %d shares per GPU > %s",
                    n.name,
                    shares_held(n, objects.pods),
                    value,
                )
            pending = [n for n in pending if n not in blocked]
        done = 0
        for node in pending[: self.config.kubernetes.max_nodes_per_tick]:
            try:
                written = self._relabel(node, kind, label, label_value, record)
            except KubeError as e:
                if done == 0:
                    raise
                # Each node is whole (label and annotation in one patch); the nodes done
                # carry the decision, so the next tick resumes the rollout from them.
                log.warning("rollout on pool %s paused after %d node(s): %s", pool.name, done, e)
                break
            if written:
                done += 1
                self.writer.event(
                    client.V1ObjectReference(
                        api_version="v1", kind="Node", name=node.name, uid=node.uid or None
                    ),
                    self.config.kubernetes.events_namespace,
                    "FragmentsChanged" if kind == "fragments" else "TimeSliceChanged",
                    "SetNodeLabel",
                    f"{label}={label_value} (pool {pool.name}): {json.loads(record)['reason']}",
                )
        return done

    def apply_one(self, d: Decision) -> bool:
        pool = self._pool(d.target)
        if d.kind == "fragments":
            self.ensure_sharing_config(pool, int(d.to_value), d.time)
        return self.roll_out(d.kind, pool, str(d.to_value), _record(d)) > 0

    def continue_rollouts(self, skip: set[str] | frozenset[str] = frozenset()) -> int:
        """Carry on rollouts that earlier ticks started (nodes of a pool lagging behind
        the newest gpuscaler decision on its nodes); pools in `skip` are left alone.
        Returns the nodes relabelled."""
        try:
            objects = self.reader.last_objects or self.reader.objects()
        except (KubeError, ClusterStateError) as e:
            log.warning("rollouts paused: %s", e)
            return 0
        done = 0
        for pool in self.config.node_pools:
            nodes = pool_nodes(objects, pool)
            for kind in NODE_DECISION:
                if f"{kind}:{pool.name}" in skip:
                    continue
                records = [
                    n.annotations[NODE_DECISION[kind]]
                    for n in nodes
                    if NODE_DECISION[kind] in n.annotations
                ]
                if not records:
                    continue
                newest = max(records, key=_record_time)
                try:
                    target = str(json.loads(newest)["to"])
                    label, value = self._label_for(kind, pool, target)
                    if any(n.labels.get(label) != value for n in nodes):
                        done += self.roll_out(kind, pool, target, newest, objects)
                except (KubeError, ValueError, KeyError) as e:
                    log.warning("rollout of %s on pool %s paused: %s", kind, pool.name, e)
        return done


def _record_time(record: str) -> float:
    try:
        return float(json.loads(record)["time"])
    except (ValueError, KeyError, TypeError):
        return 0.0


class KubeActuator:
    """The controller's actuator on a real cluster: each decision to its adapter; a
    failure is logged with its reason and leaves that decision unapplied."""

    def __init__(self, workloads: KubeWorkloads, pools: KubeNodePools, preemption: Any = None):
        self.workloads = workloads
        self.pools = pools
        self.preemption = preemption
        """`gpuscaler.adapters.preemption.KubePreemption`, when preemption may act."""

    def reconfigure(self, config: Config) -> None:
        parts: list[Any] = [self.workloads, self.pools, self.pools.reader, self.workloads.writer]
        if self.preemption is not None:
            parts.append(self.preemption)
        for part in parts:
            part.config = config

    def apply(self, decisions: Sequence[Decision]) -> tuple[Decision, ...]:
        self.pools.continue_rollouts({f"{d.kind}:{d.target}" for d in decisions})
        done = []
        for d in decisions:
            adapter: Any = {"replica_floor": self.workloads, "preemption": self.preemption}.get(
                d.kind, self.pools
            )
            if adapter is None:
                log.warning("%s of %s not applied: no adapter", d.kind, d.target)
                continue
            try:
                if adapter.apply_one(d):
                    done.append(d)
            except KubeError as e:
                log.warning(
                    "%s of %s not applied: %s",
                    d.kind,
                    d.target,
                    e,
                    extra={"event": "not_applied", "kind": d.kind, "target": d.target},
                )
        return tuple(done)


def kube_actuator(
    api: client.ApiClient,
    config: Config,
    identity: str,
    may_act: Callable[[], bool] = lambda: True,
    budget: WriteBudget | None = None,
    namespace: str = "gpuscaler",
    reader: ClusterReader | None = None,
) -> KubeActuator:
    """The actuator for `config`, all writes behind one gate (leadership and budget);
    preemption records live in `namespace` (gpuscaler's own)."""
    from gpuscaler.adapters.preemption import KubePreemption

    writer = Writer(api, config, identity, budget, may_act)
    return KubeActuator(
        KubeWorkloads(api, config, identity, writer),
        KubeNodePools(api, config, writer, reader),
        KubePreemption(api, config, writer, namespace),
    )
