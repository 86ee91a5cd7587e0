"""What preemption observes: pods, nodes, the stored victim records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

FORECAST_PREFIX: Final = "forecast:"
"""Beneficiaries that are replicas a forecast asks for, not pods (yet)."""
FRAGMENTS_PREFIX: Final = "fragments:"
"""Beneficiaries that are fewer fragments on a node, not pods."""


@dataclass(frozen=True)
class DeviceHold:
    """One device a pod holds through a Dynamic Resource Allocation claim."""

    driver: str
    pool: str
    device: str
    claim: str
    """namespace/name of the ResourceClaim."""
    node: str | None
    share: float = 1.0
    """Part of the device the claim consumed (consumable capacity); 1: all of it."""
    memory_gib: float | None = None
    """GPU memory it holds: the consumed memory, else the device's, when published."""

    @property
    def key(self) -> str:
        """driver/pool/device: how a NodeView names the device."""
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True)
class PodView:
    """What preemption needs to know of a pod holding or wanting GPUs."""

    key: str  # namespace/name
    namespace: str
    node: str | None
    gpus: int
    priority: int
    phase: str
    start_time: float | None = None
    unschedulable_since: float | None = None
    """Since PodScheduled=False, Unschedulable."""
    terminating_since: float | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    opted_out: bool = False
    """Annotation gpuscaler.io/preemptible: "false"."""
    preemption_never: bool = False
    """Its PriorityClass has preemptionPolicy: Never."""
    pdb_blocked: bool = False
    """A PodDisruptionBudget selecting it allows no disruption now."""
    checkpoint_at: float | None = None
    """gpuscaler.io/last-checkpoint."""
    checkpoint_done_at: float | None = None
    """gpuscaler.io/checkpoint-done: a requested checkpoint acknowledged."""
    gpu_memory_gib: float | None = None
    """gpuscaler.io/gpu-memory-gib: per share."""
    pool: str | None = None
    """For a replica the forecast asks for: the only node pool it may go to."""
    only_node: str | None = None
    allowed_nodes: frozenset[str] | None = None
    """Nodes its nodeSelector, required affinity and tolerations admit; None: any."""
    shrink_to: int | None = None
    """For fewer fragments on `only_node`: its shares after the change."""
    uid: str = ""
    devices: tuple[DeviceHold, ...] = ()
    """Its GPUs allocated by DRA (counted in `gpus` too)."""
    wanted_devices: int = 0
    """GPU devices its claims not allocated yet ask for (counted in `gpus` too): a
    beneficiary with some is placed by freeing devices, not shares."""
    wanted_capacity: Mapping[str, float] = field(default_factory=dict)
    """What they ask of each device (consumable capacity); empty: whole devices."""

    @property
    def gone(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True)
class NodeView:
    name: str
    shares: int
    """GPU shares the node advertises (GPUs x fragments)."""
    share_memory_gib: float | None
    """Usable GPU memory per share (after the reserve), when known."""
    numa_domain_shares: int | None = None
    """Shares of the GPUs in one NUMA domain, when the topology is known (label
    gpuscaler.io/gpus-per-numa-node): a multi-GPU pod must fit inside one domain."""
    pool: str | None = None
    devices: tuple[str, ...] = ()
    """Its whole GPUs published through DRA (driver/pool/device)."""
    allocated: frozenset[str] = frozenset()
    """Those of `devices` some ResourceClaim is allocated (held, or not released yet)."""
    plugin: bool = True
    """Its device plugin advertises GPUs (False: all are DRA's, no pod asking for
    `nvidia.com/gpu` shares fits)."""
    shared: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """The capacity of each of `devices` several claims may share (consumable capacity)."""


@dataclass(frozen=True)
class VictimState:
    """One victim's progress, as stored in the cluster."""

    victim: str
    beneficiary: str
    node: str
    gpus: int
    priority: int
    tier: str
    since: float
    """When the current tier began."""
    requested_at: float
    """When the victim was chosen (tier soft began)."""
    reason: str = ""
    evicted_at: float | None = None
    attempts: int = 0
    last_attempt_at: float | None = None
    gone_at: float | None = None
    uid: str = ""
    """The victim pod's metadata.uid: a pod of its name with another UID is a replacement,
    never touched ("": match by name)."""


@dataclass(frozen=True)
class PreemptionObservation:
    pods: tuple[PodView, ...] = ()
    nodes: tuple[NodeView, ...] = ()
    states: tuple[VictimState, ...] = ()
    memory_released: Mapping[str, bool | None] = field(default_factory=dict)
    """Per victim in cleanup: True released, False held on a GPU with no pod, None not
    measurable (no per-pod dcgm series, or Prometheus down)."""
    claim_holders: frozenset[str] = frozenset()
    """UIDs of pods an allocated DRA GPU claim is still reserved for: a victim's devices
    are free only once its UID has left this set (its claims deallocated or deleted)."""
    problem: str | None = None
    """Set when the cluster could not be read: nothing is decided."""
