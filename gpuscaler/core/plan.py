"""The pure planner: snapshot + config + history + now in, a plan out."""

from __future__ import annotations

from dataclasses import replace

from gpuscaler.config import (
    Config,
    FragmentsConfig,
    NodePoolConfig,
    ReplicasConfig,
    TimeSliceConfig,
)
from gpuscaler.core.decisions import PreemptionStep, ReplicaFloorDecision, Skip, target_key
from gpuscaler.core.fragments import decide_fragments
from gpuscaler.core.guards import Outcome, invalid
from gpuscaler.core.model import History, Plan, Snapshot, TargetHistory
from gpuscaler.core.preemption import (
    PodView,
    decide_preemption,
    forecast_beneficiaries,
    fragments_beneficiaries,
)
from gpuscaler.core.replicas import floor_gpus, replica_floors
from gpuscaler.core.time_slice import decide_time_slice


def _forecast_demand(
    snapshot: Snapshot, config: Config, outcomes: dict[str, Outcome]
) -> tuple[PodView, ...]:
    """Replicas of high-priority workloads that their forecast floor asks for (this tick's
    decision, else the floor in force) and that do not exist yet."""
    workloads = {w.key: w for w in config.workloads}
    wanted = []
    for obs in snapshot.workloads:
        w = workloads.get(obs.key)
        if (
            w is None
            or w.node_pool is None
            or w.priority is None
            or w.priority < config.preemption.beneficiary_min_priority
            or obs.replicas is None
        ):
            continue
        outcome = outcomes.get(target_key("replica_floor", obs.key))
        floor = obs.floor
        if outcome is not None and isinstance(outcome.decision, ReplicaFloorDecision):
            floor = outcome.decision.to_value
        missing = (floor or 0) - obs.replicas
        if missing > 0:
            wanted.append(
                (w.key, w.namespace, w.node_pool, w.priority, missing, w.gpus_per_replica)
            )
    return forecast_beneficiaries(wanted)


def plan(snapshot: Snapshot, config: Config, history: History, now: float) -> Plan:
    outcomes: dict[str, Outcome] = {}
    staleness = config.metrics.staleness
    configured, pools = plan_rows(config)
    floors, held = _replica_floors(snapshot, configured, staleness, history, now)
    for obs in snapshot.pools:
        row = pools.get(obs.name)
        if row is None:
            continue  # observed but not configured: never touched
        pool, frag_key, frag_cfg, ts_key, ts_cfg = row
        floor = held.get(obs.name, 0.0)
        outcomes[frag_key] = decide_fragments(
            obs, pool, frag_cfg, staleness, history.get(frag_key), now, floor
        )
        outcomes[ts_key] = decide_time_slice(obs, pool, ts_cfg, staleness, history.get(ts_key), now)
    outcomes.update(floors)
    # Configured targets the tick saw nothing of: no action, and say so.
    seen_pools = {p.name for p in snapshot.pools}
    for name in pools:
        if name not in seen_pools:
            for kind in ("fragments", "time_slice"):
                key = target_key(kind, name)
                why = "no observation of this node pool"
                outcomes[key] = invalid(kind, name, now, why, history.get(key))
    seen_workloads = {w.key for w in snapshot.workloads}
    for wkey in sorted(configured.keys() - seen_workloads):
        key = target_key("replica_floor", wkey)
        why = "no observation of this workload"
        outcomes[key] = invalid("replica_floor", wkey, now, why, history.get(key))
    changes: dict[str, TargetHistory] = {k: o.history for k, o in outcomes.items()}
    preempt = _preemption(snapshot, config, outcomes, now)
    found = outcomes.values()
    return Plan(
        time=now,
        decisions=tuple(o.decision for o in found if o.decision is not None) + preempt[0],
        skips=tuple(o.skip for o in found if o.skip is not None) + preempt[1],
        history=history.updated(changes),
    )


PoolRow = tuple[NodePoolConfig, str, FragmentsConfig, str, TimeSliceConfig]
"""A node pool's section, and its fragments' and time slice's target keys and sections."""
FloorRow = tuple[str, str | None, ReplicasConfig]
"""A configured workload's replica floor: its target key, node pool and section."""


def plan_rows(config: Config) -> tuple[dict[str, FloorRow], dict[str, PoolRow]]:
    """Every configured workload's `FloorRow` and node pool's `PoolRow` by key, built once
    per config: a tick looks each observed target up once."""
    return config.memo("plan.rows", lambda: _rows(config))


def _rows(config: Config) -> tuple[dict[str, FloorRow], dict[str, PoolRow]]:
    replicas = config.workload_sections("replicas", ReplicasConfig)
    fragments = config.pool_sections("fragments", FragmentsConfig)
    time_slice = config.pool_sections("time_slice", TimeSliceConfig)
    floors = {
        w.key: (target_key("replica_floor", w.key), w.node_pool, replicas[w.key])
        for w in config.workloads
    }
    pools = {
        p.name: (
            p,
            target_key("fragments", p.name),
            fragments[p.name],
            target_key("time_slice", p.name),
            time_slice[p.name],
        )
        for p in config.node_pools
    }
    return floors, pools


def _replica_floors(
    snapshot: Snapshot, rows: dict[str, FloorRow], staleness: float, history: History, now: float
) -> tuple[dict[str, Outcome], dict[str, float]]:
    """This tick's floor outcome of every configured workload observed, and per node pool
    what its floors (after this tick's decisions) hold sized for their load (`floor_gpus`)."""
    seen = [(row, wobs) for wobs in snapshot.workloads if (row := rows.get(wobs.key))]
    outcomes = replica_floors(
        [(wobs, row[2], history.get(row[0])) for row, wobs in seen], staleness, now
    )
    out: dict[str, Outcome] = {}
    held: dict[str, float] = {}
    for ((key, name, rep_cfg), wobs), outcome in zip(seen, outcomes, strict=True):
        out[key] = outcome
        if name is None:
            continue
        floor, decision = wobs.floor, outcome.decision
        if decision is not None and isinstance(decision, ReplicaFloorDecision):
            floor = int(decision.to_value)
        held[name] = held.get(name, 0.0) + floor_gpus(wobs, rep_cfg, floor)
    return out, held


def _preemption(
    snapshot: Snapshot, config: Config, outcomes: dict[str, Outcome], now: float
) -> tuple[tuple[PreemptionStep, ...], tuple[Skip, ...]]:
    """Preemption steps, with the beneficiaries this tick's other decisions ask for (a
    forecast floor's missing replicas, fewer fragments blocked by shares held)."""
    if snapshot.preemption is None:
        return (), ()
    seen = snapshot.preemption
    extra: tuple[PodView, ...] = ()
    if config.preemption.forecast_trigger:
        extra += _forecast_demand(snapshot, config, outcomes)
    if config.preemption.fragments_trigger:
        for p in snapshot.pools:
            out = outcomes.get(target_key("fragments", p.name))
            if out is not None and out.blocked_until_preempted and p.fragments:
                to, least = out.blocked_until_preempted, config.preemption.beneficiary_min_priority
                extra += fragments_beneficiaries(p.name, p.fragments, to, seen, least)
    seen = replace(seen, pods=seen.pods + extra)
    return decide_preemption(seen, config.preemption, now)
