"""Cluster state from Kubernetes objects: GPU nodes grouped into pools, pods holding GPUs,
opted-in ScaledObjects and HPAs.

Pure parsing of the objects as JSON dicts (what the API returns and what `kubectl get
-o yaml` prints), so the live reader and `once --cluster-snapshot FILE` share every rule:

- a node is in a pool when its label `selector.label` equals `selector.value`;
- its fragments per GPU come from `nvidia.com/device-plugin.config` when that names a
  sharing config (`ts-4` -> 4), else from feature discovery's `nvidia.com/gpu.replicas`;
- while a rollout is under way (nodes disagree) the pool's fragments are the target the
  newest gpuscaler decision on its nodes set, so the core does not decide again;
- a pod holds GPUs when it is bound to a node, not finished, and requests `nvidia.com/gpu`;
  a node's shares held per GPU are its pods' requests over its physical GPU count.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gpuscaler.adapters.kube.floor_facts import (
    external_addresses,
    floor_managers,
    trigger_count,
)
from gpuscaler.config import Config, NodePoolConfig, WorkloadConfig
from gpuscaler.demand import DEMAND_ANNOTATION, demand_from_annotation

log = logging.getLogger("gpuscaler.cluster")

Json = dict[str, Any]

OPT_IN_LABEL = "gpuscaler.io/enabled"
PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
GPU_RESOURCE = "nvidia.com/gpu"
LAST_DECISION = "gpuscaler.io/last-decision"
"""Annotation with the last decision applied to an object, as JSON."""
NODE_DECISION = {
    "fragments": "gpuscaler.io/last-fragments-decision",
    "time_slice": "gpuscaler.io/last-time-slice-decision",
}
"""Per-kind annotation on nodes: fragments and time slice roll out independently."""


@dataclass(frozen=True)
class CurrentState:
    """What the cluster runs now, keyed by pool name and workload key: read from the
    cluster each tick, or from a state file or the config's initial values."""

    fragments: Mapping[str, int] = field(default_factory=dict)
    time_slice_levels: Mapping[str, str] = field(default_factory=dict)
    floors: Mapping[str, int] = field(default_factory=dict)
    replicas: Mapping[str, int] = field(default_factory=dict)
    max_replicas: Mapping[str, int] = field(default_factory=dict)
    shares_held: Mapping[str, int] = field(default_factory=dict)
    """Most GPU shares held by pods on one GPU of the pool."""
    gpu_memory_gib: Mapping[str, float] = field(default_factory=dict)
    """Per pool, from nvidia.com/gpu.memory of its nodes."""
    problems: Mapping[str, str] = field(default_factory=dict)
    """Why a target's state cannot be trusted ("pool:NAME" or "workload:KEY")."""


