"""The preemption decider: the next step of every preemption under way, new ones for
pending pods, and the beneficiaries a forecast or fewer fragments ask for."""

from __future__ import annotations

import math

from gpuscaler.config import PreemptionConfig
from gpuscaler.core.decisions import PreemptionStep, Skip
from gpuscaler.core.preemption.choice import is_beneficiary, start_preemption
from gpuscaler.core.preemption.tiers import IN_FLIGHT, KIND, progress
from gpuscaler.core.preemption.views import (
    FORECAST_PREFIX,
    FRAGMENTS_PREFIX,
    PodView,
    PreemptionObservation,
)


def decide_preemption(
    obs: PreemptionObservation, cfg: PreemptionConfig, now: float
) -> tuple[tuple[PreemptionStep, ...], tuple[Skip, ...]]:
    """The next step of every preemption under way, and new ones for pending pods."""
    if not cfg.enabled:
        return (), ()
    if obs.problem is not None:
        return (), (Skip(now, KIND, "cluster", f"no action: {obs.problem}", invalid_input=True),)
    pods = {p.key: p for p in obs.pods}
    decisions: list[PreemptionStep] = []
    skips: list[Skip] = []
    for s in obs.states:
        out = progress(s, pods, obs, cfg, now)
        if isinstance(out, PreemptionStep):
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
        started = start_preemption(b, obs, cfg, taken, budget, now)
        if isinstance(started, Skip):
            skips.append(started)
        else:
            decisions += started
            budget -= len(started)
    return tuple(decisions), tuple(skips)


def forecast_beneficiaries(
    wanted: list[tuple[str, str, str, int, int, int]],
) -> tuple[PodView, ...]:
    """Replicas a forecast floor asks for that do not exist yet, as pending pods: (workload
    key, namespace, pool, priority, missing replicas, shares per replica). Their keys are
    stable across ticks: a preemption for one is aborted once the forecast no longer asks."""
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
