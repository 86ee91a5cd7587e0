"""Carrying out the orphan decisions: signals (through a pidfd, never to a reused PID),
Events naming the PID, pod UID, GPU and memory, and the dry-run report.

An Event is recorded when a signal is sent (with the memory the process holds) and again
when the process is gone (the memory freed). Each orphan, unknown cgroup and dry-run
finding is reported once, not every poll.
"""

from __future__ import annotations

import logging
import signal

from gpuscaler.agent.parts import CleanupState, PollReport
from gpuscaler.core.orphans import GpuProc, OrphanAction

log = logging.getLogger("gpuscaler.agent")

_SIGNALS = {"sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}


def _mib(value: float | None) -> str:
    return "unknown MiB" if value is None else f"{value:.0f} MiB"


def describe(agent: CleanupState, p: GpuProc) -> str:
    return (
        f"PID {p.pid} ({p.name}) of pod UID {p.owner.pod_uid} on GPU {agent.gpu_index(p.gpu)} "
        f"({p.gpu}) holding {_mib(p.used_mib)}"
    )


def carry_out(
    agent: CleanupState,
    actions: list[OrphanAction],
    procs: list[GpuProc],
    acting: bool,
    report: PollReport,
) -> None:
    _freed(agent, procs)
    present = {p.key for p in procs}
    agent.reported = {r for r in agent.reported if r[1] in present}  # gone: forgotten
    for a in actions:
        if a.kind == "report":
            _once(agent, "unknown", a, f"GPU process {a.proc.pid} left alone: {a.reason}")
        elif a.kind in _SIGNALS:
            if acting:
                _signal(agent, a, report)
            else:
                agent.metrics.signals.labels(a.kind.upper(), "dry_run").inc()
                _once(
                    agent,
                    f"would-{a.kind}",
                    a,
                    f"would {a.kind.upper()} ({agent.not_acting}): "
                    f"{describe(agent, a.proc)}: {a.reason}",
                )


def _once(agent: CleanupState, kind: str, a: OrphanAction, message: str) -> None:
    key = (kind, a.proc.key)
    if key in agent.reported:
        return
    agent.reported.add(key)
    log.warning("%s", message, extra={"event": kind, "pid": a.proc.pid})


def _signal(agent: CleanupState, a: OrphanAction, report: PollReport) -> None:
    p = a.proc
    name = a.kind.upper()
    try:
        outcome = agent.host.signal(p.pid, p.start, _SIGNALS[a.kind])
    except PermissionError as e:
        agent.metrics.signals.labels(name, "refused").inc()
        report.problems.append(f"{name} to {p.pid} refused: {e}")
        agent.node.event(
            "OrphanGPUProcessNotKilled",
            "KillOrphan",
            f"{name} refused for {describe(agent, p)}: {e} (the agent needs CAP_KILL)",
            "Warning",
        )
        return
    agent.metrics.signals.labels(name, outcome).inc()
    if outcome != "sent" or (p.key, name) in agent.sent:
        return  # a SIGKILL repeated on a process that will not die is not news
    log.warning("%s sent: %s (%s)", name, describe(agent, p), a.reason)
    agent.sent.add((p.key, name))
    agent.signalled[p.key] = p
    agent.node.event(
        "OrphanGPUProcessKilled",
        "KillOrphan",
        f"{name} sent to {describe(agent, p)}: {a.reason}",
        "Warning",
    )


def _freed(agent: CleanupState, procs: list[GpuProc]) -> None:
    """Events for signalled processes no longer on any GPU: their memory is freed."""
    present = {p.key for p in procs}
    for key, p in list(agent.signalled.items()):
        if key in present:
            continue
        del agent.signalled[key]
        agent.sent = {(k, n) for k, n in agent.sent if k != key}
        if p.used_mib is not None:
            agent.metrics.freed.inc(p.used_mib)
        agent.node.event(
            "OrphanGPUMemoryFreed",
            "KillOrphan",
            f"PID {p.pid} of pod UID {p.owner.pod_uid} exited; {_mib(p.used_mib)} freed on "
            f"GPU {agent.gpu_index(p.gpu)} ({p.gpu})",
        )