class ClusterStateError(ValueError):
    """Objects that cannot be read as cluster state; the message says which and why."""


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    resource_version: str
    gpu_count: int | None
    """Physical GPUs (nvidia.com/gpu.count; else capacity over replicas)."""
    gpu_memory_mib: float | None
    fragments: int | None
    time_slice_level: str | None
    taints: tuple[Json, ...] = ()
    uid: str = ""
    """metadata.uid: Events name it, so `kubectl describe node` finds them."""

    @property
    def opted_in(self) -> bool:
        return self.labels.get(OPT_IN_LABEL) == "true"

    def decision_target(self, kind: str) -> tuple[float, str] | None:
        """(time, to) of the last decision of `kind` applied to this node."""
        raw = self.annotations.get(NODE_DECISION[kind])
        if raw is None:
            return None
        try:
            record = json.loads(raw)
            return float(record["time"]), str(record["to"])
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class GpuPod:
    namespace: str
    name: str
    node: str | None
    gpus: int
    priority: int
    priority_class: str | None
    start_time: float | None
    phase: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    terminating_since: float | None = None
    unschedulable_since: float | None = None
    """lastTransitionTime of PodScheduled=False with reason Unschedulable."""
    pod_ip: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    node_affinity: tuple[Json, ...] = ()
    """requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms."""
    tolerations: tuple[Json, ...] = ()
    uid: str = ""
    """metadata.uid: a pod recreated under the same name (a StatefulSet's) is another pod."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ScaleObject:
    """A ScaledObject or HPA as gpuscaler sees it."""

    key: str
    floor: int
    max_replicas: int | None
    replicas: int | None
    opted_in: bool
    owned_by_keda: bool
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    resource_version: str = ""
    uid: str = ""
    """metadata.uid: Events name it, so `kubectl describe` finds them."""
    floor_managers: tuple[str, ...] = ()
    """Field managers owning the floor field (gpuscaler.adapters.kube.floor_facts)."""
    external_addresses: tuple[str, ...] = ()
    """scalerAddress of each external / external-push trigger (ScaledObjects)."""
    triggers: int = 0
    """How many triggers a ScaledObject has (all types)."""


@dataclass(frozen=True)
class PoolState:
    name: str
    nodes: tuple[Node, ...]
    fragments: int | None
    time_slice_level: str | None
    gpu_memory_gib: float | None
    max_shares_held: int
    problem: str | None = None


@dataclass(frozen=True)
class ClusterObjects:
    nodes: tuple[Node, ...] = ()
    pods: tuple[GpuPod, ...] = ()
    scale_objects: Mapping[str, ScaleObject] = field(default_factory=dict)
    priority_classes: tuple[Json, ...] = ()
    disruption_budgets: tuple[Json, ...] = ()
    """As JSON, when the objects came with them (a kubectl dump may include them)."""


# --------------------------------------------------------------------------- parsing


def _meta(obj: Json, where: str) -> Json:
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise ClusterStateError(f"{where}: no metadata.name")
    return meta


def _int(value: Any, where: str) -> int:
    try:
        return int(str(value))
    except ValueError:
        raise ClusterStateError(f"{where}: {value!r} is not a whole number") from None


def sharing_fragments(config_name: str | None, config: Config) -> int | None:
    """Fragments a named device-plugin config gives ("ts-4" -> 4), None if not ours."""
    if config_name is None:
        return None
    for pattern in config.kubernetes.sharing_config_names.values():
        regex = re.escape(pattern).replace(re.escape("{n}"), r"(\d+)")
        m = re.fullmatch(regex, config_name)
        if m:
            return int(m.group(1))
    return None


def sharing_config_name(pool: NodePoolConfig, fragments: int, config: Config) -> str:
    return config.kubernetes.sharing_config_names[pool.sharing].format(n=fragments)


def parse_node(obj: Json, config: Config) -> Node:
    meta = _meta(obj, "Node")
    where = f"Node {meta['name']}"
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    fragments = sharing_fragments(labels.get(PLUGIN_CONFIG_LABEL), config)
    if fragments is None and "nvidia.com/gpu.replicas" in labels:
        fragments = _int(labels["nvidia.com/gpu.replicas"], f"{where} nvidia.com/gpu.replicas")
    gpu_count: int | None = None
    if "nvidia.com/gpu.count" in labels:
        gpu_count = _int(labels["nvidia.com/gpu.count"], f"{where} nvidia.com/gpu.count")
    else:
        capacity = ((obj.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE)
        if capacity is not None:
            gpu_count = _int(capacity, f"{where} capacity") // max(1, fragments or 1)
    memory = labels.get("nvidia.com/gpu.memory")
    return Node(
        name=meta["name"],
        labels=labels,
        annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
        resource_version=str(meta.get("resourceVersion", "")),
        gpu_count=gpu_count,
        gpu_memory_mib=float(_int(memory, f"{where} nvidia.com/gpu.memory")) if memory else None,
        fragments=fragments,
        time_slice_level=labels.get(config.kubernetes.time_slice_label),
        taints=tuple((obj.get("spec") or {}).get("taints") or ()),
        uid=str(meta.get("uid", "")),
    )


def _gpus_requested(spec: Json, where: str) -> int:
    total = 0
    for c in spec.get("containers") or []:
        resources = c.get("resources") or {}
        amount = (resources.get("limits") or {}).get(GPU_RESOURCE) or (
            resources.get("requests") or {}
        ).get(GPU_RESOURCE)
        if amount is not None:
            total += _int(amount, f"{where} container {c.get('name')} {GPU_RESOURCE}")
    return total


def parse_pod(obj: Json) -> GpuPod | None:
    """The pod if it requests GPUs, else None."""
    meta = _meta(obj, "Pod")
    where = f"Pod {meta.get('namespace')}/{meta['name']}"
    spec = obj.get("spec") or {}
    gpus = _gpus_requested(spec, where)
    if gpus == 0:
        return None
    status = obj.get("status") or {}
    unschedulable = next(
        (
            c
            for c in status.get("conditions") or []
            if c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
        ),
        None,
    )
    return GpuPod(
        namespace=str(meta.get("namespace", "default")),
        name=meta["name"],
        uid=str(meta.get("uid") or ""),
        node=spec.get("nodeName"),
        gpus=gpus,
        priority=int(spec.get("priority") or 0),
        priority_class=spec.get("priorityClassName"),
        start_time=parse_time(status.get("startTime")),
        phase=str(status.get("phase", "Pending")),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        terminating_since=parse_time(meta.get("deletionTimestamp")),
        unschedulable_since=parse_time(unschedulable.get("lastTransitionTime"))
        if unschedulable
        else None,
        pod_ip=status.get("podIP"),
        node_selector=dict(spec.get("nodeSelector") or {}),
        node_affinity=tuple(
            (
                ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
                    "requiredDuringSchedulingIgnoredDuringExecution"
                )
                or {}
            ).get("nodeSelectorTerms")
            or ()
        ),
        tolerations=tuple(spec.get("tolerations") or ()),
    )


def parse_scale_object(obj: Json, kind: str) -> ScaleObject:
    meta = _meta(obj, kind)
    spec = obj.get("spec") or {}
    key = f"{meta.get('namespace', 'default')}/{kind}/{meta['name']}"
    labels = dict(meta.get("labels") or {})
    owned = any(o.get("kind") == "ScaledObject" for o in meta.get("ownerReferences") or [])
    if kind == "ScaledObject":
        # KEDA's defaults: minReplicaCount 0, maxReplicaCount 100.
        floor = _int(spec.get("minReplicaCount", 0), f"{key} spec.minReplicaCount")
        ceiling: int | None = _int(spec.get("maxReplicaCount", 100), f"{key} maxReplicaCount")
        replicas = None
    else:
        floor = _int(spec.get("minReplicas", 1), f"{key} spec.minReplicas")  # HPA default 1
        ceiling = _int(spec["maxReplicas"], f"{key} maxReplicas") if "maxReplicas" in spec else None
        current = (obj.get("status") or {}).get("currentReplicas")
        replicas = _int(current, f"{key} status.currentReplicas") if current is not None else None
    return ScaleObject(
        key=key,
        floor=floor,
        max_replicas=ceiling,
        replicas=replicas,
        opted_in=labels.get(OPT_IN_LABEL) == "true" and not owned,
        owned_by_keda=owned,
        labels=labels,
        annotations=dict(meta.get("annotations") or {}),
        resource_version=str(meta.get("resourceVersion", "")),
        uid=str(meta.get("uid", "")),
        floor_managers=floor_managers(meta, kind),
        external_addresses=external_addresses(spec),
        triggers=trigger_count(spec),
    )


def rfc3339(t: float) -> str:
    """Unix seconds as the RFC 3339 timestamp Kubernetes writes (whole seconds, UTC)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any) -> float | None:
    """Unix seconds of an RFC 3339 timestamp, None when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def parse_objects(items: Iterable[Json], config: Config) -> ClusterObjects:
    """Nodes, GPU pods, ScaledObjects and HPAs out of a mixed list; other kinds ignored."""
    nodes, pods, scale = [], [], {}
    classes: list[Json] = []
    budgets: list[Json] = []
    hpa_replicas: dict[str, int] = {}
    for i, obj in enumerate(items):
        if not isinstance(obj, dict):
            raise ClusterStateError(f"items[{i}]: not an object")
        kind = obj.get("kind")
        try:
            if kind == "Node":
                nodes.append(parse_node(obj, config))
            elif kind == "Pod":
                pod = parse_pod(obj)
                if pod is not None:
                    pods.append(pod)
            elif kind == "PriorityClass":
                _meta(obj, kind)
                classes.append(obj)
            elif kind == "PodDisruptionBudget":
                _meta(obj, kind)
                budgets.append(obj)
            elif kind in ("ScaledObject", "HorizontalPodAutoscaler"):
                so = parse_scale_object(obj, kind)
                scale[so.key] = so
                if so.owned_by_keda and so.replicas is not None:
                    owner = next(
                        o["name"]
                        for o in obj["metadata"]["ownerReferences"]
                        if o.get("kind") == "ScaledObject"
                    )
                    ns = so.key.split("/", 1)[0]
                    hpa_replicas[f"{ns}/ScaledObject/{owner}"] = so.replicas
        except ClusterStateError as e:
            raise ClusterStateError(f"items[{i}]: {e}") from None
    # A ScaledObject's replicas are those of the HPA KEDA made for it.
    for key, replicas in hpa_replicas.items():
        if key in scale:
            scale[key] = replace(scale[key], replicas=replicas)
    return ClusterObjects(tuple(nodes), tuple(pods), scale, tuple(classes), tuple(budgets))


# --------------------------------------------------------------------------- pools


SHARED_SUFFIX = "-SHARED"
"""GPU feature discovery appends this to `nvidia.com/gpu.product` while the node's GPUs are
shared (time-slicing replicas > 1, unless the resource is renamed): NVIDIA/k8s-device-plugin
internal/lm/resource.go, resourceLabeler.productLabel. A pool selected by product keeps its
nodes through every fragment change only if both forms match."""
MIG_MARK = "-MIG-"
"""GFD names a MIG device's product `<model>-MIG-<profile>` (same file, NewMIGResourceLabeler)."""


