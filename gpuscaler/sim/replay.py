"""The what-if replay: a workload's own Prometheus history through the simulator's model.

Pure: it takes the `WorkloadHistory` the history adapter read and runs it through
`simulate` (gpuscaler's policy, the reactive HPA, every baseline swept) exactly as a trace
CSV would be, plus once more with the replica counts the cluster actually ran. Same
trace, seed and config give the same figures as `gpuscaler simulate`.

The load model is derived, not measured: requests per second become Poisson arrivals of
`simulator.gpu_seconds_per_request` GPU-seconds each. When only GPU load is known, the
request rate is derived from it (load / 100 / GPU-seconds per request): that load is what
was served, so demand that queued unserved is not in it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuscaler.config import Config, WorkloadConfig
from gpuscaler.core.history import Signal, WorkloadHistory, gaps, native_resolution
from gpuscaler.core.model import Series
from gpuscaler.sim.around import MANY_BYTES, Around, around_many
from gpuscaler.sim.lockstep import lockstep_key, lockstep_runs
from gpuscaler.sim.simulate import (
    DEFAULT_POOL,
    Prepared,
    RunResult,
    SimulationResult,
    finish,
    prepare,
    release,
    warmup_plan,
)
from gpuscaler.sim.trace import Trace, TraceError


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
    """The config the simulator replays `workload` with: that workload alone, on its
    pool (the simulator's default pool when it names none), with no synthetic burst of
    preemptions (history has its own), in slots of `slot` seconds (the history's read
    step: what Prometheus keeps of a week is never 500 ms; default: simulator.slot)."""
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


def history_trace(key: str, demand: Series) -> Trace:
    """The demand as the simulator's trace: requests per bin of one read step."""
    return Trace(key, demand.start, demand.step, demand.values * demand.step, "prometheus")


@dataclass(frozen=True, eq=False)
class Ready:
    """A workload's history checked and prepared for the replay: what the replay and its
    limits read of the history (the demand itself is let go: its arrivals are in
    `prepared`, its gaps in `gap_lines`)."""

    key: str
    signal: str
    replicas: Signal
    """The replicas that ran (their series, or why there is none)."""
    gap_lines: list[str]
    problem_lines: list[str]
    prepared: Prepared

    def limits(self, actual: dict[str, Any] | None) -> list[str]:
        """`limits` of the history this was made of."""
        return [*self.gap_lines, actual_line(self.replicas, actual), *self.problem_lines]


def ready(
    history: WorkloadHistory, config: Config, workload: WorkloadConfig, seed: int
) -> Ready | Skipped:
    """The history as a replay to run, or why it cannot be replayed. The history holds
    one read step of margin on each side of the range."""
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
    try:
        prepared = prepare(
            history_trace(history.key, demand), seconds / 3600, seed, cfg, history.step / 3600
        )
    except TraceError as e:
        return Skipped(history.key, str(e))
    return Ready(
        history.key, signal, history.replicas, gap_lines(demand), problem_lines(history), prepared
    )


def finished(r: Ready, run: RunResult, around: Around) -> WorkloadReplay:
    """The replay around gpuscaler's run: the reactive HPA, the baselines and the
    replicas that ran when known, as `around` found them."""
    assert around.reactive is not None
    result = finish(r.prepared, run, around.reactive, around.curves)
    actual = around.actual
    if actual is not None:
        actual["source"] = r.replicas.name
    return WorkloadReplay(r.key, r.signal, result, actual, r.limits(actual))


LANE_SLOT_BYTES = 8 + 4 + 3 * 8 + 8
"""What a lane holds a slot while its lockstep runs (its run's served work, GPUs held,
capacity, demand and replicas, and its arrivals): what the sweep of the runs around the
lockstep may record a lane's slot in its place (the lanes' records are released before
it starts)."""


def freed(preps: Sequence[Prepared]) -> int:
    """Bytes the sweep around the lanes of `preps` may record for its group of runs:
    `LANE_SLOT_BYTES` a lane's slot, in the place of what the lanes held."""
    return sum(LANE_SLOT_BYTES * len(p.arrivals) for p in preps)


def replay_many(
    histories: Iterable[tuple[WorkloadHistory, WorkloadConfig]],
    config: Config,
    seed: int,
    baselines: bool = True,
    lanes: int = 1,
    plot: bool = True,
    progress: Callable[[float], None] | None = None,
) -> Iterator[WorkloadReplay | Skipped]:
    """Each workload's replay, in order. Up to `lanes` workloads at a time run gpuscaler's
    controller in lockstep (`gpuscaler.sim.lockstep`: one controller, one batched forecast
    a tick); the runs around them (the reactive HPA, the replicas that ran, the baselines)
    then run in one sweep, and each replay is yielded before the next lockstep starts.
    Each run is `simulate.release`d as soon as it ends (its figures, and the PNG's series
    when `plot`, kept; its record let go). A history is let go once checked (`Ready`
    keeps what the replay reads of it) when the caller holds it no more. `progress` is
    told each lockstep's share of ticks done (`lockstep_runs`)."""
    out: list[Ready | Skipped] = [ready(h, config, w, seed) for h, w in histories]
    groups: dict[tuple[float, float, int, str], list[Ready]] = {}
    for r in out:
        if isinstance(r, Ready):
            groups.setdefault(lockstep_key(r.prepared), []).append(r)
    size = max(1, lanes)
    chunk_of: dict[int, list[Ready]] = {}
    for group in groups.values():
        for i in range(0, len(group), size):
            chunk_of.update((id(x), group[i : i + size]) for x in group[i : i + size])
    runs: dict[int, RunResult] = {}
    arounds: dict[int, Around] = {}
    for r in out:
        if isinstance(r, Skipped):
            yield r
            continue
        if id(r) not in runs:
            chunk = chunk_of[id(r)]
            preps = [x.prepared for x in chunk]
            done = lockstep_runs(preps, progress)
            for x, p, run in zip(chunk, preps, done, strict=True):
                runs[id(x)] = release(p, run, plot)
            del done
            series = [x.replicas.series for x in chunk]
            budget = max(MANY_BYTES, freed(preps))
            done_around = around_many(preps, series, baselines, budget=budget, released=plot)
            arounds.update((id(x), a) for x, a in zip(chunk, done_around, strict=True))
        yield finished(r, runs.pop(id(r)), arounds.pop(id(r)))


def replay(
    history: WorkloadHistory,
    config: Config,
    workload: WorkloadConfig,
    seed: int,
    baselines: bool = True,
) -> WorkloadReplay | Skipped:
    """One workload's history through the model: gpuscaler, the reactive HPA and the
    baselines (by `simulate`), and the replicas that ran when known."""
    [done] = replay_many([(history, workload)], config, seed, baselines)
    return done


def _hours(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def limits(history: WorkloadHistory, demand: Series, actual: dict[str, Any] | None) -> list[str]:
    """The honest limits of one workload's replay, in words."""
    return [*gap_lines(demand), actual_line(history.replicas, actual), *problem_lines(history)]


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


def actual_line(replicas: Signal, actual: dict[str, Any] | None) -> str:
    """Whether, and how, the replicas that ran were replayed."""
    if actual is None:
        why = replicas.problem or "no kube-state-metrics replica series matched"
        return f"replicas that ran unknown ({why}): no replay of them"
    return "the replicas that ran are replayed at the pool's initial fragments"


def problem_lines(history: WorkloadHistory) -> list[str]:
    """The samples dropped from the series read (out of range, ...)."""
    return [
        f"{s.name}: {s.problem} (those samples dropped)"
        for s in (history.requests, history.load, history.replicas)
        if s.problem is not None and s.series is not None
    ]


# ----------------------------------------------------------------------- verdict

SHARE_MARGIN = 1e-4
"""SLO-violation shares closer than this (0.01 % of requests) count as equal."""
HOURS_MARGIN = 0.01
"""GPU-hours within 1 % count as equal."""


def hours_at_share(curve: list[dict[str, Any]], share: float) -> tuple[float, bool] | None:
    """(GPU-hours, at the sweep's edge) the cheapest point of the curve (linear between
    swept targets) at or under `share`; None when no swept target reaches it. At the
    edge: even the cheapest target reaches it, so a cheaper one might too."""
    points = sorted(curve, key=lambda p: (p["gpu_hours"], -p["target_pct"]))
    prev: dict[str, Any] | None = None
    for p in points:
        if p["slo_violation_share"] <= share + 1e-12:
            if prev is None:
                return float(p["gpu_hours"]), True
            s0, s1 = prev["slo_violation_share"], p["slo_violation_share"]
            h0, h1 = prev["gpu_hours"], p["gpu_hours"]
            frac = (s0 - share) / (s0 - s1) if s0 != s1 else 1.0
            return float(h0 + frac * (h1 - h0)), False
        prev = p
    return None


def compare(summary: dict[str, Any]) -> dict[str, Any]:
    """The what-if table's row: GPU-hours saved at equal SLO and SLO violations avoided at
    equal GPU-hours, each against the best baseline, and the verdict."""
    g = summary["gpuscaler"]
    needed = {
        name: hours_at_share(curve, g["slo_violation_share"])
        for name, curve in summary.get("baselines", {}).items()
    }
    reached = {k: v for k, v in needed.items() if v is not None}
    saved = None
    if reached:
        best = min(reached, key=lambda k: reached[k][0])
        hours, edge = reached[best]
        saved = {
            "gpu_hours": round(hours - g["gpu_hours"], 3),
            "against": best,
            "at_sweep_edge": edge,
        }
    at_equal = {k: v for k, v in summary.get("equal_cost", {}).items() if v is not None}
    avoided = None
    if at_equal:
        best = min(at_equal, key=lambda k: at_equal[k]["slo_violation_share"])
        avoided = {
            "share": round(at_equal[best]["slo_violation_share"] - g["slo_violation_share"], 6),
            "against": best,
        }
    return {
        "gpu_hours_saved": saved,
        "violations_avoided": avoided,
        "verdict": verdict(g, saved, avoided),
    }


def verdict(g: dict[str, Any], saved: dict[str, Any] | None, avoided: dict[str, Any] | None) -> str:
    """`enable` when gpuscaler beats the best baseline on one axis and loses on neither;
    `keep reactive` when it does not; `not enough data` when neither axis compares."""
    if saved is None and avoided is None:
        return "not enough data"
    cheaper = saved is not None and saved["gpu_hours"] > HOURS_MARGIN * g["gpu_hours"]
    dearer = saved is not None and saved["gpu_hours"] < -HOURS_MARGIN * g["gpu_hours"]
    fewer = avoided is not None and avoided["share"] > SHARE_MARGIN
    more = avoided is not None and avoided["share"] < -SHARE_MARGIN
    return "enable" if (cheaper or fewer) and not (dearer or more) else "keep reactive"
