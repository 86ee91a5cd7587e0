"""The tiers a victim goes through: the table of allowed changes, the one place a step is
checked against it, and each preemption under way's next step or why it waits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from gpuscaler.config import PreemptionConfig
from gpuscaler.core.decisions import (
    CheckpointRequest,
    Eviction,
    PreemptionAction,
    PreemptionStep,
    Skip,
)
from gpuscaler.core.preemption.views import PodView, PreemptionObservation, VictimState

KIND: Final = "preemption"
TRANSITIONS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "none": frozenset({"soft"}),
        "soft": frozenset({"hard", "cleanup", "aborted"}),
        "hard": frozenset({"hard", "cleanup", "given_up"}),
        "cleanup": frozenset({"done", "quarantined"}),
        "done": frozenset(),
        "aborted": frozenset(),
        "given_up": frozenset(),
        "quarantined": frozenset(),
    }
)
IN_FLIGHT: Final = frozenset({"soft", "hard", "cleanup"})


class TransitionError(ValueError):
    """A tier change the table does not allow."""


def check_transition(old: str, new: str) -> None:
    if new not in TRANSITIONS.get(old, frozenset()):
        raise TransitionError(f"preemption tier {old} -> {new} is not allowed")


def _step(
    now: float, s: VictimState, to: str, action: PreemptionAction, reason: str
) -> tuple[float, str, str, str, str, PreemptionAction, str, str]:
    """The fields every step of `s`'s victim to tier `to` starts with, checked."""
    check_transition(s.tier, to)
    return now, s.victim, s.tier, to, reason, action, s.beneficiary, s.node


def step_decision(
    now: float, s: VictimState, to: str, action: PreemptionAction, reason: str
) -> PreemptionStep:
    return PreemptionStep(*_step(now, s, to, action, reason))


def evict_step(now: float, s: VictimState, reason: str, grace_seconds: float) -> Eviction:
    return Eviction(*_step(now, s, "hard", "evict", reason), grace_seconds)


def checkpoint_step(
    now: float, s: VictimState, reason: str, soft_grace: float, eviction_grace: float
) -> CheckpointRequest:
    """A new victim's soft tier: ask it to checkpoint within `soft_grace`."""
    by = now + soft_grace
    head = _step(now, s, "soft", "request_checkpoint", reason)
    return CheckpointRequest(*head, s.gpus, s.priority, s.uid, by, by, by + eviction_grace)


def hold(now: float, target: str, reason: str) -> Skip:
    return Skip(now, KIND, target, reason, invalid_input=False)


@dataclass(frozen=True)
class _Victim:
    """A victim's record, its pod (None: gone or replaced) and why a pod of its name is
    not it (another UID), else ""."""

    state: VictimState
    pod: PodView | None
    swap: str


def progress(
    s: VictimState,
    pods: Mapping[str, PodView],
    obs: PreemptionObservation,
    cfg: PreemptionConfig,
    now: float,
) -> PreemptionStep | Skip | None:
    """The next step of `s`'s preemption, a hold saying what it waits for, or None when
    the record is finished."""
    pod = pods.get(s.victim)
    # The victim is a pod, not a name: one recreated under its name is not it.
    replaced = pod is not None and bool(s.uid) and bool(pod.uid) and pod.uid != s.uid
    gone = pod is None or pod.gone or replaced
    swap = f" (the pod now named so has UID {pod.uid}, not {s.uid})" if replaced and pod else ""
    victim = _Victim(s, None if gone else pod, swap)
    if s.tier == "soft":
        return _soft(victim, pods.get(s.beneficiary), cfg, now)
    if s.tier == "hard":
        return _hard(victim, cfg, now)
    if s.tier == "cleanup":
        claimed = bool(s.uid) and s.uid in obs.claim_holders
        return _cleanup(s, obs.memory_released.get(s.victim), claimed, cfg, now)
    return None


