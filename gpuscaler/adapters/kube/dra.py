"""GPUs allocated by Dynamic Resource Allocation (resource.k8s.io/v1), read only: the
devices drivers publish in ResourceSlices, the devices ResourceClaims were allocated and
the pods each claim is reserved for. Field names and list bounds are those of
kubernetes/kubernetes staging/src/k8s.io/api/resource/v1/types.go (k8s.io/api v0.37.2);
the NVIDIA driver's device attributes and capacity those of
kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/deviceinfo.go (`type`,
`productName`) and partitions.go (`memory`, bytes).

An object over a bound the API server enforces is refused (ValueError naming it), never
cut short: a GPU read as free while it is held is how preemption would choose wrongly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from gpuscaler.config import DraConfig
from gpuscaler.core.preemption import DeviceHold

Json = dict[str, Any]

SLICE_DEVICES_MAX = 128
"""ResourceSliceMaxDevices."""
DEVICE_FIELDS_MAX = 32
"""ResourceSliceMaxAttributesAndCapacitiesPerDevice."""
RESULTS_MAX = 32
"""AllocationResultsMaxSize (and DeviceRequestsMaxSize)."""
SUBREQUESTS_MAX = 8
"""FirstAvailableDeviceRequestMaxSize."""
RESERVED_MAX = 256
"""ResourceClaimReservedForMaxSize."""
POD_CLAIMS_MAX = 128
"""A pod's spec.resourceClaims read at most (the API sets no maximum; we bound our work)."""
MEMORY = "memory"
"""The NVIDIA driver's capacity name for a GPU's memory, in bytes."""
GIB = float(1 << 30)

DeviceKey = tuple[str, str, str]
"""(driver, pool, device): how an allocation result names a device."""


@dataclass(frozen=True)
class Device:
    """A GPU a driver publishes."""

    driver: str
    pool: str
    name: str
    node: str | None
    """Its node (slice or device nodeName); None for network-attached devices."""
    whole_gpu: bool
    """Counts as one of its node's GPUs (`type` in `gpu_types`, or no type)."""
    capacity: Mapping[str, float]
    generation: int = 0
    """Its pool's generation: only the newest generation of a pool is current."""
    product: str | None = None
    shared: bool = False
    """allowMultipleAllocations: several claims may consume parts of its capacity."""

    @property
    def key(self) -> DeviceKey:
        return self.driver, self.pool, self.name


@dataclass(frozen=True)
class Allocated:
    driver: str
    pool: str
    device: str
    consumed: Mapping[str, float]
    """consumedCapacity (consumable capacity, KEP 5075); empty: the whole device."""


@dataclass(frozen=True)
class Claim:
    """A ResourceClaim's GPU part."""

    namespace: str
    name: str
    holders: frozenset[str]
    """UIDs of the pods in status.reservedFor."""
    allocated: bool
    gpus: tuple[Allocated, ...]
    """Its allocated devices that are GPUs."""
    wanted: int
    """GPUs its requests for GPU DeviceClasses ask for (the preferred alternative)."""
    capacity: Mapping[str, float] = field(default_factory=dict)
    """What it asks of each such device (consumable capacity, the largest request's per
    name); empty: whole devices."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _list(value: Any, bound: int, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{where}: not a list")
    if len(value) > bound:
        raise ValueError(f"{where}: {len(value)} entries, over the API's bound of {bound}")
    return value


def _dict(value: Any, where: str) -> Json:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where}: not an object")
    return value


def _quantity(value: Any, where: str) -> float:
    try:
        return float(parse_quantity(value))  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, ArithmeticError):
        raise ValueError(f"{where}: {value!r} is not a quantity") from None


as_dict, as_list, quantity = _dict, _list, _quantity
"""The same checks for the readers of other DRA objects (drashare.py)."""


def _name(obj: Json, kind: str) -> tuple[str, str]:
    meta = _dict(obj.get("metadata"), kind)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind}: no metadata.name")
    return str(meta.get("namespace") or ""), name


def parse_slice(obj: Json, config: DraConfig) -> tuple[Device, ...]:
    """The devices of a ResourceSlice of a GPU driver; () for another driver's."""
    where = f"ResourceSlice {_name(obj, 'ResourceSlice')[1]}"
    spec = _dict(obj.get("spec"), f"{where} spec")
    driver = spec.get("driver")
    if driver not in config.drivers:
        return ()
    pool = _dict(spec.get("pool"), f"{where} spec.pool")
    generation = pool.get("generation", 0)
    if not isinstance(pool.get("name"), str) or not isinstance(generation, int):
        raise ValueError(f"{where}: spec.pool needs a name and an integer generation")
    node = spec.get("nodeName")
    out = []
    for i, d in enumerate(_list(spec.get("devices"), SLICE_DEVICES_MAX, f"{where} devices")):
        at = f"{where} devices[{i}]"
        d = _dict(d, at)
        attrs = _dict(d.get("attributes"), f"{at} attributes")
        caps = _dict(d.get("capacity"), f"{at} capacity")
        if not isinstance(d.get("name"), str) or len(attrs) + len(caps) > DEVICE_FIELDS_MAX:
            raise ValueError(
                f"{at}: no name, or over {DEVICE_FIELDS_MAX} attributes and capacities"
            )
        kind = _dict(attrs.get("type") or attrs.get(f"{driver}/type"), f"{at} type").get("string")
        product = _dict(attrs.get("productName"), f"{at} productName").get("string")
        out.append(
            Device(
                driver=driver,
                pool=pool["name"],
                name=d["name"],
                node=d.get("nodeName") or node,
                whole_gpu=kind is None or kind in config.gpu_types,
                capacity={
                    k: _quantity(_dict(v, f"{at} capacity.{k}").get("value"), f"{at} capacity.{k}")
                    for k, v in caps.items()
                },
                generation=generation,
                product=product if isinstance(product, str) else None,
                shared=d.get("allowMultipleAllocations") is True,
            )
        )
    return tuple(out)


