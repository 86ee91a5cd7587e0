"""Three-tier preemption of low-priority GPU pods, as pure functions.

When a pod at or above `beneficiary_min_priority` has been unschedulable for
`pending_for` and no node has a free GPU share for it, victims are chosen on one node the
way kube-scheduler chooses them (fewest PDB violations, then the lowest highest-victim
priority, the smallest priority sum, the fewest victims, the latest start), but only if
freeing them really makes the pod fit, and preferring victims with the freshest checkpoint
(least work lost). Each victim then goes through the tiers:

    none -> soft      ask to checkpoint (annotation, optional HTTP call)
    soft -> hard      checkpoint acknowledged, or soft_grace over: evict (evidence first)
    soft -> cleanup   the pod exited by itself
    soft -> aborted   the beneficiary no longer needs it (scheduled elsewhere, gone)
    hard -> hard      retry an eviction a PDB refused; force-delete a pod stuck Terminating
    hard -> given_up  a PDB kept refusing (another victim is chosen next tick)
    hard -> cleanup   the pod is gone
    cleanup -> done         its GPU memory was seen released (or cannot be measured)
    cleanup -> quarantined  memory stays held on a GPU with no pod: taint the node

`TRANSITIONS` is the whole table; every step is checked against it here and again by the
adapter against the state it reads before acting, so a restart resumes, never repeats.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from gpuscaler.config import PreemptionConfig
from gpuscaler.core.model import Decision, Skip

KIND: Final = "preemption"
Tier = Literal["none", "soft", "hard", "cleanup", "done", "aborted", "given_up", "quarantined"]
TRANSITIONS: Final[Mapping[str, frozenset[str]]] = {
    "none": frozenset({"soft"}),
    "soft": frozenset({"hard", "cleanup", "aborted"}),
    "hard": frozenset({"hard", "cleanup", "given_up"}),
    "cleanup": frozenset({"done", "quarantined"}),
    "done": frozenset(),
    "aborted": frozenset(),
    "given_up": frozenset(),
    "quarantined": frozenset(),
}
IN_FLIGHT: Final = frozenset({"soft", "hard", "cleanup"})
FORECAST_PREFIX: Final = "forecast:"
"""Beneficiaries that are replicas a forecast asks for, not pods (yet)."""
FRAGMENTS_PREFIX: Final = "fragments:"
"""Beneficiaries that are fewer fragments on a node, not pods."""


class TransitionError(ValueError):
    """A tier change the table does not allow."""


def check_transition(old: str, new: str) -> None:
    if new not in TRANSITIONS.get(old, frozenset()):
        raise TransitionError(f"preemption tier {old} -> {new} is not allowed")


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
    """When the scheduler last said it does not fit (PodScheduled=False, Unschedulable)."""
    terminating_since: float | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    opted_out: bool = False
    """Annotation gpuscaler.io/preemptible: "false"."""
    preemption_never: bool = False
    """Its PriorityClass has preemptionPolicy: Never."""
    pdb_blocked: bool = False
    """A PodDisruptionBudget selecting it allows no disruption now."""
    checkpoint_at: float | None = None
    """gpuscaler.io/last-checkpoint: when it last saved its work."""
    checkpoint_done_at: float | None = None
    """gpuscaler.io/checkpoint-done: when it acknowledged a requested checkpoint."""
    gpu_memory_gib: float | None = None
    """gpuscaler.io/gpu-memory-gib: GPU memory it needs per share."""
    pool: str | None = None
    """For a replica the forecast asks for: the only node pool it may go to."""
    only_node: str | None = None
    allowed_nodes: frozenset[str] | None = None
    """Nodes its nodeSelector, required affinity and tolerations admit; None: any."""
    shrink_to: int | None = None
    """For fewer fragments on `only_node`: its shares after the change; room is made when
    the pods left hold no more than that."""
    uid: str = ""
    """metadata.uid: what identifies a victim, never its name alone."""

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
    """The victim pod's metadata.uid when it was chosen. A pod of the same name with
    another UID is a replacement: the victim is gone, and the replacement is never touched.
    Records written before UIDs were kept have "" and match by name."""


@dataclass(frozen=True)
class PreemptionObservation:
    pods: tuple[PodView, ...] = ()
    nodes: tuple[NodeView, ...] = ()
    states: tuple[VictimState, ...] = ()
    memory_released: Mapping[str, bool | None] = field(default_factory=dict)
    """Per victim in cleanup: True released, False held on a GPU with no pod, None not
    measurable (no per-pod dcgm series, or Prometheus down)."""
    problem: str | None = None
    """Set when the cluster could not be read: nothing is decided."""


def _step(
    now: float, state: VictimState, to: str, action: str, reason: str, **extra: str | int | float
) -> Decision:
    check_transition(state.tier, to)
    return Decision(
        now,
        KIND,
        state.victim,
        state.tier,
        to,
        reason,
        detail={"action": action, "beneficiary": state.beneficiary, "node": state.node, **extra},
    )


def _hold(now: float, target: str, reason: str) -> Skip:
    return Skip(now, KIND, target, reason, invalid_input=False)


# --------------------------------------------------------------------------- progress


def _progress(
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
            return _step(
                now, s, "cleanup", "record_gone", f"victim exited during the soft tier{swap}"
            )
        assert pod is not None
        if beneficiary is None or beneficiary.node is not None:
            why = "is gone" if beneficiary is None else f"was scheduled on {beneficiary.node}"
            return _step(now, s, "aborted", "abort", f"beneficiary {s.beneficiary} {why}")
        if pod.checkpoint_done_at is not None and pod.checkpoint_done_at >= s.requested_at:
            waited = pod.checkpoint_done_at - s.requested_at
            return _step(
                now,
                s,
                "hard",
                "evict",
                f"checkpoint acknowledged after {waited:.0f}s: evict for {s.beneficiary}",
                grace_seconds=cfg.eviction_grace_period,
            )
        if now - s.since >= cfg.soft_grace:
            return _step(
                now,
                s,
                "hard",
                "evict",
                f"soft grace {cfg.soft_grace:.0f}s over without a checkpoint: evict for "
                f"{s.beneficiary}",
                grace_seconds=cfg.eviction_grace_period,
            )
        left = cfg.soft_grace - (now - s.since)
        return _hold(now, s.victim, f"wait: soft tier, {left:.0f}s left to checkpoint")
    if s.tier == "hard":
        if gone:
            return _step(
                now, s, "cleanup", "record_gone", f"victim is gone{swap}; checking its GPU memory"
            )
        assert pod is not None
        if pod.terminating_since is not None:
            stuck = now - pod.terminating_since
            if stuck >= cfg.terminating_timeout:
                return _step(
                    now,
                    s,
                    "hard",
                    "force_delete",
                    f"stuck Terminating for {stuck:.0f}s (limit {cfg.terminating_timeout:.0f}s)",
                )
            return _hold(now, s.victim, f"wait: terminating for {stuck:.0f}s")
        if s.evicted_at is not None:
            waited = now - s.evicted_at
            if waited < cfg.terminating_timeout:
                return _hold(now, s.victim, f"wait: evicted {waited:.0f}s ago, not terminating yet")
            return _step(  # the way out: the slot is freed, the pod is never touched again
                now,
                s,
                "given_up",
                "give_up",
                f"evicted {waited:.0f}s ago but never started terminating (limit "
                f"{cfg.terminating_timeout:.0f}s); record closed, pod left alone",
            )
        if s.attempts >= cfg.max_eviction_attempts:
            if cfg.escalate_to_delete:
                return _step(
                    now,
                    s,
                    "hard",
                    "delete",
                    f"eviction refused {s.attempts} times (PodDisruptionBudget): deleting, "
                    "as escalate_to_delete allows",
                )
            return _step(
                now,
                s,
                "given_up",
                "give_up",
                f"eviction refused {s.attempts} times (PodDisruptionBudget); another victim "
                "will be chosen",
            )
        if s.last_attempt_at is not None and now - s.last_attempt_at < cfg.eviction_retry:
            left = cfg.eviction_retry - (now - s.last_attempt_at)
            return _hold(now, s.victim, f"wait: eviction refused, retry in {left:.0f}s")
        return _step(
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
            return _step(now, s, "done", "confirm_released", "GPU memory released")
        waited = now - s.since
        if waited < cfg.memory_release_timeout:
            return _hold(now, s.victim, f"wait: cleanup, {waited:.0f}s for GPU memory release")
        if released is False:
            return _step(
                now,
                s,
                "quarantined",
                "quarantine",
                f"GPU memory still held {waited:.0f}s after the pod left, no pod on the GPU: "
                f"node {s.node} tainted until a node-side cleanup",
            )
        return _step(
            now,
            s,
            "done",
            "confirm_released",
            "GPU memory not measurable (no per-pod dcgm-exporter series): not verified",
        )
    return None


# --------------------------------------------------------------------------- new victims


def is_beneficiary(p: PodView, cfg: PreemptionConfig, now: float) -> bool:
    return (
        p.node is None
        and p.phase == "Pending"
        and (p.gpus > 0 or p.shrink_to is not None)
        and p.priority >= cfg.beneficiary_min_priority
        and not p.preemption_never
        and p.unschedulable_since is not None
        and now - p.unschedulable_since >= cfg.pending_for
    )


def is_candidate(p: PodView, cfg: PreemptionConfig) -> bool:
    return (
        p.node is not None
        and not p.gone
        and p.terminating_since is None
        and p.priority < cfg.victim_max_priority
        and p.namespace not in cfg.protected_namespaces
        and not any(p.labels.get(k) == v for k, v in cfg.protected_labels.items())
        and not p.opted_out
    )


@dataclass(frozen=True)
class Choice:
    node: str
    victims: tuple[PodView, ...]

    def rank(self) -> tuple[int, int, int, int, float, str]:
        """kube-scheduler's node order: lower is better."""
        top = max(v.priority for v in self.victims)
        starts = [v.start_time or 0.0 for v in self.victims if v.priority == top]
        return (
            sum(v.pdb_blocked for v in self.victims),
            top,
            sum(v.priority for v in self.victims),
            len(self.victims),
            -min(starts),  # the latest start of the highest-priority victims wins
            self.node,
        )


