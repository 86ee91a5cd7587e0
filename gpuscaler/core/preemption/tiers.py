"""Preemptions under way: each victim's next tier, or why it waits."""

from __future__ import annotations

from collections.abc import Mapping

from gpuscaler.config import PreemptionConfig
from gpuscaler.core.decisions import Decision, Skip
from gpuscaler.core.preemption.transitions import hold, step_decision
from gpuscaler.core.preemption.views import PodView, PreemptionObservation, VictimState

# --------------------------------------------------------------------------- progress


def progress(
    s: VictimState,
    pods: Mapping[str, PodView],
    obs: PreemptionObservation,
    cfg: PreemptionConfig,
    now: float,
) -> Decision | Skip | None:
    pod = pods.get(s.victim)
    # The victim is a pod, not a name: one recreated under its name is not it.
    replaced = pod is not None and bool(s.uid) and bool(pod.uid) and pod.uid != s.uid
    gone = pod is None or pod.gone or replaced
    swap = f" (the pod now named so has UID {pod.uid}, not {s.uid})" if replaced and pod else ""
    if s.tier == "soft":
        beneficiary = pods.get(s.beneficiary)
        if gone:
            return step_decision(
                now, s, "cleanup", "record_gone", f"victim exited during the soft tier{swap}"
            )
        assert pod is not None
        if beneficiary is None or beneficiary.node is not None:
            why = "is gone" if beneficiary is None else f"was scheduled on {beneficiary.node}"
            return step_decision(now, s, "aborted", "abort", f"beneficiary {s.beneficiary} {why}")
        if pod.checkpoint_done_at is not None and pod.checkpoint_done_at >= s.requested_at:
            waited = pod.checkpoint_done_at - s.requested_at
            return step_decision(
                now,
                s,
                "hard",
                "evict",
                f"checkpoint acknowledged after {waited:.0f}s: evict for {s.beneficiary}",
                grace_seconds=cfg.eviction_grace_period,
            )
        if now - s.since >= cfg.soft_grace:
            return step_decision(
                now,
                s,
                "hard",
                "evict",
                f"soft grace {cfg.soft_grace:.0f}s over without a checkpoint: evict for "
                f"{s.beneficiary}",
                grace_seconds=cfg.eviction_grace_period,
            )
        left = cfg.soft_grace - (now - s.since)
        return hold(now, s.victim, f"wait: soft tier, {left:.0f}s left to checkpoint")
    if s.tier == "hard":
        if gone:
            return step_decision(
                now, s, "cleanup", "record_gone", f"victim is gone{swap}; checking its GPU memory"
            )
        assert pod is not None
        if pod.terminating_since is not None:
            stuck = now - pod.terminating_since
            if stuck >= cfg.terminating_timeout:
                return step_decision(
                    now,
                    s,
                    "hard",
                    "force_delete",
                    f"stuck Terminating for {stuck:.0f}s (limit {cfg.terminating_timeout:.0f}s)",
                )
            return hold(now, s.victim, f"wait: terminating for {stuck:.0f}s")
        if s.evicted_at is not None:
            waited = now - s.evicted_at
            if waited < cfg.terminating_timeout:
                return hold(now, s.victim, f"wait: evicted {waited:.0f}s ago, not terminating yet")
            return step_decision(  # the way out: the slot is freed, the pod is never touched again
                now,
                s,
                "given_up",
                "give_up",
                f"evicted {waited:.0f}s ago but never started terminating (limit "
                f"{cfg.terminating_timeout:.0f}s); record closed, pod left alone",
            )
        if s.attempts >= cfg.max_eviction_attempts:
            if cfg.escalate_to_delete:
                return step_decision(
                    now,
                    s,
                    "hard",
                    "delete",
                    f"eviction refused {s.attempts} times (PodDisruptionBudget): deleting, "
                    "as escalate_to_delete allows",
                )
            return step_decision(
                now,
                s,
                "given_up",
                "give_up",
                f"eviction refused {s.attempts} times (PodDisruptionBudget); another victim "
                "will be chosen",
            )
        if s.last_attempt_at is not None and now - s.last_attempt_at < cfg.eviction_retry:
            left = cfg.eviction_retry - (now - s.last_attempt_at)
            return hold(now, s.victim, f"wait: eviction refused, retry in {left:.0f}s")
        return step_decision(
            now,
            s,
            "hard",
            "evict",
            f"evict for {s.beneficiary} (attempt {s.attempts + 1})",
            grace_seconds=cfg.eviction_grace_period,
        )
    if s.tier == "cleanup":
        released = obs.memory_released.get(s.victim)
        if released:
            return step_decision(now, s, "done", "confirm_released", "GPU memory released")
        waited = now - s.since
        if waited < cfg.memory_release_timeout:
            return hold(now, s.victim, f"wait: cleanup, {waited:.0f}s for GPU memory release")
        if released is False:
            return step_decision(
                now,
                s,
                "quarantined",
                "quarantine",
                f"GPU memory still held {waited:.0f}s after the pod left, no pod on the GPU: "
                f"node {s.node} tainted until a node-side cleanup",
            )
        return step_decision(
            now,
            s,
            "done",
            "confirm_released",
            "GPU memory not measurable (no per-pod dcgm-exporter series): not verified",
        )
    return None
