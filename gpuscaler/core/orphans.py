"""Which GPU processes did an evicted pod leave behind, and what to do with each.

Pod UID from a cgroup file. The kubelet names a pod's cgroup after its UID
(kubernetes/kubernetes `pkg/kubelet/cm/pod_container_manager_linux.go`, `GetPodContainerName`:
`"pod" + string(pod.UID)`, under the QoS cgroup `kubepods[/burstable|/besteffort]`), and the
systemd driver turns each `/`-separated part into a slice with `-` escaped to `_`
(`pkg/kubelet/cm/cgroup_manager_linux.go`, `ToSystemd` / `escapeSystemdCgroupName`):

    cgroupfs, v1:  11:devices:/kubepods/besteffort/pod0f1e.../<container id>
    cgroupfs, v2:  0::/kubepods/burstable/pod0f1e.../<container id>
    systemd,  v1:  4:memory:/kubepods.slice/kubepods-burstable.slice/
                       kubepods-burstable-pod0f1e..._....slice/cri-containerd-<id>.scope
    systemd,  v2:  0::/kubepods.slice/kubepods-pod0f1e..._....slice/crio-<id>.scope
    in a private cgroup namespace (the agent's own, cgroup v2): 0::/../../kubepods-....slice/...

A UID is the 36-character dashed form, or 32 hex digits (static pods: a hash of the
manifest; their API mirror pod carries it in `kubernetes.io/config.mirror`).

Never a candidate: a process with no pod UID (host services, persistenced, the MPS control
daemon `nvidia-cuda-mps-server`), a process of a pod the API still lists, anything when the
pod lists cannot be trusted (`trusted_pods`), and, while the kubelet runs a pod the API
does not list (a static pod without its mirror: its UID is known to the kubelet only), any
process whose pod the API does not list. A cgroup file that names `kubepods` but no UID we
can read is reported as unknown, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_POD_SEGMENT = re.compile(rf"^(?:kubepods(?:-[a-z]+)*-)?pod(?P<uid>{_UID})(?:\.slice)?$")
_LINE = re.compile(r"^(?P<id>\d+):(?P<controllers>[^:]*):(?P<path>/.*)$")


@dataclass(frozen=True)
class CgroupOwner:
    """Whose process it is, by its cgroup file: a pod (with its UID), the host (no pod),
    or unknown (with the reason)."""

    kind: Literal["pod", "host", "unknown"]
    pod_uid: str | None = None
    reason: str = ""


def _segment_uid(segment: str) -> str | None:
    m = _POD_SEGMENT.match(segment)
    return None if m is None else m.group("uid").replace("_", "-")


def pod_uid_from_cgroup(text: str) -> CgroupOwner:
    """The pod a process belongs to, from the text of its `/proc/<pid>/cgroup`."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return CgroupOwner("unknown", reason="empty cgroup file")
    uids: set[str] = set()
    kubepods = False
    for line in lines:
        m = _LINE.match(line)
        if m is None:
            return CgroupOwner("unknown", reason=f"not a cgroup line: {line[:80]!r}")
        segments = [s for s in m.group("path").split("/") if s and s != ".."]
        kubepods = kubepods or any(s.startswith("kubepods") for s in segments)
        uids.update(u for u in map(_segment_uid, segments) if u is not None)
    if len(uids) > 1:
        return CgroupOwner("unknown", reason=f"several pod UIDs: {', '.join(sorted(uids))}")
    if uids:
        return CgroupOwner("pod", pod_uid=uids.pop())
    if kubepods:
        return CgroupOwner(
            "unknown", reason=f"under kubepods but no pod<uid> segment: {lines[0][:120]!r}"
        )
    return CgroupOwner("host", reason="no kubepods cgroup: not a pod's process")


# --------------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class GpuProc:
    """One compute process on one GPU, with its owner. `start` (clock ticks since boot,
    /proc/<pid>/stat field 22) tells a reused PID from the process first seen."""

    pid: int
    start: int
    gpu: str
    used_mib: float | None
    name: str
    owner: CgroupOwner

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start)


@dataclass(frozen=True)
class OrphanPolicy:
    grace: float
    """An orphan must be seen this long before it is signalled (a pod being replaced, a
    pod list read just before the pod appeared)."""
    kill_timeout: float
    """SIGTERM first; SIGKILL when still alive this long after."""


