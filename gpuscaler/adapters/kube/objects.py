"""Kubernetes objects as gpuscaler reads them (GPU nodes, GPU pods, ScaledObjects, HPAs),
parsed from JSON, so the live reader and `once --cluster-snapshot FILE` share every rule.
A node's fragments per GPU come from `nvidia.com/device-plugin.config` when that names a
sharing config (`ts-4` -> 4), else from feature discovery's `nvidia.com/gpu.replicas`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gpuscaler.adapters.kube import dra, drashare
from gpuscaler.config import Config, NodePoolConfig
from gpuscaler.core.external import EXTERNAL_TRIGGERS
from gpuscaler.core.parsing import parse_count
from gpuscaler.core.preemption import DeviceHold

Json = dict[str, Any]

OPT_IN_LABEL = "gpuscaler.io/enabled"
PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
GPU_RESOURCE = "nvidia.com/gpu"
LAST_DECISION = "gpuscaler.io/last-decision"
NODE_DECISION = {
    "fragments": "gpuscaler.io/last-fragments-decision",
    "time_slice": "gpuscaler.io/last-time-slice-decision",
}
"""The last decision applied, as JSON; on nodes per kind (they roll out independently)."""


@dataclass(frozen=True)
class CurrentState:
    """What the cluster runs now, keyed by pool name and workload key."""

    fragments: Mapping[str, int] = field(default_factory=dict)
    time_slice_levels: Mapping[str, str] = field(default_factory=dict)
    floors: Mapping[str, int] = field(default_factory=dict)
    replicas: Mapping[str, int] = field(default_factory=dict)
    max_replicas: Mapping[str, int] = field(default_factory=dict)
    shares_held: Mapping[str, int] = field(default_factory=dict)
    """Most GPU shares held by pods on one GPU of the pool."""
    gpu_memory_gib: Mapping[str, float] = field(default_factory=dict)
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
    """Physical GPUs (nvidia.com/gpu.count, else capacity over replicas)."""
    gpu_memory_mib: float | None
    fragments: int | None
    time_slice_level: str | None
    taints: tuple[Json, ...] = ()
    uid: str = ""
    dra_devices: tuple[str, ...] = ()
    """Its whole GPUs published through DRA (driver/pool/device)."""
    dra_allocated: frozenset[str] = frozenset()
    """Those of `dra_devices` a ResourceClaim is allocated."""
    dra_only: bool = False
    """All its GPUs are DRA's: its device plugin advertises none."""
    dra_shared: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """The capacity of each of `dra_devices` several claims may share."""
    dra_capacity: Mapping[str, float] = field(default_factory=dict)
    """The smallest capacity of each name among `dra_devices`."""

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
    node_selector: Mapping[str, str] = field(default_factory=dict)
    node_affinity: tuple[Json, ...] = ()
    """requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms."""
    tolerations: tuple[Json, ...] = ()
    uid: str = ""
    """A pod recreated under the same name (a StatefulSet's) is another pod."""
    claims: tuple[str, ...] | None = None
    """Names of its ResourceClaims (None: it has none; `with_dra` counts their GPUs)."""
    devices: tuple[DeviceHold, ...] = ()
    """Its GPUs allocated by DRA, counted in `gpus`."""
    wanted_devices: int = 0
    """GPUs its DRA claims not allocated yet ask for, counted in `gpus`."""
    wanted_capacity: Mapping[str, float] = field(default_factory=dict)
    """What they ask of each GPU (consumable capacity); empty: whole devices."""

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
    floor_managers: tuple[str, ...] = ()
    """Field managers owning the floor field (`floor_managers`)."""
    external_addresses: tuple[str, ...] = ()
    """scalerAddress of each external / external-push trigger (ScaledObjects)."""
    triggers: int = 0


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
    claim_holders: frozenset[str] = frozenset()
    """UIDs of the pods an allocated DRA GPU claim is reserved for."""
    dra_sharing: tuple[drashare.Opted, ...] = ()
    """DeviceClasses and ResourceClaimTemplates opted in to a pool's sharing."""


def _meta(obj: Json, where: str) -> Json:
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise ClusterStateError(f"{where}: no metadata.name")
    return meta


def _int(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return parse_count(str(value))
    except ValueError as e:
        raise ClusterStateError(f"{where}: {e}") from None


def sharing_fragments(config_name: str | None, config: Config) -> int | None:
    """Fragments a named device-plugin config gives ("ts-4" -> 4), None if not ours."""
    if config_name is None:
        return None
    for pattern in config.kubernetes.sharing_config_names.values():
        regex = re.escape(pattern).replace(re.escape("{n}"), "([0-9]+)")
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


def _claim_names(spec: Json, status: Json, where: str) -> tuple[str, ...] | None:
    """Its ResourceClaims' names: named in the spec, or made from a template (status)."""
    refs = spec.get("resourceClaims")
    if not refs:
        return None
    if not isinstance(refs, list) or len(refs) > dra.POD_CLAIMS_MAX:
        raise ClusterStateError(
            f"{where}: spec.resourceClaims not a list of at most {dra.POD_CLAIMS_MAX}"
        )
    made = {
        s.get("name"): s.get("resourceClaimName")
        for s in (status.get("resourceClaimStatuses") or [])[: len(refs)]
        if isinstance(s, dict)  # a list the API keeps as long as spec.resourceClaims
    }
    names = (
        r.get("resourceClaimName") or made.get(r.get("name")) for r in refs if isinstance(r, dict)
    )
    return tuple(n for n in names if isinstance(n, str) and n)


def parse_pod(obj: Json) -> GpuPod | None:
    """The pod if it requests GPUs or has ResourceClaims (`with_dra` keeps those holding
    or wanting GPUs), else None."""
    meta = _meta(obj, "Pod")
    where = f"Pod {meta.get('namespace')}/{meta['name']}"
    spec = obj.get("spec") or {}
    gpus = _gpus_requested(spec, where)
    status = obj.get("status") or {}
    claims = _claim_names(spec, status, where)
    if gpus == 0 and claims is None:
        return None
    unschedulable = next(
        (
            c.get("lastTransitionTime")
            for c in status.get("conditions") or []
            if (c.get("type"), c.get("status"), c.get("reason"))
            == ("PodScheduled", "False", "Unschedulable")
        ),
        None,
    )
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
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
        unschedulable_since=parse_time(unschedulable),
        node_selector=dict(spec.get("nodeSelector") or {}),
        node_affinity=tuple((affinity or {}).get("nodeSelectorTerms") or ()),
        tolerations=tuple(spec.get("tolerations") or ()),
        claims=claims,
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
        triggers=len(spec["triggers"]) if isinstance(spec.get("triggers"), list) else 0,
    )


