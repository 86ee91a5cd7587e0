"""The node agent's other decisions, pure: which time slice to apply to which GPU, the GPU
topology annotation, and whether the `gpu-memory-held` quarantine may be lifted.

The agent observes (node labels and taints, NVML, sysfs) and passes plain data in; it
carries out what these return.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuscaler.config import TIME_SLICE_LEVELS
from gpuscaler.core.orphans import OrphanAction

# `nvidia-smi compute-policy --set-timeslice` takes 0-3 for TIME_SLICE_LEVELS in that order
# (interfaces.md: NVIDIA publishes no durations; MIG devices refuse it).


@dataclass(frozen=True)
class GpuFacts:
    uuid: str
    index: int
    pci_bus_id: str
    memory_total_mib: int
    memory_used_mib: float
    mig: bool
    numa_node: int
    """-1: unknown (no sysfs entry, or the kernel says -1)."""


# --------------------------------------------------------------------------- time slice


@dataclass(frozen=True)
class TimeSlicePlan:
    level: str | None
    """The level the node label asks for; None: nothing asked (or a bad label)."""
    apply: tuple[tuple[str, int], ...] = ()
    """(GPU UUID, nvidia-smi level 0-3) to set now."""
    skipped: tuple[tuple[str, str], ...] = ()
    """(GPU UUID, why it is not set)."""
    problem: str | None = None


def time_slice_plan(
    label: str | None, gpus: Sequence[GpuFacts], applied: Mapping[str, str]
) -> TimeSlicePlan:
    """What to set so every GPU has the label's level. `applied` is what this agent set
    since it started (empty at start: the slice is re-applied after a restart, as a GPU
    reset or reboot loses it); a GPU already at the level is left alone."""
    if label is None:
        return TimeSlicePlan(None)
    if label not in TIME_SLICE_LEVELS:
        return TimeSlicePlan(
            None, problem=f"label value {label!r} is not one of {', '.join(TIME_SLICE_LEVELS)}"
        )
    level = TIME_SLICE_LEVELS.index(label)
    apply, skipped = [], []
    for g in sorted(gpus, key=lambda g: g.index):
        if g.mig:
            skipped.append((g.uuid, "MIG mode is on: a MIG GPU has no time slice setting"))
        elif applied.get(g.uuid) != label:
            apply.append((g.uuid, level))
    return TimeSlicePlan(label, tuple(apply), tuple(skipped))


def applied_annotation(
    plan: TimeSlicePlan, failed: Mapping[str, str], current: str | None
) -> str | None:
    """The `time-slice-applied` annotation after carrying out `plan`: the level when no GPU
    failed, else what it was (a failure leaves the label unapplied)."""
    if plan.level is None or failed:
        return current
    return plan.level


# --------------------------------------------------------------------------- topology


def topology_annotation(gpus: Sequence[GpuFacts]) -> str:
    """The `TOPOLOGY_ANNOTATION` value: a JSON list, one object per GPU by index, keys
    uuid, index, pci_bus_id, memory_mib, numa_node (the extender and preemption read it)."""
    return json.dumps(
        [
            {
                "uuid": g.uuid,
                "index": g.index,
                "pci_bus_id": g.pci_bus_id,
                "memory_mib": g.memory_total_mib,
                "numa_node": g.numa_node,
            }
            for g in sorted(gpus, key=lambda g: g.index)
        ],
        separators=(",", ":"),
    )


# --------------------------------------------------------------------------- quarantine


@dataclass(frozen=True)
class QuarantineDecision:
    quarantined: bool
    """The node carries the taint or the cleanup label."""
    lift: bool
    reason: str


def quarantine_decision(
    quarantined: bool,
    gpus: Sequence[GpuFacts],
    actions: Sequence[OrphanAction] | None,
    released_below_mib: float,
) -> QuarantineDecision:
    """Lift the quarantine when every GPU is clean, as the controller judges release
    (`preemption.released_below_mib`): at or below the threshold, or used by a pod that
    exists. An orphan still alive, or a process whose owner is unknown, keeps it; so does
    a poll whose pod list could not be read (`actions` None)."""
    if not quarantined:
        return QuarantineDecision(False, False, "not quarantined")
    if actions is None:
        return QuarantineDecision(True, False, "pods on the node unknown this poll")
    held: list[str] = []
    for g in sorted(gpus, key=lambda g: g.index):
        on_gpu = [a for a in actions if a.proc.gpu == g.uuid]
        pending = [a for a in on_gpu if a.kind in ("sigterm", "sigkill", "wait", "report")]
        if pending:
            pids = ", ".join(str(a.proc.pid) for a in pending)
            held.append(f"GPU {g.index}: process(es) {pids} not cleaned up")
            continue
        in_use_by_pod = any(a.proc.owner.kind == "pod" for a in on_gpu)  # kept: pod exists
        if g.memory_used_mib > released_below_mib and not in_use_by_pod:
            host = ", ".join(f"{a.proc.pid} ({a.proc.name})" for a in on_gpu) or "none listed"
            held.append(
                f"GPU {g.index}: {g.memory_used_mib:.0f} MiB used > {released_below_mib:.0f} "
                f"with no pod on it (host processes: {host})"
            )
    if held:
        return QuarantineDecision(True, False, "memory still held: " + "; ".join(held))
    clean = f"every GPU at or below {released_below_mib:.0f} MiB or used by a live pod"
    return QuarantineDecision(True, True, clean)


def gpus_per_numa_domain(annotation: str | None) -> int | None:
    """GPUs in the smallest NUMA domain of a node (so no fit is promised that only a larger
    domain could give); None when the annotation is absent, malformed or a domain unknown
    (-1): then the `gpuscaler.io/gpus-per-numa-node` label is the fallback."""
    if not annotation:
        return None
    try:
        gpus = json.loads(annotation)
        domains = [int(g["numa_node"]) for g in gpus]
    except (ValueError, TypeError, KeyError):
        return None
    if not domains or min(domains) < 0:
        return None
    return min(domains.count(d) for d in set(domains))
