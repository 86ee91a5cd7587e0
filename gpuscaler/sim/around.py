"""The runs around gpuscaler's of many replays, as one sweep: the baselines swept over
their targets, the reactive HPA (the simulator's reference run) and the replicas that
actually ran (what-if's third replay).

The reactive HPA is a baseline run of its own: `hpa_util` at the workload's target with
its min_replicas floor, no controller; the replicas that ran are a run whose replicas are
set at each control tick to the count read, no scaler. Both run in the sweep of the
baselines (`gpuscaler.sim.sweep`, the runs of replays that share a model,
`sweep.same_model`, together) with their whole record kept, so their figures are bit for
bit those of their own `SimulatedCluster` (`simulate.reactive_run`, `actual_run`:
tests/test_around.py compares both) at a fraction of the cost: a lone run steps a week's
20,160 control ticks with a dozen small numpy calls each, the sweep one more row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuscaler.config import Config
from gpuscaler.core.model import FloatArray, Series
from gpuscaler.sim.baselines import Curves, Extra, swept_with
from gpuscaler.sim.cluster import Recorder, SimulatedCluster
from gpuscaler.sim.scalers import IntArray
from gpuscaler.sim.simulate import (
    ForecastTrack,
    Prepared,
    RunResult,
    SimulationResult,
    finish,
    gpuscaler_run,
    prepare,
    reactive_run,
    release,
    scenario_cluster,
    slo_metrics,
)
from gpuscaler.sim.sweep_groups import SWEEP_BYTES
from gpuscaler.sim.swept import SweepResult, same_model
from gpuscaler.sim.ticks import control_ticks
from gpuscaler.sim.trace import Trace

if TYPE_CHECKING:
    from gpuscaler.observability import ControllerMetrics

MANY_BYTES = 64 * 2**20
"""What one group of a chunk's sweeps may record (a week at 10 s: 3 workloads' 35 runs),
less than a lone sweep's SWEEP_BYTES: whatif holds its lanes' runs meanwhile, in each of
its processes, within the 1 GB of the whole run."""


@dataclass
class Around:
    """What runs around gpuscaler's run of one replay."""

    curves: Curves | None
    """The baselines' curves (None: not swept)."""
    reactive: RunResult | None
    """The reactive HPA's run (None: not run)."""
    actual: dict[str, Any] | None
    """The figures of the replicas that ran (`actual_figures`; None: unknown)."""


def held(replicas: Series) -> FloatArray:
    """The replica counts with the last known one held over each gap (and the first
    known one before it)."""
    values = replicas.values.copy()
    finite = np.isfinite(values)
    if not finite.any():
        return values
    idx = np.where(finite, np.arange(len(values)), 0)
    np.maximum.accumulate(idx, out=idx)
    values = values[idx]
    first = int(np.flatnonzero(finite)[0])
    values[:first] = values[first]
    return values


def actual_counts(replicas: Series, ticks: Sequence[float]) -> IntArray:
    """The replicas that ran at each tick (the last read at or before it, held over gaps,
    rounded half to even, at least 1), for all ticks at once."""
    counts = held(replicas)
    at = (np.asarray(ticks, dtype=np.float64) - replicas.start) / replicas.step
    index = np.clip(np.floor(at), 0, len(counts) - 1).astype(np.int64)
    values = counts[index]
    if not np.isfinite(values).all():
        raise ValueError("a replica count read is not finite")
    return np.maximum(1, np.rint(values)).astype(np.int64)


def actual_figures(cluster: SimulatedCluster, scored_from: int) -> dict[str, Any]:
    """The SLO figures of the replay with the replicas that ran, and their mean."""
    s = slice(scored_from, cluster.cursor)
    return {
        **slo_metrics(cluster, scored_from, cluster.sim.slo_wait),
        "mean_replicas": round(float(np.mean(cluster.rec.replicas[s])), 2),
    }


def actual_run(
    config: Config,
    replicas: Series,
    arrivals: FloatArray,
    start: float,
    seconds: float,
    seed: int,
    scored_from: int,
) -> dict[str, Any]:
    """SLO figures of the replay with the replicas that ran (read at each control
    interval), at the pool's initial fragments (the fragments that ran are not read).
    One run alone (`around_many` runs it in a sweep with others: the same figures)."""
    cluster = scenario_cluster(config, arrivals, start, seed, controlled=False)
    ticks = control_ticks(start, seconds, config.control.interval)
    for t, n in zip(ticks, actual_counts(replicas, ticks).tolist(), strict=True):
        cluster.advance_to(t)
        cluster.set_replicas(t, n)
    cluster.advance_to(start + seconds)
    return actual_figures(cluster, scored_from)


def _template(p: Prepared, like: Sequence[SimulatedCluster] = ()) -> SimulatedCluster:
    """Replay `p`'s cluster as a sweep reads it; its random streams those of a template of
    `like` that drew the same ones (one seed, one length: the same arrays, held once)."""
    t = scenario_cluster(p.config, p.arrivals, p.start, p.seed, controlled=False)
    t.rec = Recorder(0)  # a sweep's template is never advanced: nothing to record
    for other in like:
        if all(np.array_equal(getattr(t, a), getattr(other, a)) for a in SHARED):
            for a in SHARED:
                setattr(t, a, getattr(other, a))
            break
    return t


SHARED = ("noise", "stall_noise", "dropped")
"""A template's random streams (`SimulatedCluster._draw`) other templates may share."""


def _templates(prepared: Sequence[Prepared]) -> list[SimulatedCluster]:
    out: list[SimulatedCluster] = []
    for p in prepared:
        out.append(_template(p, out[:1]))
    return out


