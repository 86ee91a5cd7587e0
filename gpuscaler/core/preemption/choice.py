"""New preemptions: who may benefit, who may be a victim, and which victims on which node,
chosen the way kube-scheduler chooses them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from gpuscaler.config import PreemptionConfig
from gpuscaler.core.decisions import CheckpointRequest, Skip
from gpuscaler.core.preemption.tiers import checkpoint_step, hold
from gpuscaler.core.preemption.views import (
    FORECAST_PREFIX,
    NodeView,
    PodView,
    PreemptionObservation,
    VictimState,
)


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
    frees: tuple[str, ...] = ()
    """The DRA devices the victims free (driver/pool/device); empty for shares."""

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
    """Victims are given back in this order while the beneficiary still fits: PDB-protected,
    higher priority, stalest checkpoint (most work to lose), earliest start."""
    return (
        not p.pdb_blocked,
        -p.priority,
        p.checkpoint_at if p.checkpoint_at is not None else -math.inf,
        p.start_time or 0.0,
    )


def _fewest(candidates: list[PodView], fits: Callable[[list[PodView]], bool]) -> list[PodView]:
    """All candidates, less those given back (in reprieve order) while the rest still fit."""
    victims = list(candidates)
    for p in sorted(candidates, key=_reprieve_order):
        rest = [v for v in victims if v is not p]
        if fits(rest):
            victims = rest
    return victims


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
    candidates = [
        p
        for p in on_node
        if is_candidate(p, cfg) and p.priority < beneficiary.priority and p.key not in taken
    ]
    if beneficiary.wanted_devices:
        return _free_devices(beneficiary, node, on_node, candidates)
    if not node.plugin:
        return None, f"{node.name}: its GPUs are allocated through DRA only"
    shares = node.shares if beneficiary.shrink_to is None else beneficiary.shrink_to
    free = shares - sum(p.gpus for p in on_node)
    if free >= need:
        return Choice(node.name, ()), f"{node.name} has {free} free share(s) already"
    available = free + sum(p.gpus for p in candidates)
    if available < need:
        return None, f"{node.name}: {free} free + {available - free} preemptible < {need}"
    victims = _fewest(candidates, lambda rest: free + sum(p.gpus for p in rest) >= need)
    return Choice(node.name, tuple(victims)), ""


def _free_devices(
    beneficiary: PodView, node: NodeView, on_node: list[PodView], candidates: list[PodView]
) -> tuple[Choice | None, str]:
    """Victims that leave `beneficiary.wanted_devices` devices on `node` able to take its
    claims: a device nobody else holds, or (consumable capacity) one whose holders left
    apart from the victims consume no more than what it asks for allows. A device
    allocated to a claim no pod seen holds (a victim's claim not released yet) is neither
    free nor freeable."""
    need, asked = beneficiary.wanted_devices, beneficiary.wanted_capacity
    holders: dict[str, list[tuple[str, float]]] = {}
    for p in on_node:
        for h in p.devices:
            holders.setdefault(h.key, []).append((p.key, h.share))

    def takes(device: str, gone: set[str]) -> bool:
        if device in node.allocated and device not in holders:
            return False
        used = sum(share for key, share in holders.get(device, ()) if key not in gone)
        capacity = node.shared.get(device)
        if used <= 0 or not asked or capacity is None:
            return used <= 0
        part = max((v / capacity[k] for k, v in asked.items() if capacity.get(k)), default=1.0)
        return used + part <= 1.0 + 1e-9

    def usable(victims: list[PodView]) -> list[str]:
        gone = {v.key for v in victims}
        return [d for d in node.devices if takes(d, gone)]

    free = usable([])
    if len(free) >= need:
        return Choice(node.name, ()), f"{node.name} has {len(free)} free DRA device(s) already"
    can = len(usable(candidates))
    if can < need:
        why = f"{node.name}: {len(free)} free + {can - len(free)} freeable DRA device(s) < {need}"
        return None, why
    victims = _fewest(candidates, lambda rest: len(usable(rest)) >= need)
    return Choice(node.name, tuple(victims), tuple(sorted(set(usable(victims)) - set(free)))), ""


def start_preemption(
    b: PodView,
    obs: PreemptionObservation,
    cfg: PreemptionConfig,
    taken: set[str],
    budget: int,
    now: float,
) -> list[CheckpointRequest] | Skip:
    choices, reasons = [], []
    for node in obs.nodes:
        if (b.pool is not None and node.pool != b.pool) or b.only_node not in (None, node.name):
            continue
        if b.allowed_nodes is not None and node.name not in b.allowed_nodes:
            continue
        choice, why = choose_victims(b, node, obs.pods, taken, cfg)
        if choice is not None and not choice.victims:
            return hold(now, b.key, f"no action: {why}; the scheduler can place it")
        if choice is None:
            reasons.append(why)
        else:
            choices.append(choice)
    if not choices:
        detail = "; ".join(reasons[:3]) or "no GPU nodes"
        return hold(now, b.key, f"blocked: freeing preemptible pods would not fit it ({detail})")
    best = min(choices, key=Choice.rank)
    if len(best.victims) > budget:
        limits = f"max_in_flight {cfg.max_in_flight}, max_per_hour {cfg.max_per_hour}"
        why = f"needs {len(best.victims)} victim(s) on {best.node}, limits leave {budget}"
        return hold(now, b.key, f"blocked: {why} ({limits})")
    why = _need(b, now)
    out = []
    for v in best.victims:
        state = VictimState(
            v.key, b.key, best.node, v.gpus, v.priority, "none", now, now, uid=v.uid
        )
        fresh = v.checkpoint_at is not None and now - v.checkpoint_at <= cfg.checkpoint_fresh
        devices = sorted({h.key for h in v.devices} & set(best.frees))
        room = f"DRA device(s) {', '.join(devices)}" if devices else "room"
        frees = (
            f"{why}; {v.key} (priority {v.priority}, {v.gpus} share(s)) on {best.node} frees "
            f"{room}{', checkpointed recently' if fresh else ''}; asked to checkpoint within "
            f"{cfg.soft_grace:.0f}s"
        )
        out.append(checkpoint_step(now, state, frees, cfg.soft_grace, cfg.eviction_grace_period))
        taken.add(v.key)
    return out


def _need(b: PodView, now: float) -> str:
    """Why `b` needs room: fewer fragments, a forecast replica, or a pending pod."""
    if b.shrink_to is not None:
        return (
            f"fewer fragments on {b.only_node} ({b.shrink_to} shares) need the pods there to "
            "hold no more"
        )
    if b.key.startswith(FORECAST_PREFIX):
        return (
            f"forecast: {b.key.removeprefix(FORECAST_PREFIX).split('#')[0]} needs one more "
            f"replica ({b.gpus} GPU share(s)) within the horizon and its pool has no room"
        )
    waited = now - (b.unschedulable_since or now)
    wants = f"{b.gpus} GPU share(s)"
    if b.wanted_devices:
        wants = f"{b.wanted_devices} DRA GPU device(s)"
    return f"{b.key} (priority {b.priority}, {wants}) unschedulable for {waited:.0f}s"
