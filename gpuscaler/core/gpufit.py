"""Memory- and NUMA-aware GPU placement: the design's Filter and Score as pure functions
(over many nodes at once in `gputable`), given the measured GPU state, reservations and `now`.

- Filter keeps a node when the sum over its GPUs of max(0, total - used - 10 % of total)
  covers the requested memory, and, for a pod asking for k GPUs, k of them each have
  ceil(memory / k) usable.
- Score = 0.6 x (100 - 100 x stddev of the per-GPU used ratio) + 0.4 x topology bonus
  (100 when one NUMA domain has k fitting GPUs, else 100 x largest count in one domain / k;
  1-GPU pods get none), divided by 10 for kube-scheduler's 0..10, rounded half up.
- Reservations (pods bound but not yet visible in measured memory) count as used.
- A GPU of unknown NUMA node is a domain of its own: no bonus a node cannot prove.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from gpuscaler.core.parsing import parse_count, shown

MEMORY_ANNOTATION = "gpu-scheduler/memory-mb"
COUNT_ANNOTATION = "gpu-scheduler/gpu-count"
RESERVED_ANNOTATION = "gpu-scheduler/reserved-mb"
ASSUME_TIME_ANNOTATION = "gpu-scheduler/assume-time"
RESERVATION_ANNOTATION = "gpu-scheduler/reservation"
"""JSON {"node", "gpus": {uuid: MiB}, "baseline": {uuid: used MiB at bind}}."""
TOPOLOGY_ANNOTATION = "gpuscaler.io/gpu-topology"
GPUS_PER_NUMA_LABEL = "gpuscaler.io/gpus-per-numa-node"

MAX_GPU_COUNT = 64
FRAGMENTATION_WEIGHT = 0.6
TOPOLOGY_WEIGHT = 0.4
STALE_REASON = "GPU state stale"
SHOWN_FRACTION = 0.9
"""A reservation is shown by measured memory once each of its GPUs has grown by at least
90 % of what was reserved on it since the bind (allocators round, so not 100 %)."""


class AnnotationError(ValueError):
    """A pod or node annotation that cannot be read; the message names it."""


@dataclass(frozen=True)
class Gpu:
    uuid: str
    index: int
    total_mib: float
    used_mib: float
    numa: int | None = None


@dataclass(frozen=True)
class NodeGpus:
    name: str
    gpus: tuple[Gpu, ...]
    sampled_at: float
    """Time of the node's oldest GPU sample: the age of what we know about the node."""


