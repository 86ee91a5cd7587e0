"""Sharing under DRA, read: the DeviceClasses and ResourceClaimTemplates that opted in to a
pool's sharing (label `kubernetes.dra.pool_label` = the pool's name) and what they say the
pool runs. A template's claims each request a share of a device (consumable capacity,
`capacity.requests.memory` or `.shares`), so its fragments are the device's capacity over
that request; a class's NVIDIA GpuConfig (kubernetes-sigs/dra-driver-nvidia-gpu
api/nvidia.com/resource/v1beta1/sharing.go, gpuconfig.go) sets the time slice interval
(TimeSlicing) or the active thread percentage of MPS clients.

What is written back (`drapools.py`) is built here too, so reading and writing share one
reading of each field.
"""

from __future__ import annotations

import copy
import json
import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuscaler.adapters.kube.dra import (
    RESULTS_MAX,
    SUBREQUESTS_MAX,
    as_dict,
    as_list,
    quantity,
)
from gpuscaler.config import TIME_SLICE_LEVELS, Config

Json = dict[str, Any]

GPU_CONFIG = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}
"""The NVIDIA driver's opaque config (api.go: GroupName, Version, GpuConfigKind)."""
INTERVALS: dict[str, str] = {level: level.capitalize() for level in TIME_SLICE_LEVELS}
"""gpuscaler's levels as TimeSliceInterval (Default, Short, Medium, Long: sharing.go)."""
STRATEGIES = {"time-slicing": "TimeSlicing", "mps": "MPS"}
SHARE_KEYS = ("memory", "shares")
"""Capacities a claim requests a share of (consumable_shares.go: `memory` in bytes, step
1Mi; `shares` out of the driver's --consumable-shares=N, step 1)."""
CONFIGS_MAX = 32
"""DeviceConfigMaxSize: a class's or claim's spec.config entries."""
MIB = float(1 << 20)
DECISION = {
    "fragments": "gpuscaler.io/last-fragments-decision",
    "time_slice": "gpuscaler.io/last-time-slice-decision",
}
"""The decision last written into an object, as JSON (the nodes' annotations' names)."""


@dataclass(frozen=True)
class Opted:
    """A DeviceClass or ResourceClaimTemplate that opted in to a pool's sharing."""

    kind: str
    namespace: str
    name: str
    pool: str
    doc: Json
    """The object as read: what a rewrite starts from."""
    shares: Mapping[str, float] = field(default_factory=dict)
    """A template's request per claim, by capacity name (the smallest of its requests)."""
    level: str | None = None
    """A class's time slice level ("default" when its GpuConfig sets none)."""
    mps_percent: int | None = None
    problem: str | None = None

    @property
    def where(self) -> str:
        return f"{self.kind} {self.namespace + '/' if self.namespace else ''}{self.name}"

    def decision(self, kind: str) -> tuple[float, str] | None:
        """(time, to) of the last decision of `kind` written into it."""
        meta = self.doc.get("metadata") or {}
        try:
            record = json.loads((meta.get("annotations") or {})[DECISION[kind]])
            return float(record["time"]), str(record["to"])
        except (KeyError, ValueError, TypeError):
            return None


def asks(spec: Json, where: str) -> list[Json]:
    """The device requests of a claim spec (`exactly`, and each `firstAvailable` one)."""
    devices = as_dict(as_dict(spec, where).get("devices"), f"{where} devices")
    out = []
    for i, r in enumerate(as_list(devices.get("requests"), RESULTS_MAX, f"{where} requests")):
        r = as_dict(r, f"{where} requests[{i}]")
        if r.get("exactly") is not None:
            out.append(as_dict(r["exactly"], f"{where} requests[{i}]"))
        out += [as_dict(s, where) for s in as_list(r.get("firstAvailable"), SUBREQUESTS_MAX, where)]
    return out


