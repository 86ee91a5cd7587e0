"""One poll of the node agent: observe (node, NVML, /proc, /sys, pods, pod-resources),
decide (gpuscaler.core.orphans, gpuscaler.core.node_agent), act (annotations, nvidia-smi,
signals, the quarantine), and report (Events, metrics, logs).

A part that cannot be read skips what depends on it and says so; the other parts go on.
Nothing is killed, set or lifted in dry-run or on a node without `gpuscaler.io/enabled=true`:
it is reported instead. The topology annotation is published in both (an observation, not
an action; the extender and preemption read it).

An orphan is signalled through a pidfd (never a reused PID), with an Event when the signal
is sent and when its memory is freed; each finding is reported once, not every poll.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from gpuscaler.adapters.host import HostFs
from gpuscaler.adapters.kube.api import KubeError
from gpuscaler.adapters.kube.objects import OPT_IN_LABEL
from gpuscaler.adapters.node import GPU_TOPOLOGY, TIME_SLICE_APPLIED, NodeApi, NodeView
from gpuscaler.adapters.nvidia_smi import SmiResult, set_timeslice
from gpuscaler.adapters.nvml import Nvml, NvmlError
from gpuscaler.adapters.podresources import KubeletPods, PodResourcesError
from gpuscaler.agent.metrics import AgentMetrics
from gpuscaler.config import Config
from gpuscaler.core.node_agent import (
    GpuFacts,
    TimeSlicePlan,
    applied_annotation,
    quarantine_decision,
    time_slice_plan,
    topology_annotation,
)
from gpuscaler.core.orphans import (
    GpuProc,
    OrphanAction,
    OrphanMemory,
    OrphanPolicy,
    orphan_actions,
    pod_uid_from_cgroup,
    trusted_pods,
)

log = logging.getLogger("gpuscaler.agent")
T = TypeVar("T")

_SIGNALS = {"sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}


def _mib(value: float | None) -> str:
    return "unknown MiB" if value is None else f"{value:.0f} MiB"


@dataclass
class PollReport:
    """What one poll saw and did (for logs and tests)."""

    gpus: list[GpuFacts] = field(default_factory=list)
    actions: list[OrphanAction] | None = None
    time_slice_set: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    lifted: bool = False


class NodeAgent:
    def __init__(
        self,
        config: Config,
        node: NodeApi,
        nvml: Nvml,
        host: HostFs,
        metrics: AgentMetrics,
        kubelet_pods: Callable[[], KubeletPods] | None = None,
        set_slice: Callable[[str, int], SmiResult] | None = None,
        own_uid: str | None = None,
    ):
        self.config = config
        self.cfg = config.agent
        self.node = node
        self.nvml = nvml
        self.host = host
        self.metrics = metrics
        self.kubelet_pods = kubelet_pods
        self.own_uid = own_uid
        """The agent's own pod's UID (POD_UID): the pod list must hold it to be trusted."""
        self.distrust = ""
        """Why the last poll judged no orphan (logged when it changes)."""
        self.set_slice = set_slice or (
            lambda uuid, level: set_timeslice(
                self.cfg.nvidia_smi, uuid, level, self.cfg.command_timeout
            )
        )
        self.dry_run = self.cfg.dry_run if self.cfg.dry_run is not None else config.control.dry_run
        self.applied: dict[str, str] = {}
        """GPU UUID -> level set since start (empty: re-applied after a restart)."""
        self.failed_level: str | None = None
        """The level whose last try failed (its Warning Event is not repeated every poll)."""
        self.memory = OrphanMemory()
        self.signalled: dict[tuple[int, int], GpuProc] = {}
        """Processes signalled and not yet seen gone (their memory-freed Event is due)."""
        self.sent: set[tuple[tuple[int, int], str]] = set()
        """(process, signal) already announced by an Event."""
        self.reported: set[tuple[str, tuple[int, int]]] = set()
        self.mig_reported: set[str] = set()
        self._indexes: dict[str, str] = {}
        self.not_acting = ""
        """Why this poll only reports (dry run, node not opted in); empty when it acts."""

    def poll(self, now: float) -> PollReport:
        """One pass. Raises KubeError or NvmlError when the node or the GPUs cannot be read
        (nothing else can be judged then); every later part fails alone."""
        report = PollReport()
        view = self._source("kubernetes", self.node.read)
        gpus = self._source("nvml", lambda: self._gpus())
        report.gpus = gpus
        acting = not self.dry_run and view.labels.get(OPT_IN_LABEL) == "true"
        why = "dry run" if self.dry_run else f"node has no label {OPT_IN_LABEL}=true"
        self.not_acting = "" if acting else why
        self._publish_topology(view, gpus, report)
        if self.cfg.time_slice:
            self._time_slice(view, gpus, acting, report)
        procs = self._processes(gpus)  # before the pod lists: a process's pod is in them
        kubelet = self._kubelet_pods(report)
        report.actions = self._orphans(procs, kubelet, now, acting, report)
        self._quarantine(view, gpus, report.actions, acting, report)
        return report

    def _source(self, name: str, read: Callable[[], T]) -> T:
        try:
            value = read()
        except (KubeError, NvmlError):
            self.metrics.source_up.labels(name).set(0)
            raise
        self.metrics.source_up.labels(name).set(1)
        return value

    def _gpus(self) -> list[GpuFacts]:
        gpus = [replace(g, numa_node=self.host.numa_node(g.pci_bus_id)) for g in self.nvml.gpus()]
        self._indexes = {g.uuid: str(g.index) for g in gpus}
        for g in gpus:
            self.metrics.memory_used.labels(str(g.index)).set(g.memory_used_mib)
        return gpus

    def _processes(self, gpus: list[GpuFacts]) -> list[GpuProc]:
        out = []
        for g in gpus:
            for p in self.nvml.processes(g):
                start = self.host.start_time(p.pid)
                text = self.host.cgroup(p.pid)
                if start is None or text is None:
                    continue  # exited between NVML and /proc
                owner = pod_uid_from_cgroup(text)
                out.append(GpuProc(p.pid, start, g.uuid, p.used_mib, self.host.name(p.pid), owner))
        return out

    def _publish_topology(self, view: NodeView, gpus: list[GpuFacts], report: PollReport) -> None:
        value = topology_annotation(gpus)
        if view.annotations.get(GPU_TOPOLOGY) == value:
            return
        try:
            self.node.annotate({GPU_TOPOLOGY: value})
            log.info("published GPU topology: %s", value)
        except KubeError as e:
            report.problems.append(f"topology not published: {e}")
            log.warning("GPU topology not published: %s", e)

    def _time_slice(
        self, view: NodeView, gpus: list[GpuFacts], acting: bool, report: PollReport
    ) -> None:
        plan = time_slice_plan(
            view.labels.get(self.config.kubernetes.time_slice_label), gpus, self.applied
        )
        if plan.problem:
            report.problems.append(f"time slice: {plan.problem}")
            log.warning("time slice not applied: %s", plan.problem)
            return
        for uuid, why in plan.skipped:
            if uuid not in self.mig_reported:
                self.mig_reported.add(uuid)
                self.metrics.time_slice_sets.labels("skipped").inc()
                log.info("time slice: GPU %s skipped: %s", uuid, why)
        if not plan.apply:
            self._record_applied(view, plan, {})
            return
        if not acting:
            self.metrics.time_slice_sets.labels("dry_run").inc(len(plan.apply))
            log.info(
                "time slice: would set %s on %d GPU(s) (%s)",
                plan.level,
                len(plan.apply),
                self.not_acting,
            )
            return
        failed = self._set_slices(plan.apply, plan.level or "", report)
        self._record_applied(view, plan, failed)

    def _set_slices(
        self, apply: tuple[tuple[str, int], ...], level: str, report: PollReport
    ) -> dict[str, str]:
        failed: dict[str, str] = {}
        for uuid, n in apply:
            result = self.set_slice(uuid, n)
            self.metrics.time_slice_sets.labels("ok" if result.ok else "failed").inc()
            if result.ok:
                self.applied[uuid] = level
                self.metrics.time_slice.labels(self.gpu_index(uuid)).set(n)
                report.time_slice_set.append(uuid)
            else:
                failed[uuid] = result.detail
        if failed and self.failed_level != level:
            self.failed_level = level
            detail = "; ".join(f"{u}: {d}" for u, d in failed.items())
            report.problems.append(f"time slice {level} failed: {detail}")
            self.node.event(
                "TimeSliceNotApplied",
                "SetTimeSlice",
                f"time slice {level} not applied on {len(failed)} GPU(s): {detail}",
                "Warning",
            )
        if not failed:
            self.failed_level = None
        return failed

    def _record_applied(self, view: NodeView, plan: TimeSlicePlan, failed: dict[str, str]) -> None:
        current = view.annotations.get(TIME_SLICE_APPLIED)
        want = applied_annotation(plan, failed, current)
        if want is None or want == current:
            return
        try:
            self.node.annotate({TIME_SLICE_APPLIED: want})
            self.node.event("TimeSliceApplied", "SetTimeSlice", f"time slice {want} applied")
        except KubeError as e:
            log.warning("time-slice annotation not written: %s", e)

    def gpu_index(self, uuid: str) -> str:
        """The GPU's index (as this poll's NVML listing gave it), for labels and Events."""
        return self._indexes.get(uuid, uuid)

    def _kubelet_pods(self, report: PollReport) -> frozenset[str] | None:
        if self.kubelet_pods is None:
            return None
        try:
            answer = self.kubelet_pods()
        except PodResourcesError as e:
            self.metrics.source_up.labels("pod_resources").set(0)
            report.problems.append(str(e))
            log.warning("%s", e)
            return None
        self.metrics.source_up.labels("pod_resources").set(1)
        self.metrics.set_pod_devices(answer.devices)
        return answer.pods

    def _orphans(
        self,
        procs: list[GpuProc],
        kubelet: frozenset[str] | None,
        now: float,
        acting: bool,
        report: PollReport,
    ) -> list[OrphanAction] | None:
        try:
            listed = self._source("kubernetes", self.node.pods)
            live, unlisted, why = trusted_pods(listed, kubelet, self.own_uid)
        except KubeError as e:
            live, unlisted, why = None, (), f"pods unknown: {e}"
        if live is None:
            report.problems.append(f"no orphan judged: {why}")
            if why != self.distrust:
                log.warning(
                    "no process is judged an orphan: %s", why, extra={"event": "pods_untrusted"}
                )
        self.distrust = why
        policy = OrphanPolicy(self.cfg.orphan_grace, self.cfg.kill_timeout)
        actions, self.memory = orphan_actions(procs, live, self.memory, now, policy, unlisted)
        self._count(actions)
        self._carry_out(actions, procs, acting, report)
        return actions if live is not None else None

    def _count(self, actions: list[OrphanAction]) -> None:
        self.metrics.processes.clear()
        for a in actions:
            orphan = a.kind in ("sigterm", "sigkill", "wait")
            owner = "orphan" if orphan else a.proc.owner.kind
            gpu = self.gpu_index(a.proc.gpu)
            self.metrics.processes.labels(gpu, owner).inc()

    def _quarantine(
        self,
        view: NodeView,
        gpus: list[GpuFacts],
        actions: list[OrphanAction] | None,
        acting: bool,
        report: PollReport,
    ) -> None:
        decision = quarantine_decision(
            view.quarantined, gpus, actions, self.config.preemption.released_below_mib
        )
        self.metrics.quarantined.set(1 if decision.quarantined else 0)
        if not decision.quarantined:
            return
        if not decision.lift:
            report.problems.append(f"quarantine stays: {decision.reason}")
            log.info("quarantine stays: %s", decision.reason)
            return
        if not acting:
            self.metrics.lifts.labels("dry_run").inc()
            log.info("would lift the quarantine (%s): %s", self.not_acting, decision.reason)
            return
        try:
            self.node.lift_quarantine()
        except KubeError as e:
            self.metrics.lifts.labels("failed").inc()
            report.problems.append(f"quarantine not lifted: {e}")
            self.node.event(
                "GPUQuarantineKept", "LiftQuarantine", f"taint not removed: {e}", "Warning"
            )
            return
        self.metrics.lifts.labels("ok").inc()
        self.metrics.quarantined.set(0)
        report.lifted = True
        self.node.event(
            "GPUMemoryReleased",
            "LiftQuarantine",
            f"removed taint gpuscaler.io/gpu-memory-held and label gpuscaler.io/gpu-cleanup: "
            f"{decision.reason}",
        )

    def describe(self, p: GpuProc) -> str:
        return (
            f"PID {p.pid} ({p.name}) of pod UID {p.owner.pod_uid} on GPU {self.gpu_index(p.gpu)} "
            f"({p.gpu}) holding {_mib(p.used_mib)}"
        )

    def _carry_out(
        self,
        actions: list[OrphanAction],
        procs: list[GpuProc],
        acting: bool,
        report: PollReport,
    ) -> None:
        present = {p.key for p in procs}
        self._freed(present)
        self.reported = {r for r in self.reported if r[1] in present}  # gone: forgotten
        for a in actions:
            if a.kind == "report":
                self._once("unknown", a, f"GPU process {a.proc.pid} left alone: {a.reason}")
            elif a.kind in _SIGNALS:
                if acting:
                    self._signal(a, report)
                else:
                    self.metrics.signals.labels(a.kind.upper(), "dry_run").inc()
                    self._once(
                        f"would-{a.kind}",
                        a,
                        f"would {a.kind.upper()} ({self.not_acting}): "
                        f"{self.describe(a.proc)}: {a.reason}",
                    )

    def _once(self, kind: str, a: OrphanAction, message: str) -> None:
        key = (kind, a.proc.key)
        if key in self.reported:
            return
        self.reported.add(key)
        log.warning("%s", message, extra={"event": kind, "pid": a.proc.pid})

    def _signal(self, a: OrphanAction, report: PollReport) -> None:
        p = a.proc
        name = a.kind.upper()
        try:
            outcome = self.host.signal(p.pid, p.start, _SIGNALS[a.kind])
        except PermissionError as e:
            self.metrics.signals.labels(name, "refused").inc()
            report.problems.append(f"{name} to {p.pid} refused: {e}")
            self.node.event(
                "OrphanGPUProcessNotKilled",
                "KillOrphan",
                f"{name} refused for {self.describe(p)}: {e} (the agent needs CAP_KILL)",
                "Warning",
            )
            return
        self.metrics.signals.labels(name, outcome).inc()
        if outcome != "sent" or (p.key, name) in self.sent:
            return  # a SIGKILL repeated on a process that will not die is not news
        log.warning("%s sent: %s (%s)", name, self.describe(p), a.reason)
        self.sent.add((p.key, name))
        self.signalled[p.key] = p
        self.node.event(
            "OrphanGPUProcessKilled",
            "KillOrphan",
            f"{name} sent to {self.describe(p)}: {a.reason}",
            "Warning",
        )

    def _freed(self, present: set[tuple[int, int]]) -> None:
        """Events for signalled processes no longer on any GPU: their memory is freed."""
        for key, p in list(self.signalled.items()):
            if key in present:
                continue
            del self.signalled[key]
            self.sent = {(k, n) for k, n in self.sent if k != key}
            if p.used_mib is not None:
                self.metrics.freed.inc(p.used_mib)
            self.node.event(
                "OrphanGPUMemoryFreed",
                "KillOrphan",
                f"PID {p.pid} of pod UID {p.owner.pod_uid} exited; {_mib(p.used_mib)} freed on "
                f"GPU {self.gpu_index(p.gpu)} ({p.gpu})",
            )