def _reprieve_order(p: PodView) -> tuple[bool, int, float, float]:
    """Victims are given back in this order while the beneficiary still fits: PDB-
    protected first, then higher priority, then the stalest checkpoint (most work to lose),
    then the earliest start. What is left are the victims."""
    return (
        not p.pdb_blocked,
        -p.priority,
        p.checkpoint_at if p.checkpoint_at is not None else -math.inf,
        p.start_time or 0.0,
    )


def choose_victims(
    beneficiary: PodView,
    node: NodeView,
    pods: tuple[PodView, ...],
    taken: set[str],
    cfg: PreemptionConfig,
) -> tuple[Choice | None, str]:
    """Victims on `node` that make `beneficiary` fit, or None and why not."""
    need = beneficiary.gpus
    if (
        beneficiary.gpu_memory_gib is not None
        and node.share_memory_gib is not None
        and node.share_memory_gib < beneficiary.gpu_memory_gib
    ):
        return None, (
            f"{node.name}: a share has {node.share_memory_gib:.1f} GiB, "
            f"{beneficiary.gpu_memory_gib:g} GiB needed"
        )
    if need > 1 and node.numa_domain_shares is not None and need > node.numa_domain_shares:
        return None, (
            f"{node.name}: {need} shares do not fit one NUMA domain "
            f"({node.numa_domain_shares} shares each)"
        )
    on_node = [p for p in pods if p.node == node.name and not p.gone]
    shares = node.shares if beneficiary.shrink_to is None else beneficiary.shrink_to
    free = shares - sum(p.gpus for p in on_node)
    if free >= need:
        return Choice(node.name, ()), f"{node.name} has {free} free share(s) already"
    candidates = [
        p
        for p in on_node
        if is_candidate(p, cfg) and p.priority < beneficiary.priority and p.key not in taken
    ]
    if free + sum(p.gpus for p in candidates) < need:
        return (
            None,
            f"{node.name}: {free} free + {sum(p.gpus for p in candidates)} preemptible < {need}",
        )
    victims = list(candidates)
    available = free + sum(p.gpus for p in candidates)
    for p in sorted(candidates, key=_reprieve_order):
        if available - p.gpus >= need:
            available -= p.gpus
            victims.remove(p)
    return Choice(node.name, tuple(victims)), ""