def gpu_config(doc: Json, drivers: Collection[str]) -> tuple[int | None, Json | None]:
    """The index in spec.config and parameters of a class's opaque config for a GPU driver."""
    where = f"DeviceClass {(doc.get('metadata') or {}).get('name')}"
    configs = as_list(as_dict(doc.get("spec"), where).get("config"), CONFIGS_MAX, f"{where} config")
    for i, c in enumerate(configs):
        opaque = as_dict(as_dict(c, f"{where} config[{i}]").get("opaque"), f"{where} config[{i}]")
        if opaque.get("driver") in drivers:
            return i, as_dict(opaque.get("parameters"), f"{where} config[{i}] parameters")
    return None, None


def _parse(obj: Json, kind: str, pool: str, config: Config) -> Opted:
    meta = obj.get("metadata") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name"))
    opted = Opted(kind, ns, name, pool, obj)
    try:
        if kind == "ResourceClaimTemplate":
            spec = as_dict(as_dict(obj.get("spec"), f"{opted.where} spec").get("spec"), opted.where)
            shares: dict[str, float] = {}
            for ask in asks(spec, opted.where):
                at = f"{opted.where} capacity.requests"
                wanted = as_dict(as_dict(ask.get("capacity"), at).get("requests"), at)
                for key in SHARE_KEYS:
                    if key in wanted:
                        value = quantity(wanted[key], f"{opted.where} capacity.requests.{key}")
                        shares[key] = min(shares.get(key, value), value)
            if not shares:
                return replace(opted, problem=f"{opted.where} requests no share (memory, shares)")
            return replace(opted, shares=shares)
        _, params = gpu_config(obj, config.kubernetes.dra.drivers)
        sharing = as_dict((params or {}).get("sharing"), f"{opted.where} GpuConfig sharing")
        interval = as_dict(sharing.get("timeSlicingConfig"), opted.where).get("interval")
        percent = as_dict(sharing.get("mpsConfig"), opted.where).get(
            "defaultActiveThreadPercentage"
        )
        level = str(interval or "Default").lower()
        valid = percent is None or (isinstance(percent, int) and 0 <= percent <= 100)
        if level not in INTERVALS or not valid:  # the driver's own bounds (validate.go)
            raise ValueError(f"{opted.where}: GpuConfig interval {interval!r} or MPS {percent!r}")
        return replace(opted, level=level, mps_percent=percent)
    except ValueError as e:
        return replace(opted, problem=str(e))


def parse_opted(items: Iterable[Json], config: Config) -> tuple[Opted, ...]:
    """The classes and templates labelled for a configured pool; other ones are ignored."""
    label = config.kubernetes.dra.pool_label
    pools = {p.name for p in config.node_pools}
    out = []
    for obj in items:
        pool = ((obj.get("metadata") or {}).get("labels") or {}).get(label)
        if pool in pools:
            out.append(_parse(obj, str(obj.get("kind")), pool, config))
    return tuple(out)


def share_value(capacity: float, fragments: int, key: str) -> float:
    """What each claim requests for `fragments` claims to a device: the capacity over them,
    down to the driver's step (1Mi of memory, one share)."""
    step = MIB if key == "memory" else 1.0
    return max(step, math.floor(capacity / fragments / step) * step)


@dataclass(frozen=True)
class PoolSharing:
    fragments: int | None
    level: str | None
    problem: str | None


def _agreed(objs: list[Opted], kind: str, values: list[str]) -> str | None:
    """The value all agree on, else the newest decision's target, else the commonest."""
    if not values:
        return None
    if len(set(values)) == 1:
        return values[0]
    targets = [t for o in objs if (t := o.decision(kind)) is not None]
    return max(targets)[1] if targets else Counter(values).most_common(1)[0][0]