def _wanted(request: Json, config: DraConfig, at: str) -> tuple[int, dict[str, float]]:
    """GPUs one request asks for, and the capacity of each it asks (consumable capacity;
    empty: whole devices): its own, or its first (preferred) alternative's."""
    exactly = request.get("exactly")
    first = _list(request.get("firstAvailable"), SUBREQUESTS_MAX, f"{at} firstAvailable")
    ask = _dict(exactly if exactly is not None else (first or [None])[0], at)
    if ask.get("deviceClassName") not in config.device_classes:
        return 0, {}
    asked = _dict(_dict(ask.get("capacity"), f"{at} capacity").get("requests"), f"{at} capacity")
    capacity = {k: _quantity(v, f"{at} capacity.requests.{k}") for k, v in asked.items()}
    if ask.get("allocationMode", "ExactCount") != "ExactCount":
        return 1, capacity  # All: every matching device, how many is known once allocated
    count = ask.get("count", 1)
    if not isinstance(count, int) or count < 0:
        raise ValueError(f"{at}: count {count!r} is not a count")
    return count, capacity


def parse_claim(obj: Json, config: DraConfig) -> Claim | None:
    """The claim's GPUs, allocated and wanted; None when it has nothing to do with GPUs."""
    namespace, name = _name(obj, "ResourceClaim")
    where = f"ResourceClaim {namespace}/{name}"
    devices = _dict(_dict(obj.get("spec"), f"{where} spec").get("devices"), f"{where} devices")
    requests = _list(devices.get("requests"), RESULTS_MAX, f"{where} spec.devices.requests")
    classes: dict[str, Any] = {}
    wanted = 0
    capacity: dict[str, float] = {}
    for i, r in enumerate(requests):
        at = f"{where} requests[{i}]"
        r = _dict(r, at)
        count, asked = _wanted(r, config, at)
        wanted += count
        for k, v in asked.items():
            capacity[k] = max(capacity.get(k, 0.0), v)
        classes[str(r.get("name"))] = _dict(r.get("exactly"), at).get("deviceClassName")
        for sub in _list(r.get("firstAvailable"), SUBREQUESTS_MAX, at):
            sub = _dict(sub, at)
            classes[f"{r.get('name')}/{sub.get('name')}"] = sub.get("deviceClassName")
    status = _dict(obj.get("status"), f"{where} status")
    allocation = status.get("allocation")
    results = _dict(_dict(allocation, f"{where} allocation").get("devices"), where).get("results")
    gpus = []
    for i, res in enumerate(_list(results, RESULTS_MAX, f"{where} allocation results")):
        at = f"{where} results[{i}]"
        res = _dict(res, at)
        if res.get("driver") not in config.drivers and (
            classes.get(str(res.get("request"))) not in config.device_classes
        ):
            continue
        if not all(isinstance(res.get(k), str) for k in ("driver", "pool", "device")):
            raise ValueError(f"{at}: driver, pool and device must be strings")
        consumed = _dict(res.get("consumedCapacity"), f"{at} consumedCapacity")
        gpus.append(
            Allocated(
                res["driver"],
                res["pool"],
                res["device"],
                {k: _quantity(v, f"{at} consumedCapacity.{k}") for k, v in consumed.items()},
            )
        )
    if not gpus and not wanted:
        return None
    reserved = _list(status.get("reservedFor"), RESERVED_MAX, f"{where} reservedFor")
    holders = frozenset(
        str(ref.get("uid"))
        for ref in reserved
        if isinstance(ref, dict) and ref.get("resource") == "pods" and ref.get("uid")
    )
    return Claim(namespace, name, holders, allocation is not None, tuple(gpus), wanted, capacity)