def _start(
    b: PodView,
    obs: PreemptionObservation,
    cfg: PreemptionConfig,
    taken: set[str],
    budget: int,
    now: float,
) -> list[Decision] | Skip:
    choices, reasons = [], []
    for node in obs.nodes:
        if (b.pool is not None and node.pool != b.pool) or b.only_node not in (None, node.name):
            continue
        if b.allowed_nodes is not None and node.name not in b.allowed_nodes:
            continue
        choice, why = choose_victims(b, node, obs.pods, taken, cfg)
        if choice is not None and not choice.victims:
            return _hold(now, b.key, f"no action: {why}; the scheduler can place it")
        if choice is None:
            reasons.append(why)
        else:
            choices.append(choice)
    if not choices:
        detail = "; ".join(reasons[:3]) or "no GPU nodes"
        return _hold(now, b.key, f"blocked: freeing preemptible pods would not fit it ({detail})")
    best = min(choices, key=Choice.rank)
    if len(best.victims) > budget:
        return _hold(
            now,
            b.key,
            f"blocked: needs {len(best.victims)} victim(s) on {best.node}, limits leave {budget} "
            f"(max_in_flight {cfg.max_in_flight}, max_per_hour {cfg.max_per_hour})",
        )
    if b.shrink_to is not None:
        why = (
            f"fewer fragments on {b.only_node} ({b.shrink_to} shares) need the pods there to "
            "hold no more"
        )
    elif b.key.startswith(FORECAST_PREFIX):
        why = (
            f"forecast: {b.key.removeprefix(FORECAST_PREFIX).split('#')[0]} needs one more "
            f"replica ({b.gpus} GPU share(s)) within the horizon and its pool has no room"
        )
    else:
        waited = now - (b.unschedulable_since or now)
        why = (
            f"{b.key} (priority {b.priority}, {b.gpus} GPU share(s)) unschedulable for "
            f"{waited:.0f}s"
        )
    out = []
    for v in best.victims:
        state = VictimState(
            v.key, b.key, best.node, v.gpus, v.priority, "none", now, now, uid=v.uid
        )
        fresh = v.checkpoint_at is not None and now - v.checkpoint_at <= cfg.checkpoint_fresh
        out.append(
            _step(
                now,
                state,
                "soft",
                "request_checkpoint",
                f"{why}; {v.key} (priority {v.priority}, {v.gpus} share(s)) on "
                f"{best.node} frees room"
                + (", checkpointed recently" if fresh else "")
                + f"; asked to checkpoint within {cfg.soft_grace:.0f}s",
                gpus=v.gpus,
                priority=v.priority,
                uid=v.uid,
                checkpoint_deadline=now + cfg.soft_grace,
                evicted_by=now + cfg.soft_grace,
                gone_by=now + cfg.soft_grace + cfg.eviction_grace_period,
            )
        )
        taken.add(v.key)
    return out