def selects(selector_value: str, label_value: str | None, label: str) -> bool:
    """Does a node's label value match the pool selector? A `*.product` label matches with or
    without GFD's -SHARED suffix, so sharing never moves a node out of its pool."""
    if label_value is None:
        return False
    if label_value == selector_value:
        return True
    return label.endswith(".product") and label_value == selector_value + SHARED_SUFFIX


def pool_nodes(objects: ClusterObjects, pool: NodePoolConfig) -> tuple[Node, ...]:
    label, value = pool.selector.label, pool.selector.value.removesuffix(SHARED_SUFFIX)
    return tuple(n for n in objects.nodes if selects(value, n.labels.get(label), label))


def is_mig(node: Node) -> bool:
    """A node whose GPUs are split by MIG: GFD's mig.strategy single/mixed, or a MIG product."""
    strategy = node.labels.get("nvidia.com/mig.strategy", "none")
    product = node.labels.get("nvidia.com/gpu.product", "")
    return strategy in ("single", "mixed") or MIG_MARK in product


def shares_held(node: Node, pods: Iterable[GpuPod]) -> int:
    """Most shares the node's pods hold on one of its GPUs (requests spread evenly)."""
    held = sum(
        p.gpus for p in pods if p.node == node.name and p.phase not in ("Succeeded", "Failed")
    )
    return math.ceil(held / max(1, node.gpu_count or 1))