def floor_field(kind: str) -> str:
    return "minReplicaCount" if kind == "ScaledObject" else "minReplicas"


def floor_managers(meta: Json, kind: str) -> tuple[str, ...]:
    """The field managers whose managedFields entry holds the floor field, as the API
    server records them (`fieldsV1` `f:spec`); any other shape counts as no owner."""
    want = "f:" + floor_field(kind)
    found = []
    entries = meta.get("managedFields")
    for entry in entries if isinstance(entries, list) else []:
        fields = entry.get("fieldsV1") if isinstance(entry, dict) else None
        spec = fields.get("f:spec") if isinstance(fields, dict) else None
        if isinstance(spec, dict) and want in spec:
            found.append(str(entry.get("manager", "")))
    return tuple(found)


def external_addresses(spec: Json) -> tuple[str, ...]:
    triggers = spec.get("triggers")
    return tuple(
        str(t["metadata"].get("scalerAddress", ""))
        for t in (triggers if isinstance(triggers, list) else [])
        if isinstance(t, dict)
        and t.get("type") in EXTERNAL_TRIGGERS
        and isinstance(t.get("metadata"), dict)
    )


def rfc3339(t: float, micro: bool = False) -> str:
    """Unix seconds as the RFC 3339 timestamp Kubernetes writes (whole seconds, UTC); `micro`
    keeps microseconds (the extender's assume-time is compared with GPU sample times)."""
    fraction = ".%f" if micro else ""
    return datetime.fromtimestamp(t, UTC).strftime(f"%Y-%m-%dT%H:%M:%S{fraction}Z")


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
    resources: dict[str, list[Json]] = {"ResourceSlice": [], "ResourceClaim": []}
    resources |= {"DeviceClass": [], "ResourceClaimTemplate": []}
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
            elif kind in resources:
                resources[kind].append(obj)
            elif kind in ("PriorityClass", "PodDisruptionBudget"):
                _meta(obj, kind)
                (classes if kind == "PriorityClass" else budgets).append(obj)
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
    objects = ClusterObjects(tuple(nodes), tuple(pods), scale, tuple(classes), tuple(budgets))
    shared = resources["DeviceClass"] + resources["ResourceClaimTemplate"]
    return with_dra(objects, resources["ResourceSlice"], resources["ResourceClaim"], config, shared)


def with_dra(
    objects: ClusterObjects,
    slices: Iterable[Json],
    claims: Iterable[Json],
    config: Config,
    shared: Iterable[Json] = (),
) -> ClusterObjects:
    """`objects` with the GPUs DRA allocated: a node publishing GPU devices has at least
    that many GPUs (their smallest memory when it has no label for it), a pod holds its
    claims' GPU devices and counts them, with what its unallocated claims ask for, in
    `gpus`; a pod with claims but no GPU in them is dropped. `shared`: the DeviceClasses
    and ResourceClaimTemplates labelled for a pool's sharing."""
    cfg = config.kubernetes.dra
    try:
        parsed = [dra.parse_claim(c, cfg) for c in claims] if cfg.enabled else []
        devices = dra.current(d for s in slices if cfg.enabled for d in dra.parse_slice(s, cfg))
    except ValueError as e:
        raise ClusterStateError(str(e)) from None
    by_key = {c.key: c for c in parsed if c is not None}
    gpus_of = dra.node_gpus(devices)
    allocated = {f"{a.driver}/{a.pool}/{a.device}" for c in by_key.values() for a in c.gpus}
    nodes = []
    for n in objects.nodes:
        gpus = gpus_of.get(n.name)
        if gpus is not None:
            memory = gpus.capacity.get(dra.MEMORY)
            n = replace(
                n,
                gpu_count=max(n.gpu_count or 0, len(gpus.keys)),
                gpu_memory_mib=n.gpu_memory_mib or (memory / (1 << 20) if memory else None),
                dra_devices=gpus.keys,
                dra_only=not n.gpu_count,
                dra_shared=gpus.shared,
                dra_capacity=gpus.capacity,
                dra_allocated=frozenset(allocated.intersection(gpus.keys)),
            )
        nodes.append(n)
    pods = []
    for p in objects.pods:
        if p.claims is not None:
            holds, wanted, asked = dra.pod_gpus(p.uid, p.namespace, p.claims, by_key, devices)
            p = replace(
                p,
                gpus=p.gpus + len(holds) + wanted,
                devices=holds,
                wanted_devices=wanted,
                wanted_capacity=asked,
            )
        if p.gpus:
            pods.append(p)
    holders = frozenset(u for c in by_key.values() if c.allocated and c.gpus for u in c.holders)
    return replace(
        objects,
        nodes=tuple(nodes),
        pods=tuple(pods),
        claim_holders=holders,
        dra_sharing=drashare.parse_opted(shared, config) if cfg.enabled else (),
    )