def decide_preemption(
    obs: PreemptionObservation, cfg: PreemptionConfig, now: float
) -> tuple[tuple[Decision, ...], tuple[Skip, ...]]:
    """The next step of every preemption under way, and new ones for pending pods."""
    if not cfg.enabled:
        return (), ()
    if obs.problem is not None:
        return (), (Skip(now, KIND, "cluster", f"no action: {obs.problem}", invalid_input=True),)
    pods = {p.key: p for p in obs.pods}
    decisions: list[Decision] = []
    skips: list[Skip] = []
    for s in obs.states:
        out = _progress(s, pods, obs, cfg, now)
        if isinstance(out, Decision):
            decisions.append(out)
        elif isinstance(out, Skip):
            skips.append(out)
    in_flight = sum(s.tier in IN_FLIGHT for s in obs.states)
    in_flight -= sum(d.to_value not in IN_FLIGHT for d in decisions)
    last_hour = sum(now - s.requested_at < 3600 for s in obs.states)
    budget = min(cfg.max_in_flight - in_flight, cfg.max_per_hour - last_hour)
    busy = {s.beneficiary for s in obs.states if s.tier in ("soft", "hard")}
    # A victim given up (a PDB kept refusing) is not chosen again while its record lasts.
    taken = {s.victim for s in obs.states if s.tier in IN_FLIGHT or s.tier == "given_up"}
    for b in sorted(obs.pods, key=lambda p: (-p.priority, p.unschedulable_since or 0.0)):
        if not is_beneficiary(b, cfg, now) or b.key in busy:
            continue
        started = _start(b, obs, cfg, taken, budget, now)
        if isinstance(started, Skip):
            skips.append(started)
        else:
            decisions += started
            budget -= len(started)
    return tuple(decisions), tuple(skips)


def forecast_beneficiaries(
    wanted: list[tuple[str, str, str, int, int, int]],
) -> tuple[PodView, ...]:
    """Replicas a forecast floor asks for and that do not exist yet, as pending pods:
    (workload key, namespace, pool, priority, missing replicas, shares per replica). Their
    keys are stable across ticks, so a preemption started for one goes on while the
    forecast still asks for it, and its soft tier is aborted when it no longer does."""
    out = []
    for key, namespace, pool, priority, missing, shares in wanted:
        for i in range(missing):
            out.append(
                PodView(
                    f"{FORECAST_PREFIX}{key}#{i}",
                    namespace,
                    None,
                    shares,
                    priority,
                    "Pending",
                    unschedulable_since=-math.inf,  # needed within the horizon: no wait
                    pool=pool,
                )
            )
    return tuple(out)


def fragments_beneficiaries(
    pool: str, current: int, to: int, obs: PreemptionObservation, priority: int
) -> tuple[PodView, ...]:
    """One per node of `pool` whose pods hold more shares than fewer fragments (`to`
    instead of `current` per GPU) leave: the room needed, as a pending pod pinned there."""

    def held(node: str) -> int:
        return sum(p.gpus for p in obs.pods if p.node == node and not p.gone)

    return tuple(
        PodView(
            f"{FRAGMENTS_PREFIX}{pool}/{n.name}",
            "",
            None,
            0,
            priority,
            "Pending",
            unschedulable_since=-math.inf,
            pool=pool,
            only_node=n.name,
            shrink_to=n.shares // current * to,
        )
        for n in obs.nodes
        if n.pool == pool and current > 0 and held(n.name) > n.shares // current * to
    )
