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
from gpuscaler.core.floor_rows import (
    Record,
    RowChunk,
    chunk_peaks,
    forecast_figures,
    pool_figures,
    remember_rows,
)
from gpuscaler.core.fragments import decide_fragments
from gpuscaler.core.guards import Outcome, invalid
from gpuscaler.core.model import (
    EMPTY_TARGET,
    History,
    Plan,
    Snapshot,
    TargetHistory,
    WorkloadObservation,
)
from gpuscaler.core.preemption import (
    PodView,
    decide_preemption,
    forecast_beneficiaries,
    fragments_beneficiaries,
)
from gpuscaler.core.replicas import (
    FloorStep,
    floor_gpus,
    floor_outcome,
    floor_record,
    reserve_sizes,
    skill_args,
)
from gpuscaler.core.reserve import Reserve, overflow_reserve_chunk
from gpuscaler.core.skill import Skill, assess_chunk
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
    figures = pool_figures([p.utilization.forecast for p in snapshot.pools])
    for obs, figs in zip(snapshot.pools, figures, strict=True):
        row = pools.get(obs.name)
        if row is None:
            continue  # observed but not configured: never touched
        pool, frag_key, frag_cfg, ts_key, ts_cfg = row
        floor = held.get(obs.name, 0.0)
        outcomes[frag_key] = decide_fragments(
            obs, pool, frag_cfg, staleness, history.get(frag_key), now, floor, figs
        )
        outcomes[ts_key] = decide_time_slice(obs, pool, ts_cfg, staleness, history.get(ts_key), now)
    outcomes.update(floors)
    # Configured targets the tick saw nothing of: no action, and say so.
    seen_pools = {p.name for p in snapshot.pools}
    for name in pools:
        if name not in seen_pools:
            for kind in ("fragments", "time_slice"):
                key = target_key(kind, name)
                outcomes[key] = invalid(
                    kind, name, now, "no observation of this node pool", history.get(key)
                )
    seen_workloads = {w.key for w in snapshot.workloads}
    for wkey in sorted(configured.keys() - seen_workloads):
        key = target_key("replica_floor", wkey)
        outcomes[key] = invalid(
            "replica_floor", wkey, now, "no observation of this workload", history.get(key)
        )
    changes: dict[str, TargetHistory] = {k: o.history for k, o in outcomes.items()}
    preempt = _preemption(snapshot, config, outcomes, now)
    found = outcomes.values()  # lists, not generators: a quarter faster
    return Plan(
        time=now,
        decisions=tuple([o.decision for o in found if o.decision is not None]) + preempt[0],
        skips=tuple([o.skip for o in found if o.skip is not None]) + preempt[1],
        history=history.updated(changes),
    )


EMPTY_OUTCOME = Outcome(EMPTY_TARGET)
"""A place held in a list of outcomes until the floor's is decided."""

PoolRow = tuple[NodePoolConfig, str, FragmentsConfig, str, TimeSliceConfig]
"""A configured node pool: its section, and its fragments' and time slice's target keys
and sections."""


def pool_rows(config: Config) -> dict[str, PoolRow]:
    """Every configured node pool's `PoolRow` by name, built once per config: a tick
    looks each observed pool up once."""
    return plan_rows(config)[1]


def _pool_table(config: Config) -> dict[str, PoolRow]:
    fragments = config.pool_sections("fragments", FragmentsConfig)
    time_slice = config.pool_sections("time_slice", TimeSliceConfig)
    return {
        p.name: (
            p,
            target_key("fragments", p.name),
            fragments[p.name],
            target_key("time_slice", p.name),
            time_slice[p.name],
        )
        for p in config.node_pools
    }


FloorRow = tuple[str, str | None, ReplicasConfig]
"""A configured workload's replica floor: its target key, node pool and section (one
object for equal sections: `floor_rows`)."""


def floor_rows(config: Config) -> dict[str, FloorRow]:
    """Every configured workload's `FloorRow` by key, built once per config: a tick
    looks each observed workload up once. Workloads whose sections are equal (the same
    values: each override makes its own section) share one, so that a tick groups
    their rows by that object (`_shared`) rather than by each row's parameters."""
    return plan_rows(config)[0]


def _floor_table(config: Config) -> dict[str, FloorRow]:
    replicas = config.workload_sections("replicas", ReplicasConfig)
    equal: dict[str, ReplicasConfig] = {}
    return {
        w.key: (
            target_key("replica_floor", w.key),
            w.node_pool,
            equal.setdefault(repr(replicas[w.key]), replicas[w.key]),
        )
        for w in config.workloads
    }


def plan_rows(config: Config) -> tuple[dict[str, FloorRow], dict[str, PoolRow]]:
    """`floor_rows` and `pool_rows` of `config`, built once per config and read with one
    `config.memo` a tick (each read of the config's private memo costs microseconds)."""
    return config.memo("plan.rows", lambda: (_floor_table(config), _pool_table(config)))


