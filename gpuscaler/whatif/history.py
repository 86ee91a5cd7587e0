"""The what-if replay, pure: each `WorkloadHistory` read runs as `gpuscaler simulate` runs
a trace (gpuscaler, the reactive HPA, every baseline swept), plus once with the replicas
that ran; same history, seed and config, same figures.

The load model is derived, not measured: requests per second become Poisson arrivals of
`simulator.gpu_seconds_per_request` GPU-seconds each, derived from the GPU load when only
that is known (load / 100 / GPU-seconds per request: served load, so demand that queued
unserved is not in it)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuscaler.config import Config, WorkloadConfig
from gpuscaler.core.history import Signal, WorkloadHistory, gaps, native_resolution
from gpuscaler.core.model import Series
from gpuscaler.sim.equal_cost import WHATIF_BASELINES
from gpuscaler.sim.lockstep import lockstep_runs
from gpuscaler.sim.records import RunResult, SimulationResult
from gpuscaler.sim.replay import DEFAULT_POOL, Prepared, prepare, warmup_plan
from gpuscaler.sim.sweep import Around, around_many
from gpuscaler.sim.trace import Trace, TraceError
from gpuscaler.whatif.verdict import compare


@dataclass
class Skipped:
    key: str
    reason: str


@dataclass
class WorkloadReplay:
    key: str
    signal: str
    """Which signal the demand was derived from, in words."""
    result: SimulationResult
    actual: dict[str, Any] | None
    """The replay with the replicas that ran: its SLO figures; None when unknown."""
    limits: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        s = self.result.summary()
        s["workload"] = self.key
        s["load_model"] = f"derived, not measured: {self.signal}"
        s["actual"] = self.actual
        s["comparison"] = compare(s)
        s["limits"] = self.limits
        records = [d.as_record() for d in self.result.gpuscaler.decisions]
        s["decision_counts"] = dict(Counter(str(r["kind"]) for r in records))
        s["decision_examples"] = records[:5]
        return s


def workload_config(config: Config, workload: WorkloadConfig, slot: float | None = None) -> Config:
    """The config replaying `workload` alone on its pool (the default one when it names
    none), without the synthetic preemption burst (history has its own), in slots of
    `slot` seconds (the read step; default: simulator.slot)."""
    pools = config.node_pools
    if workload.node_pool is None or all(p.name != workload.node_pool for p in pools):
        workload = workload.model_copy(update={"node_pool": DEFAULT_POOL.name})
        pools = (*pools, DEFAULT_POOL)
    update: dict[str, float | None] = {"preemption_burst_after": None}
    if slot is not None:
        update["slot"] = slot
    simulator = config.simulator.model_copy(update=update)
    return config.model_copy(
        update={"workloads": (workload,), "node_pools": pools, "simulator": simulator}
    )


def demand_rate(history: WorkloadHistory, config: Config) -> tuple[Series, str] | str:
    """(requests per second, which signal) or why there is no demand signal."""
    req, load = history.requests, history.load
    if req.series is not None:  # samples out of range are dropped (NaN), listed in limits
        return req.series, f"request rate ({req.query})"
    if load.series is not None:
        per_request = config.simulator.gpu_seconds_per_request
        rate = load.series.values / 100.0 / per_request
        what = (
            f"GPU load ({load.query}) / {per_request:g} GPU-seconds per request: served "
            "load, so demand that queued unserved is missing"
        )
        return Series(load.series.start, load.series.step, rate), what
    why = [f"{s.name}: {s.problem or 'no series matched'}" for s in (req, load)]
    return "no demand signal (" + "; ".join(why) + ")"


@dataclass(frozen=True, eq=False)
class Ready:
    """A workload's history checked and prepared (its demand kept only as `prepared`'s
    arrivals and its `gap_lines`)."""

    key: str
    signal: str
    replicas: Signal
    """The replicas that ran (their series, or why there is none)."""
    gap_lines: list[str]
    problem_lines: list[str]
    """The samples dropped from the series read (out of range, ...)."""
    prepared: Prepared

    def limits(self, actual: dict[str, Any] | None) -> list[str]:
        """The honest limits of the replay, in words."""
        if actual is None:
            why = self.replicas.problem or "no kube-state-metrics replica series matched"
            ran = f"replicas that ran unknown ({why}): no replay of them"
        else:
            ran = "the replicas that ran are replayed at the pool's initial fragments"
        return [*self.gap_lines, ran, *self.problem_lines]


def ready(
    history: WorkloadHistory, config: Config, workload: WorkloadConfig, seed: int
) -> Ready | Skipped:
    """The history (one read step of margin each side) as a replay, or why it is none."""
    cfg = workload_config(config, workload, history.step)
    found = demand_rate(history, cfg)
    if isinstance(found, str):
        return Skipped(history.key, found)
    demand, signal = found
    resolution = native_resolution(demand)
    if resolution > cfg.control.interval:
        return Skipped(
            history.key,
            f"series coarser than the step: the demand changes every {resolution:g}s, "
            f"the replay needs at least one value per control interval "
            f"({cfg.control.interval:g}s)",
        )
    finite = np.isfinite(demand.values)
    used = history.requests if history.requests.series is not None else history.load
    # Samples out of range were dropped: that, not the history's length, is the cause.
    few = f"{used.name}: {used.problem}; too few samples left" if used.problem else None
    if finite.sum() < 2:
        return Skipped(history.key, few or "too little history: fewer than 2 samples")
    seconds = history.end - history.start - 2 * history.step
    known = float(finite.sum()) * demand.step
    try:
        warmup_plan(cfg, min(seconds, known), history.key)
    except TraceError as e:
        return Skipped(history.key, f"{few} ({e})" if few else f"too little history: {e}")
    # The demand as a trace: requests per bin of one read step.
    trace = Trace(history.key, demand.start, demand.step, demand.values * demand.step, "prometheus")
    try:
        prepared = prepare(trace, seconds / 3600, seed, cfg, history.step / 3600)
    except TraceError as e:
        return Skipped(history.key, str(e))
    dropped = [
        f"{s.name}: {s.problem} (those samples dropped)"
        for s in (history.requests, history.load, history.replicas)
        if s.problem is not None and s.series is not None
    ]
    return Ready(history.key, signal, history.replicas, gap_lines(demand), dropped, prepared)


def replay_many(
    histories: Iterable[tuple[WorkloadHistory, WorkloadConfig]],
    config: Config,
    seed: int,
    baselines: bool = True,
    lanes: int = 1,
    plot: bool = True,
    progress: Callable[[float], None] | None = None,
) -> Iterator[WorkloadReplay | Skipped]:
    """Each workload's replay, in order: up to `lanes` of one model at a time run gpuscaler
    in lockstep (one batched forecast a tick), then the runs around them in one sweep, each
    finished as it ends (the PNG's series kept when `plot`) and yielded before the next
    lockstep. `progress` is told each lockstep's share of ticks done."""
    out: list[Ready | Skipped] = [ready(h, config, w, seed) for h, w in histories]
    groups: dict[tuple[float, float, int, str], list[Ready]] = {}
    for r in out:
        if isinstance(r, Ready):
            groups.setdefault(r.prepared.key(), []).append(r)
    size = max(1, lanes)
    chunk_of = {
        id(x): g[i : i + size]
        for g in groups.values()
        for i in range(0, len(g), size)
        for x in g[i : i + size]
    }
    done: dict[int, tuple[RunResult, Around]] = {}
    for r in out:
        if isinstance(r, Skipped):
            yield r
            continue
        if id(r) not in done:
            chunk = chunk_of[id(r)]
            preps = [x.prepared for x in chunk]
            runs = lockstep_runs(preps, progress, plot=plot)
            series = [x.replicas.series for x in chunk]
            names = WHATIF_BASELINES if baselines else ()
            arounds = around_many(preps, series, names, plot=plot)
            for x, run, around in zip(chunk, runs, arounds, strict=True):
                done[id(x)] = (run, around)
            del runs, arounds
        run, around = done.pop(id(r))
        assert around.reactive is not None
        result = SimulationResult(r.prepared, run, around.reactive, around.curves or {})
        if around.actual is not None:
            around.actual["source"] = r.replicas.name
        yield WorkloadReplay(r.key, r.signal, result, around.actual, r.limits(around.actual))


def _hours(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def gap_lines(demand: Series) -> list[str]:
    """The gaps in the demand history (none: no line)."""
    holes = gaps(demand)
    if not holes:
        return []
    missing = sum(b - a + demand.step for a, b in holes)
    first = ", ".join(f"{_hours(a)}..{_hours(b)}" for a, b in holes[:3])
    return [
        f"{len(holes)} gap(s) in the demand history ({missing / 3600:.2f} h, interpolated "
        f"over): {first}{' ...' if len(holes) > 3 else ''}"
    ]