def _soft(
    v: _Victim, beneficiary: PodView | None, cfg: PreemptionConfig, now: float
) -> PreemptionStep | Skip:
    """Asked to checkpoint: evict once it did or its grace is over; abort when the
    beneficiary no longer needs the room."""
    s, pod = v.state, v.pod
    if pod is None:
        why = f"victim exited during the soft tier{v.swap}"
        return step_decision(now, s, "cleanup", "record_gone", why)
    if beneficiary is None or beneficiary.node is not None:
        why = "is gone" if beneficiary is None else f"was scheduled on {beneficiary.node}"
        return step_decision(now, s, "aborted", "abort", f"beneficiary {s.beneficiary} {why}")
    if pod.checkpoint_done_at is not None and pod.checkpoint_done_at >= s.requested_at:
        waited = pod.checkpoint_done_at - s.requested_at
        why = f"checkpoint acknowledged after {waited:.0f}s: evict for {s.beneficiary}"
        return evict_step(now, s, why, cfg.eviction_grace_period)
    if now - s.since >= cfg.soft_grace:
        why = f"soft grace {cfg.soft_grace:.0f}s over without a checkpoint: evict for "
        return evict_step(now, s, f"{why}{s.beneficiary}", cfg.eviction_grace_period)
    left = cfg.soft_grace - (now - s.since)
    return hold(now, s.victim, f"wait: soft tier, {left:.0f}s left to checkpoint")


def _hard(v: _Victim, cfg: PreemptionConfig, now: float) -> PreemptionStep | Skip:
    """Evicted (or being evicted): wait for it to go, force a pod stuck Terminating,
    retry an eviction a PDB refused, and give up when that keeps failing."""
    s, pod = v.state, v.pod
    if pod is None:
        why = f"victim is gone{v.swap}; checking its GPU memory"
        return step_decision(now, s, "cleanup", "record_gone", why)
    if pod.terminating_since is not None:
        stuck = now - pod.terminating_since
        if stuck >= cfg.terminating_timeout:
            why = f"stuck Terminating for {stuck:.0f}s (limit {cfg.terminating_timeout:.0f}s)"
            return step_decision(now, s, "hard", "force_delete", why)
        return hold(now, s.victim, f"wait: terminating for {stuck:.0f}s")
    if s.evicted_at is not None:
        waited = now - s.evicted_at
        if waited < cfg.terminating_timeout:
            return hold(now, s.victim, f"wait: evicted {waited:.0f}s ago, not terminating yet")
        # The way out: the slot is freed, the pod is never touched again.
        why = (
            f"evicted {waited:.0f}s ago but never started terminating (limit "
            f"{cfg.terminating_timeout:.0f}s); record closed, pod left alone"
        )
        return step_decision(now, s, "given_up", "give_up", why)
    if s.attempts >= cfg.max_eviction_attempts:
        refused = f"eviction refused {s.attempts} times (PodDisruptionBudget)"
        if cfg.escalate_to_delete:
            why = f"{refused}: deleting, as escalate_to_delete allows"
            return step_decision(now, s, "hard", "delete", why)
        why = f"{refused}; another victim will be chosen"
        return step_decision(now, s, "given_up", "give_up", why)
    if s.last_attempt_at is not None and now - s.last_attempt_at < cfg.eviction_retry:
        left = cfg.eviction_retry - (now - s.last_attempt_at)
        return hold(now, s.victim, f"wait: eviction refused, retry in {left:.0f}s")
    why = f"evict for {s.beneficiary} (attempt {s.attempts + 1})"
    return evict_step(now, s, why, cfg.eviction_grace_period)


def _cleanup(
    s: VictimState, released: bool | None, claimed: bool, cfg: PreemptionConfig, now: float
) -> PreemptionStep | Skip:
    """The victim is gone: done once its GPU memory is released (or cannot be measured),
    quarantine the node when it stays held. DRA releases a device asynchronously: while a
    claim is still reserved for the victim its devices are not free, so the record waits."""
    waited = now - s.since
    if claimed:
        if waited < cfg.memory_release_timeout:
            return hold(now, s.victim, f"wait: its DRA claim still holds its GPU(s), {waited:.0f}s")
        why = f"its DRA claim still holds its GPU(s) {waited:.0f}s after it left: not verified"
        return step_decision(now, s, "done", "confirm_released", why)
    if released:
        return step_decision(now, s, "done", "confirm_released", "GPU memory released")
    if waited < cfg.memory_release_timeout:
        return hold(now, s.victim, f"wait: cleanup, {waited:.0f}s for GPU memory release")
    if released is False:
        why = (
            f"GPU memory still held {waited:.0f}s after the pod left, no pod on the GPU: "
            f"node {s.node} tainted until a node-side cleanup"
        )
        return step_decision(now, s, "quarantined", "quarantine", why)
    why = "GPU memory not measurable (no per-pod dcgm-exporter series): not verified"
    return step_decision(now, s, "done", "confirm_released", why)