def _rollout_value(nodes: tuple[Node, ...], kind: str, current: list[str]) -> str | None:
    """The pool's value for `kind`: the one every node has, else the target of the newest
    gpuscaler decision on its nodes (a rollout under way), else the most common one."""
    if not current:
        return None
    if len(set(current)) == 1:
        return current[0]
    targets = [t for n in nodes if (t := n.decision_target(kind)) is not None]
    if targets:
        return max(targets)[1]
    counts = Counter(current).most_common()
    return counts[0][0]


def pool_state(objects: ClusterObjects, pool: NodePoolConfig) -> PoolState:
    nodes = pool_nodes(objects, pool)
    if not nodes:
        return PoolState(
            pool.name,
            (),
            None,
            None,
            None,
            0,
            problem=f"no node has {pool.selector.label}={pool.selector.value}",
        )
    frag_values = [str(n.fragments) for n in nodes if n.fragments is not None]
    problem = None
    mig = [n.name for n in nodes if is_mig(n)]
    if mig:
        problem = (
            f"MIG pool (node(s) {', '.join(mig[:3])}): its GPUs are MIG instances, whose size "
            "is the MIG profile; fragments and time slices are left alone"
        )
    elif len(frag_values) < len(nodes):
        unknown = [n.name for n in nodes if n.fragments is None][:3]
        problem = f"fragments unknown on node(s) {', '.join(unknown)} (no sharing config label)"
    fragments = _rollout_value(nodes, "fragments", frag_values)
    levels = [n.time_slice_level or "default" for n in nodes]
    memories = [n.gpu_memory_mib for n in nodes if n.gpu_memory_mib is not None]
    return PoolState(
        name=pool.name,
        nodes=nodes,
        fragments=int(fragments) if fragments is not None and problem is None else None,
        time_slice_level=_rollout_value(nodes, "time_slice", levels),
        gpu_memory_gib=min(memories) / 1024 if memories else None,
        max_shares_held=max(shares_held(n, objects.pods) for n in nodes),
        problem=problem,
    )