@dataclass(frozen=True)
class OrphanMemory:
    """What the agent remembers between polls, by (pid, start): when each orphan was first
    seen and when it was sent SIGTERM."""

    first_seen: dict[tuple[int, int], float] = field(default_factory=dict)
    terminated: dict[tuple[int, int], float] = field(default_factory=dict)


@dataclass(frozen=True)
class OrphanAction:
    kind: Literal["sigterm", "sigkill", "wait", "keep", "report"]
    proc: GpuProc
    reason: str


def trusted_pods(
    api_pods: Mapping[str, Collection[str]], kubelet_pods: Collection[str] | None, own: str | None
) -> tuple[frozenset[str] | None, tuple[str, ...], str]:
    """The pod UIDs to judge orphans by and the kubelet's pods the API does not list, from
    this poll's API list ("namespace/name" -> UIDs, a static pod's config UID included) and
    the kubelet's pods ("namespace/name"; None: unread). None and why when the lists are not
    to be trusted: the agent's own pod (`own`, its UID) must be in the API's list, which a
    list that is empty or from before the agent started is not."""
    uids = frozenset(u for us in api_pods.values() for u in us)
    if own is None:
        return None, (), "the agent's own pod UID is unknown (POD_UID unset)"
    if own not in uids:
        return None, (), f"the pod list lacks the agent's own pod {own}: not trusted"
    if kubelet_pods is None:
        return None, (), "the kubelet's pods are unknown (pod-resources unread)"
    return uids, tuple(sorted(set(kubelet_pods) - set(api_pods))), ""


def orphan_actions(
    procs: list[GpuProc],
    live_pod_uids: frozenset[str] | None,
    memory: OrphanMemory,
    now: float,
    policy: OrphanPolicy,
    unlisted: Sequence[str] = (),
) -> tuple[list[OrphanAction], OrphanMemory]:
    """One action per process, and the memory for the next poll. `live_pod_uids` None:
    the pod lists are not trusted, so nothing is an orphan this time. `unlisted`: pods the
    kubelet runs that the API does not list; while there are any, a process whose pod the
    API does not list may be theirs and is reported, never signalled."""
    actions: list[OrphanAction] = []
    first_seen: dict[tuple[int, int], float] = {}
    terminated: dict[tuple[int, int], float] = {}
    for p in procs:
        if p.owner.kind == "unknown":
            actions.append(OrphanAction("report", p, f"cgroup not understood: {p.owner.reason}"))
        elif p.owner.kind == "host" or p.owner.pod_uid is None:
            actions.append(OrphanAction("keep", p, "no pod UID (host process)"))
        elif live_pod_uids is None:
            actions.append(OrphanAction("keep", p, "pod list unknown this poll"))
        elif p.owner.pod_uid in live_pod_uids:
            actions.append(OrphanAction("keep", p, f"pod {p.owner.pod_uid} exists"))
        elif unlisted:
            names = ", ".join(unlisted[:3]) + (" ..." if len(unlisted) > 3 else "")
            why = (
                f"pod {p.owner.pod_uid} is not in the API's list, but the kubelet runs pods "
                f"that are not ({names}; a static pod without its mirror?): it may be theirs"
            )
            actions.append(OrphanAction("report", p, why))
        else:
            seen = memory.first_seen.get(p.key, now)
            first_seen[p.key] = seen
            actions.append(_orphan_step(p, seen, memory.terminated.get(p.key), now, policy))
            if actions[-1].kind == "sigterm":
                terminated[p.key] = now
            elif p.key in memory.terminated:
                terminated[p.key] = memory.terminated[p.key]
    return actions, OrphanMemory(first_seen, terminated)


def _orphan_step(
    p: GpuProc, seen: float, termed: float | None, now: float, policy: OrphanPolicy
) -> OrphanAction:
    gone = f"pod {p.owner.pod_uid} gone"
    if termed is not None:
        if now - termed >= policy.kill_timeout:
            limit = f"(limit {policy.kill_timeout:.0f}s)"
            why = f"{gone}; still alive {now - termed:.0f}s after SIGTERM {limit}"
            return OrphanAction("sigkill", p, why)
        return OrphanAction("wait", p, f"{gone}; SIGTERM sent {now - termed:.0f}s ago")
    if now - seen >= policy.grace:
        why = f"{gone}; orphan for {now - seen:.0f}s (grace {policy.grace:.0f}s)"
        return OrphanAction("sigterm", p, why)
    return OrphanAction(
        "wait", p, f"{gone}; orphan for {now - seen:.0f}s of {policy.grace:.0f}s grace"
    )
