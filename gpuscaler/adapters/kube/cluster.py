"""What the cluster runs now, from its objects: GPU nodes grouped into pools (by the
label `selector.label` = `selector.value`), the workloads that opted in, where a pod may
be scheduled. While a rollout is under way (nodes disagree) a pool's value is the target
of the newest gpuscaler decision on its nodes, so the core does not decide again.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping

import yaml

from gpuscaler.adapters.kube.drashare import PoolSharing, pool_sharing
from gpuscaler.adapters.kube.objects import (
    ClusterObjects,
    ClusterStateError,
    CurrentState,
    GpuPod,
    Json,
    Node,
    PoolState,
    parse_objects,
)
from gpuscaler.config import Config, NodePoolConfig, WorkloadConfig
from gpuscaler.demand import DEMAND_ANNOTATION, demand_from_annotation

log = logging.getLogger("gpuscaler.cluster")

SHARED_SUFFIX = "-SHARED"
"""GPU feature discovery appends this to `nvidia.com/gpu.product` while the GPUs are
shared (NVIDIA/k8s-device-plugin internal/lm/resource.go)."""
MIG_MARK = "-MIG-"
MIG_RESOURCE = "nvidia.com/mig-"


def selects(selector_value: str, label_value: str | None, label: str) -> bool:
    """Does a node's label value match the pool selector? A `*.product` label matches with
    or without -SHARED, so sharing never moves a node out of its pool."""
    return label_value == selector_value or (
        label.endswith(".product") and label_value == selector_value + SHARED_SUFFIX
    )


def in_pool(pool: NodePoolConfig, labels: Mapping[str, str]) -> bool:
    """Is a node of these labels in `pool` (its selector written with or without -SHARED)?"""
    label, value = pool.selector.label, pool.selector.value.removesuffix(SHARED_SUFFIX)
    return selects(value, labels.get(label), label)


def pool_nodes(objects: ClusterObjects, pool: NodePoolConfig) -> tuple[Node, ...]:
    return tuple(n for n in objects.nodes if in_pool(pool, n.labels))


def is_mig(node: Node) -> bool:
    """A node whose GPUs are split by MIG, as GFD labels it (internal/lm/mig-strategy.go):
    a product `<model>-MIG-<profile>` (strategy single), or a `nvidia.com/mig-<profile>.count`
    (mixed); `nvidia.com/mig.strategy` is set on nodes without MIG too."""
    if MIG_MARK in node.labels.get("nvidia.com/gpu.product", ""):
        return True
    return any(
        key.startswith(MIG_RESOURCE) and key.endswith(".count") and value not in ("", "0")
        for key, value in node.labels.items()
    )


def shares_held(node: Node, pods: Iterable[GpuPod]) -> int:
    """Most shares the node's pods hold on one of its GPUs (requests spread evenly)."""
    held = sum(
        p.gpus for p in pods if p.node == node.name and p.phase not in ("Succeeded", "Failed")
    )
    return math.ceil(held / max(1, node.gpu_count or 1))


def _rollout_value(nodes: tuple[Node, ...], kind: str, current: list[str]) -> str | None:
    """The value every node has, else the newest decision's target, else the commonest."""
    if not current:
        return None
    if len(set(current)) == 1:
        return current[0]
    targets = [t for n in nodes if (t := n.decision_target(kind)) is not None]
    if targets:
        return max(targets)[1]
    return Counter(current).most_common(1)[0][0]


def pool_state(objects: ClusterObjects, pool: NodePoolConfig) -> PoolState:
    nodes = pool_nodes(objects, pool)
    if not nodes:
        why = f"no node has {pool.selector.label}={pool.selector.value}"
        return PoolState(pool.name, (), None, None, None, 0, problem=why)
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
    dra = dra_sharing(objects, pool, nodes)
    if dra is not None and not mig:
        plugin = [n.name for n in nodes if n.fragments is not None][:3]
        problem = dra.problem or (
            f"node(s) {', '.join(plugin)} share by the device plugin while DRA objects "
            "opted in to the pool: fragments left alone"
            if plugin
            else None
        )
        fragments = str(dra.fragments) if dra.fragments is not None else None
        levels = [dra.level] if dra.level else levels
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


def dra_sharing(
    objects: ClusterObjects, pool: NodePoolConfig, nodes: tuple[Node, ...]
) -> PoolSharing | None:
    """What the pool's opted-in DeviceClasses and templates give new claims, or None."""
    return pool_sharing(objects.dra_sharing, pool.name, pool_capacity(nodes))


def pool_capacity(nodes: Iterable[Node]) -> dict[str, float]:
    """The smallest capacity of each name among the nodes' DRA GPUs: a share size is
    measured against it, so a share fits every device of the pool."""
    capacity: dict[str, float] = {}
    for n in nodes:
        for key, value in n.dra_capacity.items():
            capacity[key] = min(capacity.get(key, value), value)
    return capacity


_refused_annotations: set[str] = set()
"""Malformed annotations already logged: once each, not every tick."""


def discovered_workloads(objects: ClusterObjects, config: Config) -> tuple[WorkloadConfig, ...]:
    """Opted-in ScaledObjects and HPAs the config does not list, with default policy and
    the `gpuscaler.io/type`, `node-pool` and `demand` annotations; one with a malformed
    demand is left alone (never sized by another signal than the one asked for)."""
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
    """The state the core plans against, with a problem for each target missing or
    ambiguous in the cluster."""
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
    "kubectl get nodes,pods,scaledobjects.keda.sh,horizontalpodautoscalers,resourceslices,"
    "resourceclaims,resourceclaimtemplates,deviceclasses -A -o yaml"
)
"""The DRA kinds need a server with resource.k8s.io (Kubernetes 1.34+); drop them before."""


def load_cluster_snapshot(path: str, config: Config) -> ClusterObjects:
    """The objects of a `kubectl get ... -o yaml` dump (a List, or a stream of them), nodes
    and pods both (without pods, fragments could be planned below the shares held)."""
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


def load_state(path: str | None, config: Config) -> tuple[CurrentState, str]:
    """The cluster's current state from a YAML file, or the config's initial values;
    with a sentence saying which, for the operator."""
    if path is None:
        return (
            CurrentState(fragments={p.name: p.initial_fragments or 1 for p in config.node_pools}),
            "current fragments from the config's initial_fragments; replica floors unknown "
            "(pass --state FILE) until the Kubernetes adapter reads them",
        )
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: cannot read state file: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping with pools and workloads")
    pools = doc.get("pools") or {}
    workloads = doc.get("workloads") or {}
    try:
        initial = {p.name: p.initial_fragments or 1 for p in config.node_pools}
        state = CurrentState(
            fragments=initial
            | {k: int(v["fragments"]) for k, v in pools.items() if "fragments" in v},
            time_slice_levels={
                k: str(v["time_slice_level"]) for k, v in pools.items() if "time_slice_level" in v
            },
            floors={k: int(v["floor"]) for k, v in workloads.items() if "floor" in v},
            replicas={k: int(v["replicas"]) for k, v in workloads.items() if "replicas" in v},
            max_replicas={
                k: int(v["max_replicas"]) for k, v in workloads.items() if "max_replicas" in v
            },
        )
    except (AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: malformed state file: {e}") from None
    return state, f"current fragments and replicas from the state file {path}"


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
    """Whether the scheduler could place `pod` on `node` as far as nodeSelector, required
    node affinity and NoSchedule or NoExecute taints go."""
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