_refused_annotations: set[str] = set()
"""Malformed annotations already logged: once each, not every tick."""


def discovered_workloads(objects: ClusterObjects, config: Config) -> tuple[WorkloadConfig, ...]:
    """Opted-in ScaledObjects and HPAs the config does not list, with default policy;
    `gpuscaler.io/type`, `gpuscaler.io/node-pool` and `gpuscaler.io/demand` annotations say
    what the config would. One with a malformed demand is left alone (never sized by
    another signal than the one asked for), with a warning."""
    listed = {w.key for w in config.workloads}
    pools = {p.name for p in config.node_pools}
    found = []
    for key, so in sorted(objects.scale_objects.items()):
        if key in listed or not so.opted_in:
            continue
        namespace, kind, name = key.split("/", 2)
        kind_type = so.annotations.get("gpuscaler.io/type", "inference")
        pool = so.annotations.get("gpuscaler.io/node-pool")
        demand_text = so.annotations.get(DEMAND_ANNOTATION)
        try:
            demand = None if demand_text is None else demand_from_annotation(demand_text)
        except ValueError as e:
            if f"{key}={demand_text}" not in _refused_annotations:
                _refused_annotations.add(f"{key}={demand_text}")
                log.warning(
                    "%s: annotation %s %s; not managed until it is fixed",
                    key,
                    DEMAND_ANNOTATION,
                    e,
                    extra={"event": "annotation_refused", "target": key},
                )
            continue
        found.append(
            WorkloadConfig(
                namespace=namespace,
                kind=kind,
                name=name,
                type="training" if kind_type == "training" else "inference",
                node_pool=pool if pool in pools else None,
                demand=demand,
            )
        )
    return tuple(found)