def pool_sharing(
    opted: Iterable[Opted], pool: str, capacity: Mapping[str, float]
) -> PoolSharing | None:
    """The fragments and time slice level the pool's opted-in objects give new claims: the
    templates' shares of `capacity` (the pool's smallest device capacities), else the MPS
    classes' thread percentage; None when none opted in."""
    mine = [o for o in opted if o.pool == pool]
    if not mine:
        return None
    bad = next((o.problem for o in mine if o.problem), None)
    templates = [o for o in mine if o.kind == "ResourceClaimTemplate"]
    counts = []
    for o in templates:
        for key, asked in o.shares.items():
            if not capacity.get(key):
                bad = bad or f"{o.where} requests {key}, which pool {pool}'s devices do not publish"
            else:
                counts.append(str(max(1, round(capacity[key] / asked))))
    classes = [o for o in mine if o.kind == "DeviceClass"]
    if not counts:  # no share size: under MPS, the clients' thread percentage
        counts = [str(round(100 / o.mps_percent)) for o in classes if o.mps_percent]
    fragments = _agreed(templates or classes, "fragments", counts)
    level = _agreed(classes, "time_slice", [o.level or "default" for o in classes])
    return PoolSharing(int(fragments) if fragments else None, level, bad)


KEPT_META = ("name", "namespace", "labels", "annotations", "ownerReferences", "finalizers")
"""What a replaced template keeps of its metadata (the server sets the rest)."""


def quantity_text(value: float, key: str) -> str:
    return f"{int(value // MIB)}Mi" if key == "memory" else str(int(value))


def template_body(o: Opted, fragments: int, capacity: Mapping[str, float]) -> Json | None:
    """The template again with every share request set for `fragments` (ValueError when the
    devices publish no such capacity); None when it has them."""
    doc = copy.deepcopy(o.doc)
    spec = (doc.get("spec") or {}).get("spec") or {}
    changed = False
    for ask in asks(spec, o.where):
        wanted = (ask.get("capacity") or {}).get("requests") or {}
        for key in SHARE_KEYS:
            if key in wanted:
                if not capacity.get(key):
                    raise ValueError(f"{o.where}: pool {o.pool}'s devices publish no {key}")
                value = share_value(capacity[key], fragments, key)
                if quantity(wanted[key], o.where) != value:  # the server writes 1024Mi as 1Gi
                    wanted[key], changed = quantity_text(value, key), True
    if not changed:
        return None
    meta = doc.get("metadata") or {}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {k: meta[k] for k in KEPT_META if k in meta},
        "spec": doc["spec"],
    }


def class_body(o: Opted, strategy: str, kind: str, value: str, config: Config) -> Json | None:
    """A merge patch setting the class's GpuConfig to `value` (the time slice interval, or
    under MPS the active thread percentage of `value` fragments), its other settings and
    other drivers' configs kept; None when it has it. ValueError when its GpuConfig shares
    by another strategy than the pool's: that is the operator's to change."""
    drivers = config.kubernetes.dra.drivers
    configs = copy.deepcopy(((o.doc.get("spec") or {}).get("config")) or [])
    index, params = gpu_config(o.doc, drivers)
    params = copy.deepcopy(params) if params else dict(GPU_CONFIG)
    sharing = params.get("sharing") or {}
    if sharing.get("strategy", strategy) != strategy:
        raise ValueError(
            f"{o.where}: its GpuConfig shares by {sharing['strategy']}, not {strategy}"
        )
    if kind == "time_slice":
        sharing = {"strategy": strategy, "timeSlicingConfig": {"interval": INTERVALS[value]}}
    else:
        mps = sharing.get("mpsConfig") or {}
        sharing = {
            "strategy": strategy,
            "mpsConfig": {**mps, "defaultActiveThreadPercentage": 100 // int(value)},
        }
    if params.get("sharing") == sharing:
        return None
    params["sharing"] = sharing
    if index is None:
        configs.append({"opaque": {"driver": drivers[0], "parameters": params}})
    else:
        configs[index]["opaque"]["parameters"] = params
    meta = o.doc.get("metadata") or {}
    return {
        "metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {}},
        "spec": {"config": configs},
    }