def _groups(prepared: Sequence[Prepared], templates: Sequence[SimulatedCluster]) -> list[list[int]]:
    """The replays that can share a sweep: the same seed, range and model."""
    groups: list[list[int]] = []
    for i, (p, t) in enumerate(zip(prepared, templates, strict=True)):
        for g in groups:
            first = prepared[g[0]]
            if (first.seed, first.seconds) == (p.seed, p.seconds) and same_model(
                templates[g[0]], t
            ):
                g.append(i)
                break
        else:
            groups.append([i])
    return groups


def _ran(p: Prepared, r: SweepResult, n: int) -> SimulatedCluster:
    """A kept run of the sweep as the `SimulatedCluster` that ran it alone would be."""
    cluster = scenario_cluster(p.config, p.arrivals, p.start, p.seed, controlled=False)
    assert r.recorder is not None
    cluster.rec, cluster.cursor, cluster.replica_changes = r.recorder, n, r.replica_changes
    return cluster


def _released(p: Prepared, run: RunResult | None, plot: bool | None) -> RunResult | None:
    return run if run is None or plot is None else release(p, run, plot)


def _alone(p: Prepared, series: Series | None, reactive: bool, released: bool | None) -> Around:
    """One replay's reactive and actual runs without a sweep (`around_many`)."""
    actual = None
    if series is not None:
        actual = actual_run(p.config, series, p.arrivals, p.start, p.seconds, p.seed, p.scored_from)
    run = reactive_run(p) if reactive else None
    return Around(None, _released(p, run, released), actual)


def _found_by(
    found: dict[int, Around],
    prepared: Sequence[Prepared],
    g: Sequence[int],
    extra: Sequence[Extra],
    released: bool | None,
) -> Callable[[int, SweepResult, int], None]:
    """What `around_many` does with each extra run of a group (`g`: the replays' indices,
    `prepared` theirs) as soon as the sweep's group holding it ends: its reactive run
    (released when asked) or its actual figures, into `found`; its record let go."""

    def done(j: int, r: SweepResult, n: int) -> None:
        e = extra[j]
        p = prepared[e.replay]
        ran = _ran(p, r, n)
        if e.replicas is None:
            run = RunResult("reactive", ran, [], ForecastTrack(), 0)
            found[g[e.replay]].reactive = _released(p, run, released)
        else:
            found[g[e.replay]].actual = actual_figures(ran, p.scored_from)

    return done


def around_many(
    prepared: Sequence[Prepared],
    replicas: Sequence[Series | None] | None = None,
    baselines: bool = True,
    reactive: bool = True,
    budget: int = MANY_BYTES,
    released: bool | None = None,
) -> list[Around]:
    """For each replay: the baselines' curves (`simulate.baseline_curves`) when
    `baselines`, the reactive HPA's run (`simulate.reactive_run`) when `reactive`, and
    the figures of its `replicas` that ran (`actual_run`) when given; those of
    replays that share a model in one sweep, in groups within `budget` bytes (each
    replay's reactive and actual runs beside its baselines', each one's figures taken,
    and its record let go, as soon as its group ends: `_found_by`). A lone
    replay without baselines runs alone (`reactive_run`, `actual_run`): a sweep of one or
    two runs costs more than the runs (bench: 1.1 against 0.9 CPU-s a reactive day).
    With `released` (True: with the plot's series, False: without) each reactive run is
    `simulate.release`d as soon as it is found; None keeps its whole record."""
    given = list(replicas) if replicas is not None else [None] * len(prepared)
    if len(prepared) == 1 and not baselines:  # a sweep of one or two runs costs more
        return [_alone(prepared[0], given[0], reactive, released)]
    templates = _templates(prepared)
    out: dict[int, Around] = {}
    for g in _groups(prepared, templates):
        p = prepared[g[0]]
        extra: list[Extra] = []
        for w, i in enumerate(g):
            target = templates[i].scaler.target_pct
            if reactive:
                extra.append(Extra(w, "hpa_util", target))
            series = given[i]
            if series is not None:
                ticks = control_ticks(p.start, p.seconds, p.config.control.interval)
                extra.append(Extra(w, "hpa_util", target, actual_counts(series, ticks)))
        replays = [(templates[i], prepared[i].scored_from) for i in g]
        names = None if baselines else ()
        found: dict[int, Around] = {i: Around(None, None, None) for i in g}
        done = _found_by(found, [prepared[i] for i in g], g, extra, released)
        curves, _, _ = swept_with(
            p.config, replays, p.seed, p.seconds, extra, done, names=names, budget=budget
        )
        for w, i in enumerate(g):
            found[i].curves = curves[w] if baselines else None
        out.update(found)
    return [out[i] for i in range(len(prepared))]


def swept_many(prepared: Sequence[Prepared]) -> list[Curves]:
    """The baselines' curves of each replay (`simulate.baseline_curves`), those of replays
    that share a model swept as one (`baselines.swept`): the same curves, fewer steps."""
    out = []
    for a in around_many(prepared, reactive=False):
        assert a.curves is not None
        out.append(a.curves)
    return out


def simulate(
    trace: Trace,
    hours: float | None,
    seed: int,
    config: Config,
    start_hours: float = 0.0,
    metrics: Sequence[ControllerMetrics] = (),
    baselines: bool = True,
) -> SimulationResult:
    """Replay `hours` of `trace` (all of it when None) from `start_hours` into it: the
    reactive HPA and the baselines in one sweep (`around.around_many`: the figures of
    `reactive_run` and `baseline_curves`, bit for bit)."""
    p = prepare(trace, hours, seed, config, start_hours)
    run = gpuscaler_run(p, metrics)
    [around] = around_many([p], baselines=baselines, budget=SWEEP_BYTES)
    return finish(p, run, baselines, around.reactive, around.curves)