def current_state(objects: ClusterObjects, config: Config) -> CurrentState:
    """The state the core plans against, with a problem for each target that is missing
    or ambiguous in the cluster."""
    fragments, levels, held, memory, problems = {}, {}, {}, {}, {}
    for p in config.node_pools:
        pool = pool_state(objects, p)
        if pool.fragments is not None:
            fragments[p.name] = pool.fragments
        if pool.time_slice_level is not None:
            levels[p.name] = pool.time_slice_level
        if pool.gpu_memory_gib is not None:
            memory[p.name] = pool.gpu_memory_gib
        held[p.name] = pool.max_shares_held
        if pool.problem:
            problems[f"pool:{p.name}"] = pool.problem
    floors, replicas, ceilings = {}, {}, {}
    for w in config.workloads:
        so = objects.scale_objects.get(w.key)
        if so is None:
            problems[f"workload:{w.key}"] = f"{w.kind} {w.namespace}/{w.name} not found"
            continue
        floors[w.key] = so.floor
        if so.replicas is not None:
            replicas[w.key] = so.replicas
        if so.max_replicas is not None:
            ceilings[w.key] = so.max_replicas
    return CurrentState(
        fragments=fragments,
        time_slice_levels=levels,
        floors=floors,
        replicas=replicas,
        max_replicas=ceilings,
        shares_held=held,
        gpu_memory_gib=memory,
        problems=problems,
    )


def unavailable_state(config: Config, why: str) -> CurrentState:
    """Every target flagged: the cluster could not be read, so nothing may be decided."""
    keys = [f"pool:{p.name}" for p in config.node_pools]
    keys += [f"workload:{w.key}" for w in config.workloads]
    return CurrentState(problems=dict.fromkeys(keys, why))


SNAPSHOT_COMMAND = (
    "kubectl get nodes,pods,scaledobjects.keda.sh,horizontalpodautoscalers -A -o yaml"
)


def load_cluster_snapshot(path: str, config: Config) -> ClusterObjects:
    """The objects of a `kubectl get ... -o yaml` dump (a List, or a stream of them).
    Nodes and pods must both be there: without pods the shares held are unknown, and
    fragments could be planned below them."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
    except OSError as e:
        raise ClusterStateError(f"{path}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ClusterStateError(
            f"{path}: not valid YAML{where}: {getattr(e, 'problem', e)}"
        ) from None
    items: list[Json] = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict) or "kind" not in doc:
            raise ClusterStateError(f"{path}: document {i + 1} is not a Kubernetes object")
        if isinstance(doc.get("items"), list):
            items += doc["items"]
        else:
            items.append(doc)
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("kind"), str):
            raise ClusterStateError(f"{path}: items[{i}] has no kind")
    kinds = {item["kind"] for item in items}
    missing = [k for k in ("Node", "Pod") if k not in kinds]
    if missing:
        raise ClusterStateError(
            f"{path}: no {' and no '.join(missing)} objects; the file should hold the "
            f"output of `{SNAPSHOT_COMMAND}`"
        )
    try:
        return parse_objects(items, config)
    except ClusterStateError as e:
        raise ClusterStateError(f"{path}: {e}") from None


def with_discovered(config: Config, objects: ClusterObjects | None) -> Config:
    """`config` plus the opted-in ScaledObjects and HPAs it does not list."""
    if objects is None:
        return config
    found = discovered_workloads(objects, config)
    if not found:
        return config
    return config.model_copy(update={"workloads": config.workloads + found})


def _expression_matches(expr: Json, labels: Mapping[str, str]) -> bool:
    key, op, values = str(expr.get("key")), expr.get("operator"), expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    return False  # Gt/Lt and unknown operators: not assumed to match


def _tolerates(tolerations: tuple[Json, ...], taint: Json) -> bool:
    for t in tolerations:
        if t.get("effect") not in (None, "", taint.get("effect")):
            continue
        if t.get("operator") == "Exists" and t.get("key") in (None, "", taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def schedulable_on(pod: GpuPod, node: Node) -> bool:
    """Whether the scheduler could place `pod` on `node` as far as labels and taints go:
    nodeSelector, required node affinity (In, NotIn, Exists, DoesNotExist), and NoSchedule
    or NoExecute taints it does not tolerate."""
    if any(node.labels.get(k) != v for k, v in pod.node_selector.items()):
        return False
    if pod.node_affinity and not any(
        all(_expression_matches(e, node.labels) for e in term.get("matchExpressions") or [])
        for term in pod.node_affinity
    ):
        return False
    return all(
        _tolerates(pod.tolerations, t)
        for t in node.taints
        if t.get("effect") in ("NoSchedule", "NoExecute")
    )