@dataclass(frozen=True)
class PodRequest:
    memory_mib: int
    gpu_count: int = 1

    @property
    def per_gpu_mib(self) -> int:
        return -(-self.memory_mib // self.gpu_count)


@dataclass(frozen=True)
class Reservation:
    uid: str
    namespace: str
    name: str
    node: str
    gpus: tuple[tuple[str, float], ...]
    """(GPU UUID, reserved MiB) for each GPU the pod was placed on."""
    baseline: tuple[tuple[str, float], ...]
    """(GPU UUID, measured used MiB at bind)."""
    assumed_at: float

    @property
    def total_mib(self) -> float:
        return sum(m for _, m in self.gpus)


def _positive_int(annotations: Mapping[str, str], key: str, default: int | None) -> int | None:
    raw = annotations.get(key)
    if raw is None:
        return default
    try:
        value = parse_count(str(raw))
    except ValueError as e:
        raise AnnotationError(f"annotation {key}: {e}") from None
    if value <= 0:
        raise AnnotationError(f"annotation {key}: {value} must be positive")
    return value


def refusal(scheduler: str, node: str, annotations: Mapping[str, str], ours: str) -> str | None:
    """Why the extender must not place a pod, None when it may: only unbound pods of the
    GPU scheduler that ask for GPU memory are its to filter, score and bind."""
    if scheduler != ours:
        return f"pod's schedulerName {scheduler[:63]!r} is not {ours!r}"
    if node:
        return f"pod is already bound to node {node[:253]}"
    if MEMORY_ANNOTATION not in annotations:
        return f"pod has no annotation {MEMORY_ANNOTATION}"
    return None


def pod_request(annotations: Mapping[str, str]) -> PodRequest | None:
    """What a pod asks for, None when it asks for no GPU memory (not our business)."""
    memory = _positive_int(annotations, MEMORY_ANNOTATION, None)
    count = _positive_int(annotations, COUNT_ANNOTATION, 1)
    assert count is not None
    if count > MAX_GPU_COUNT:
        raise AnnotationError(f"annotation {COUNT_ANNOTATION}: {count} is above {MAX_GPU_COUNT}")
    if memory is None:
        if COUNT_ANNOTATION in annotations:
            raise AnnotationError(f"annotation {COUNT_ANNOTATION} needs {MEMORY_ANNOTATION}")
        return None
    return PodRequest(memory, count)


def numa_map(
    topology: str | None, per_numa_label: str | None, gpus: Iterable[Gpu]
) -> dict[str, int | None]:
    """NUMA node per GPU UUID: from the node agent's topology annotation (matched by UUID,
    else PCI bus id, else index), else from the label giving GPUs per NUMA node."""
    gpus = list(gpus)
    if topology:
        entries = _topology_entries(topology)
        by_uuid = {str(e.get("uuid")): e for e in entries}
        by_index = {e.get("index"): e for e in entries}
        out: dict[str, int | None] = {}
        for g in gpus:
            e = by_uuid.get(g.uuid) or by_index.get(g.index)
            numa = e.get("numa_node") if e is not None else None
            out[g.uuid] = numa if isinstance(numa, int) and numa >= 0 else None
        return out
    if per_numa_label:
        try:
            per = parse_count(per_numa_label)
        except ValueError:
            per = 0
        if per <= 0:
            raise AnnotationError(
                f"label {GPUS_PER_NUMA_LABEL}: {shown(per_numa_label)} is not a positive "
                "whole number"
            )
        return {g.uuid: g.index // per for g in gpus}
    return {g.uuid: None for g in gpus}


def _topology_entries(text: str) -> list[dict[str, object]]:
    try:
        doc = json.loads(text)
    except ValueError:
        raise AnnotationError(f"annotation {TOPOLOGY_ANNOTATION}: not JSON") from None
    if not isinstance(doc, list) or not all(isinstance(e, dict) for e in doc):
        raise AnnotationError(f"annotation {TOPOLOGY_ANNOTATION}: expected a JSON list of objects")
    for e in doc:
        numa = e.get("numa_node")
        if numa is not None and (isinstance(numa, bool) or not isinstance(numa, int)):
            raise AnnotationError(
                f"annotation {TOPOLOGY_ANNOTATION}: numa_node {numa!r} is not an integer"
            )
    return doc


def with_numa(node: NodeGpus, numa: Mapping[str, int | None]) -> NodeGpus:
    gpus = tuple(replace(g, numa=numa.get(g.uuid, g.numa)) for g in node.gpus)
    return replace(node, gpus=gpus)


def usable_mib(gpu: Gpu, margin: float) -> float:
    return max(0.0, gpu.total_mib - gpu.used_mib - margin * gpu.total_mib)


def with_reservations(node: NodeGpus, reservations: Iterable[Reservation]) -> NodeGpus:
    """The node with every reservation on it counted as used memory."""
    extra: dict[str, float] = {}
    for r in reservations:
        if r.node == node.name:
            for uuid, mib in r.gpus:
                extra[uuid] = extra.get(uuid, 0.0) + mib
    if not extra:
        return node
    gpus = tuple(replace(g, used_mib=g.used_mib + extra.get(g.uuid, 0.0)) for g in node.gpus)
    return replace(node, gpus=gpus)


@dataclass(frozen=True)
class NodeView:
    """What Filter and Score need of a node, computed once per refresh or reservation."""

    name: str
    usable_sum: float
    usable_sorted: tuple[float, ...]
    domains: tuple[tuple[float, ...], ...]
    """Usable MiB of the GPUs of each NUMA domain, sorted ascending."""
    fragmentation: float
    """Population stddev of the per-GPU used ratio (0 = even)."""
    total_mib: float
    sampled_at: float


def node_view(node: NodeGpus, margin: float) -> NodeView:
    usable = [usable_mib(g, margin) for g in node.gpus]
    groups: dict[object, list[float]] = {}
    for i, (g, u) in enumerate(zip(node.gpus, usable, strict=True)):
        groups.setdefault(g.numa if g.numa is not None else ("unknown", i), []).append(u)
    ratios = [min(1.0, g.used_mib / g.total_mib) if g.total_mib > 0 else 1.0 for g in node.gpus]
    mean = sum(ratios) / len(ratios) if ratios else 0.0
    std = math.sqrt(sum((r - mean) ** 2 for r in ratios) / len(ratios)) if ratios else 0.0
    return NodeView(
        name=node.name,
        usable_sum=sum(usable),
        usable_sorted=tuple(sorted(usable)),
        domains=tuple(tuple(sorted(v)) for v in groups.values()),
        fragmentation=round(std, 9),  # equal ratios give 0, not 1e-17
        total_mib=sum(g.total_mib for g in node.gpus),
        sampled_at=node.sampled_at,
    )


def fit_problem(view: NodeView, req: PodRequest) -> str | None:
    """None when the pod fits the node, else the sentence saying why not."""
    if view.usable_sum < req.memory_mib:
        return (
            f"node {view.name} has {math.floor(view.usable_sum)} MiB usable, "
            f"pod requests {req.memory_mib} MiB"
        )
    fitting = len(view.usable_sorted) - bisect.bisect_left(view.usable_sorted, req.per_gpu_mib)
    if fitting < req.gpu_count:
        return (
            f"node {view.name} has {fitting} GPU(s) with {req.per_gpu_mib} MiB usable, "
            f"pod requests {req.gpu_count}"
        )
    return None


def freshness(age: float, ttl: float) -> Literal["fresh", "stale_scored", "stale"]:
    """Fresh within the TTL; scored from the last known state up to 3 TTLs; then stale."""
    if age <= ttl:
        return "fresh"
    return "stale_scored" if age <= 3 * ttl else "stale"


def place(node: NodeGpus, req: PodRequest, margin: float) -> tuple[tuple[str, float], ...]:
    """The GPUs a bind reserves: the tightest fits (big holes stay for big pods) inside one
    NUMA domain when one holds the pod; () when it does not fit."""
    need = req.per_gpu_mib
    fitting = [g for g in node.gpus if usable_mib(g, margin) >= need]
    if len(fitting) < req.gpu_count:
        return ()
    domains: dict[object, list[Gpu]] = {}
    for g in fitting:
        domains.setdefault(g.numa if g.numa is not None else ("unknown", g.uuid), []).append(g)
    groups = [sorted(gs, key=lambda g: (usable_mib(g, margin), g.index)) for gs in domains.values()]
    whole = [gs[: req.gpu_count] for gs in groups if len(gs) >= req.gpu_count]
    if whole:  # one domain holds the pod: the one it fits most tightly
        chosen = min(whole, key=lambda gs: sum(usable_mib(g, margin) for g in gs))
    else:  # across domains: the biggest domains first
        chosen = [g for gs in sorted(groups, key=len, reverse=True) for g in gs]
    share = req.memory_mib / req.gpu_count
    return tuple((g.uuid, share) for g in chosen[: req.gpu_count])


def reservation_expiry(
    reservation: Reservation, node: NodeGpus | None, now: float, ttl: float
) -> str | None:
    """Why the reservation is over, or None: measured memory shows the pod, or TTL."""
    if now - reservation.assumed_at > ttl:
        return "ttl"
    if node is None or node.sampled_at <= reservation.assumed_at:
        return None  # no measurement taken after the bind yet
    used = {g.uuid: g.used_mib for g in node.gpus}
    baseline = dict(reservation.baseline)
    for uuid, mib in reservation.gpus:
        if uuid not in used or used[uuid] - baseline.get(uuid, 0.0) < SHOWN_FRACTION * mib:
            return None
    return "measured"


def request_problem(req: PodRequest, largest_total_mib: float | None) -> str | None:
    """A request no known node could ever hold, named by its annotation."""
    if largest_total_mib is not None and req.memory_mib > largest_total_mib:
        return (
            f"annotation {MEMORY_ANNOTATION}: {req.memory_mib} MiB is more than any node's "
            f"GPU memory ({math.floor(largest_total_mib)} MiB)"
        )
    return None


def reservation_annotations(r: Reservation, assume_time: str) -> dict[str, str]:
    """The annotations a bind writes on the pod (assume_time: RFC 3339 of r.assumed_at)."""
    record = {"node": r.node, "gpus": dict(r.gpus), "baseline": dict(r.baseline)}
    return {
        RESERVED_ANNOTATION: str(round(r.total_mib)),
        ASSUME_TIME_ANNOTATION: assume_time,
        RESERVATION_ANNOTATION: json.dumps(record, sort_keys=True, separators=(",", ":")),
    }


def reservation_from_pod(
    uid: str, namespace: str, name: str, annotations: Mapping[str, str], assumed_at: float
) -> Reservation | None:
    """The reservation a pod's annotations record (None: none; AnnotationError: malformed)."""
    text = annotations.get(RESERVATION_ANNOTATION)
    if text is None:
        return None
    try:
        doc = json.loads(text)
        node = doc["node"]
        gpus = tuple((str(k), float(v)) for k, v in doc["gpus"].items())
        baseline = tuple((str(k), float(v)) for k, v in doc.get("baseline", {}).items())
    except (ValueError, KeyError, TypeError, AttributeError):
        raise AnnotationError(
            f"annotation {RESERVATION_ANNOTATION}: expected JSON with node and gpus"
        ) from None
    if not isinstance(node, str) or not node:
        raise AnnotationError(f"annotation {RESERVATION_ANNOTATION}: node is not a name")
    return Reservation(uid, namespace, name, node, gpus, baseline, assumed_at)


@dataclass(frozen=True)
class NodeMeta:
    name: str
    topology: str | None = None
    gpus_per_numa: str | None = None
    pool: str | None = None


@dataclass(frozen=True)
class PodRecord:
    """A pod of the GPU scheduler as listed: its UID, phase and annotations."""

    uid: str
    namespace: str
    name: str
    phase: str
    annotations: Mapping[str, str]
    assumed_at: float | None
    """Parsed gpu-scheduler/assume-time, None when absent or unreadable."""
    scheduler_name: str = ""
    node_name: str = ""