def current(devices: Iterable[Device]) -> dict[DeviceKey, Device]:
    """The devices of each pool's newest generation (a driver replacing a pool's slices
    bumps it; the older slices are stale until deleted), by their key."""
    devices = list(devices)
    newest: dict[tuple[str, str], int] = {}
    for d in devices:
        newest[d.driver, d.pool] = max(newest.get((d.driver, d.pool), d.generation), d.generation)
    return {d.key: d for d in devices if d.generation == newest[d.driver, d.pool]}


@dataclass(frozen=True)
class NodeGpus:
    """A node's whole GPUs, as its driver publishes them."""

    keys: tuple[str, ...]
    """driver/pool/device of each."""
    capacity: Mapping[str, float]
    """The smallest capacity of each name among them (a share fits every one)."""
    shared: Mapping[str, Mapping[str, float]]
    """The capacity of each that several claims may share (allowMultipleAllocations)."""


def node_gpus(devices: Mapping[DeviceKey, Device]) -> dict[str, NodeGpus]:
    """Per node, its whole GPUs (MIG devices of the same GPUs are not counted again)."""
    keys: dict[str, list[str]] = {}
    capacity: dict[str, dict[str, float]] = {}
    shared: dict[str, dict[str, Mapping[str, float]]] = {}
    for d in devices.values():
        if d.node is None or not d.whole_gpu:
            continue
        key = "/".join(d.key)
        keys.setdefault(d.node, []).append(key)
        smallest = capacity.setdefault(d.node, {})
        for k, v in d.capacity.items():
            smallest[k] = min(smallest.get(k, v), v)
        if d.shared:
            shared.setdefault(d.node, {})[key] = d.capacity
    return {
        node: NodeGpus(tuple(sorted(k)), capacity[node], shared.get(node, {}))
        for node, k in keys.items()
    }


def pod_gpus(
    uid: str,
    namespace: str,
    claim_names: Iterable[str],
    claims: Mapping[str, Claim],
    devices: Mapping[DeviceKey, Device],
) -> tuple[tuple[DeviceHold, ...], int, dict[str, float]]:
    """The GPU devices a pod holds (its claims allocated and reserved for it), the GPUs
    its claims not allocated yet ask for, and what they ask of each (empty: whole)."""
    holds: list[DeviceHold] = []
    wanted = 0
    asked: dict[str, float] = {}
    for name in claim_names:
        claim = claims.get(f"{namespace}/{name}")
        if claim is None:
            continue
        if not claim.allocated:
            wanted += claim.wanted
            for k, v in claim.capacity.items():
                asked[k] = max(asked.get(k, 0.0), v)
            continue
        if uid not in claim.holders:
            continue
        for a in claim.gpus:
            device = devices.get((a.driver, a.pool, a.device))
            capacity = device.capacity if device is not None else {}
            parts = [v / capacity[k] for k, v in a.consumed.items() if capacity.get(k)]
            memory = a.consumed.get(MEMORY, capacity.get(MEMORY))
            holds.append(
                DeviceHold(
                    a.driver,
                    a.pool,
                    a.device,
                    claim.key,
                    device.node if device is not None else None,
                    min(1.0, max(parts)) if parts else 1.0,
                    memory / GIB if memory is not None else None,
                )
            )
    return tuple(holds), wanted, asked