def _replica_floors(
    snapshot: Snapshot,
    rows: dict[str, FloorRow],
    staleness: float,
    history: History,
    now: float,
) -> tuple[dict[str, Outcome], dict[str, float]]:
    """This tick's replica floor outcome of every configured workload observed, and per
    node pool the GPUs its workloads' replica floors (after this tick's decisions) hold
    sized for their load: a fragment change leaves them (core.replicas.floor_gpus). The
    forecasts' skills and the overflow reserves are assessed together, and the forecasts'
    figures, the records and the observed peaks taken over rows (core.floor_rows): the
    same as one by one (`rows`: `floor_rows`)."""
    seen = [(row, wobs) for wobs in snapshot.workloads if (row := rows.get(wobs.key))]
    figures = forecast_figures(
        [wobs.load.forecast for _, wobs in seen], [row[2].lead_time for row, _ in seen]
    )
    outcomes: list[Outcome] = []
    at: list[int] = []  # the workloads whose floor waits for its skill and reserve
    pending: list[tuple[Record, float, float | None]] = []
    hs: list[TargetHistory] = []  # theirs, before this tick
    get = history.targets.get  # History.get without its call
    for i, (((key, _, cfg), wobs), figs) in enumerate(zip(seen, figures, strict=True)):
        h = get(key, EMPTY_TARGET)
        found = floor_record(wobs, cfg, staleness, h, now, figs)
        if isinstance(found, Outcome):
            outcomes.append(found)
        else:
            outcomes.append(EMPTY_OUTCOME)
            at.append(i)
            pending.append(found)
            hs.append(h)
    waiting, chunks = _remembered([seen[i] for i in at], pending, hs, now)
    skills, reserves = _skills(waiting, chunks, now), _reserves(waiting, chunks, now)
    peaks = chunk_peaks(chunks, now, [s.cfg.scale_down_stabilization for s in waiting])
    for i, step, reserve, peak in zip(at, waiting, reserves, peaks, strict=True):
        outcomes[i] = floor_outcome(step, skills.get(id(step)), reserve, peak)
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


def _remembered(
    seen: list[tuple[FloorRow, WorkloadObservation]],
    pending: list[tuple[Record, float, float | None]],
    before: list[TargetHistory],
    now: float,
) -> tuple[list[FloorStep], list[RowChunk]]:
    """The floor steps of the `seen` workloads, given their `floor_record`s and their
    histories `before` this tick: the records remembered together
    (floor_rows.remember_rows), and its chunks."""
    hs, chunks = remember_rows(
        before,
        now,
        [record for record, *_ in pending],
        [keep for _, keep, _ in pending],
    )
    return [
        FloorStep(wobs, row[2], h, now, record[2], record[1], peak)
        for (row, wobs), (record, _, peak), h in zip(seen, pending, hs, strict=True)
    ], chunks


def _skills(steps: list[FloorStep], chunks: list[RowChunk], now: float) -> dict[int, Skill]:
    """The skill of every step whose floor checks it (by the step's id), assessed from
    the chunks of its remembered records (`remember_rows`), together per set of skill
    parameters (taken once a config section)."""
    found: dict[int, Skill] = {}
    args_of: dict[int, tuple[float, float, int, float] | None] = {}
    for idx, recs in chunks:
        groups: dict[tuple[float, float, int, float], list[int]] = {}
        if (shared := _shared(steps, idx)) is not None:  # most often: one for all
            if shared.skill_check:
                groups[skill_args(shared)] = list(range(len(idx)))
        else:
            for j, i in enumerate(idx):
                cfg = steps[i].cfg
                if id(cfg) not in args_of:
                    args_of[id(cfg)] = skill_args(cfg) if cfg.skill_check else None
                if (args := args_of[id(cfg)]) is not None:
                    groups.setdefault(args, []).append(j)
        for args, js in groups.items():
            part = recs if len(js) == len(idx) else recs[js]
            skills = assess_chunk(part, now, *args)
            found.update((id(steps[idx[j]]), k) for j, k in zip(js, skills, strict=True))
    return found


def _reserves(steps: list[FloorStep], chunks: list[RowChunk], now: float) -> list[Reserve | None]:
    """The overflow reserve of every step, read from the chunks of its remembered records
    (`remember_rows`), together per window and span."""
    found: list[Reserve | None] = [None] * len(steps)
    for idx, recs in chunks:
        groups: dict[tuple[float, float], list[int]] = {}
        if (shared := _shared(steps, idx)) is not None:  # most often: one for all
            groups[shared.scale_down_stabilization, shared.reserve_window] = list(range(len(idx)))
        else:
            for j, i in enumerate(idx):
                cfg = steps[i].cfg
                key = (cfg.scale_down_stabilization, cfg.reserve_window)
                groups.setdefault(key, []).append(j)
        for (window, span), js in groups.items():
            sizes = [reserve_sizes(steps[idx[j]].obs, steps[idx[j]].cfg) for j in js]
            part = recs if len(js) == len(idx) else recs[js]
            at, full = [a for a, _ in sizes], [f for _, f in sizes]
            reserves = overflow_reserve_chunk(part, now, window, span, at, full)
            for j, r in zip(js, reserves, strict=True):
                found[idx[j]] = r
    return found


def _shared(steps: list[FloorStep], idx: list[int]) -> ReplicasConfig | None:
    """The section all the steps `idx` have (one object: no workload overrides it), or
    None: their rows are grouped by section's parameters one by one."""
    first = steps[idx[0]].cfg
    return first if all(steps[i].cfg is first for i in idx) else None


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
                extra += fragments_beneficiaries(
                    p.name,
                    p.fragments,
                    out.blocked_until_preempted,
                    seen,
                    config.preemption.beneficiary_min_priority,
                )
    seen = replace(seen, pods=seen.pods + extra)
    return decide_preemption(seen, config.preemption, now)
