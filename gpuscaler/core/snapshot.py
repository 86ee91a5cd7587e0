"""From raw observations (series and cluster state) to the snapshot the planner reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuscaler.config import Config, ForecastConfig
from gpuscaler.core.forecast import EMPTY, Clip, ForecastState, forecast, lead, merged, reissued
from gpuscaler.core.forecast.members import bucket_means, sampled
from gpuscaler.core.model import PoolObservation, Series, Signal, Snapshot, WorkloadObservation
from gpuscaler.core.preemption import PreemptionObservation

POOL_CLIP: tuple[float, float | None] = (0.0, 100.0)
"""A pool's utilization forecast stays within 0-100 %."""
LOAD_CLIP: tuple[float, float | None] = (0.0, None)
"""A workload's load forecast is never negative."""


@dataclass(frozen=True)
class RawPool:
    name: str
    utilization: Series | None
    stall: Series | None
    fragments: int | None
    time_slice_level: str | None
    gpu_memory_gib: float | None = None
    max_shares_held: int = 0
    problem: str | None = None
    """Set by the adapter when the source failed for this pool."""
    memory_used_gib: float | None = None
    gpus_held: int | None = None


@dataclass(frozen=True)
class RawWorkload:
    key: str
    load: Series | None
    floor: int | None
    replicas: int | None
    max_replicas: int | None = None
    replica_gpu_share: float = 1.0
    problem: str | None = None
    serving: tuple[float, str] | None = None
    """Per-replica target and unit when `load` is serving demand (gpuscaler.demand)."""
    demand: Series | None = None
    """The leading signal (workloads[].leading_query); None: none named."""
    demand_problem: str | None = None


@dataclass(frozen=True)
class Observations:
    time: float
    pools: tuple[RawPool, ...] = ()
    workloads: tuple[RawWorkload, ...] = ()
    preemption: PreemptionObservation | None = None


def window_means(
    series: Sequence[Series | None], now: float, window: float
) -> list[tuple[float | None, float | None]]:
    """Per series, the mean of its finite samples in (now - window, now] and its newest
    sample's time; the series of one grid as rows of one array."""
    out: list[tuple[float | None, float | None]] = [(None, None)] * len(series)
    for (start, spacing, _), idx in _grids(series).items():
        stacked = np.stack([s.values for i in idx if (s := series[i]) is not None])
        finite = np.isfinite(stacked)
        newest = stacked.shape[1] - 1 - np.argmax(finite[:, ::-1], axis=1)
        lasts = np.where(finite.any(axis=1), start + spacing * newest, np.nan)
        first = max(0, int(np.ceil((now - window - start) / spacing + 1e-9)))
        kept = finite[:, first:]
        count = kept.sum(axis=1)
        total = np.where(kept, stacked[:, first:], 0.0).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(count > 0, total / count, np.nan)
        for i, mean, last in zip(idx, means.tolist(), lasts.tolist(), strict=True):
            out[i] = (_number(mean), _number(last))
    return out


def bucket_peaks(
    series: Sequence[Series | None], now: float, window: float, step: float
) -> list[float | None]:
    """Per series, the highest mean of `step`-long buckets (ending at the newest sample)
    over the last `window` seconds (None without a finite sample there). The sample at
    `now - window` counts: the newest slot is usually still filling, and without it the
    oldest bucket of each window would be seen by no tick."""
    out: list[float | None] = [None] * len(series)
    for (start, spacing, size), idx in _grids(series).items():
        width = max(1, round(step / spacing))
        first = int(np.ceil((now - window - start) / spacing - 1e-9))
        cut = max(0, first, size - max(1, round(window / step)) * width)
        usable = max(0, size - cut) // width * width
        if usable == 0:
            continue
        rows = np.stack([s.values[size - usable :] for i in idx if (s := series[i]) is not None])
        end = start + spacing * (size - 1)
        means = bucket_means(rows, spacing, end, step, end)
        best = np.where(np.isnan(means), -np.inf, means).max(axis=1)
        for i, peak in zip(idx, best.tolist(), strict=True):
            out[i] = _number(peak)
    return out


def _number(x: float) -> float | None:
    """`x`, or None where it is not finite (nothing to take a mean or a peak of)."""
    return x if np.isfinite(x) else None


def _grids(series: Sequence[Series | None]) -> dict[tuple[float, float, int], list[int]]:
    """The series with samples grouped by their grid (start, step, size)."""
    grids: dict[tuple[float, float, int], list[int]] = {}
    for i, s in enumerate(series):
        if s is not None and s.values.size:
            grids.setdefault((s.start, s.step, s.values.size), []).append(i)
    return grids


def _forecasts(
    items: list[tuple[str, Series | None, str | None, ForecastConfig]],
    now: float,
    clips: Sequence[Clip],
    prior: ForecastState,
) -> tuple[list[Signal], ForecastState]:
    """Forecast every series (each clipped to its `clips`), the series that share a
    forecast section in one batch; and their new state."""
    out: list[Signal | None] = [None] * len(items)
    groups: dict[ForecastConfig, list[int]] = {}
    for i, (_, series, problem, cfg) in enumerate(items):
        if problem is None:
            groups.setdefault(cfg, []).append(i)
        else:
            out[i] = Signal(sampled([series])[0][0], None, problem)
    states = []
    for cfg, idx in groups.items():
        batch, keys = [items[i][1] for i in idx], [items[i][0] for i in idx]
        signals, state = forecast(batch, cfg, now, prior, keys=keys, clips=[clips[i] for i in idx])
        states.append(state)
        for i, signal in zip(idx, signals, strict=True):
            out[i] = signal
    return [s for s in out if s is not None], merged(*states)


def build_snapshot(
    raw: Observations, config: Config, now: float, prior: ForecastState = EMPTY
) -> tuple[Snapshot, ForecastState]:
    """Forecasts attached to what was observed, and the forecasting state for the next
    tick (`prior`: the previous tick's)."""
    pool_cfg = config.pool_sections("forecast", ForecastConfig)
    load_cfg = config.workload_sections("forecast", ForecastConfig)
    pool_items = [(f"pool:{p.name}", p.utilization, p.problem, pool_cfg[p.name]) for p in raw.pools]
    load_items = [(f"workload:{w.key}", w.load, w.problem, load_cfg[w.key]) for w in raw.workloads]
    clips = [POOL_CLIP] * len(pool_items) + [LOAD_CLIP] * len(load_items)
    both, state = _forecasts(pool_items + load_items, now, clips, prior)
    pool_signals, load_signals = both[: len(pool_items)], both[len(pool_items) :]
    for i, (signal, w) in enumerate(zip(load_signals, raw.workloads, strict=True)):
        if w.load is None or (w.demand is None and w.demand_problem is None):
            continue
        key, cfg = load_items[i][0], load_items[i][3]
        rows = state.get(key)
        level = float(rows.adaptive.level[0]) if rows is not None else None
        load_signals[i], used = lead(signal, w.load, w.demand, cfg, now, level, w.demand_problem)
        f = load_signals[i].forecast
        if used and f is not None:
            state = reissued(state, key, now, f.lower, f.upper)
    stall_window = config.time_slice.stall_window
    stalls = window_means([p.stall for p in raw.pools], now, stall_window)
    pools = [
        _pool(p, signal, *stall)
        for p, signal, stall in zip(raw.pools, pool_signals, stalls, strict=True)
    ]
    # Each workload's highest `fit_step` bucket mean over the last tick (None with a
    # problem), the workloads of one fit step together.
    peaks: list[float | None] = [None] * len(raw.workloads)
    steps: dict[float, list[int]] = {}
    for i, (w, item) in enumerate(zip(raw.workloads, load_items, strict=True)):
        if not w.problem:
            steps.setdefault(item[3].fit_step, []).append(i)
    for fit_step, idx in steps.items():
        loads = [raw.workloads[i].load for i in idx]
        found = bucket_peaks(loads, now, config.control.interval, fit_step)
        for i, peak in zip(idx, found, strict=True):
            peaks[i] = peak
    workloads = [
        _workload(w, signal, peak)
        for w, signal, peak in zip(raw.workloads, load_signals, peaks, strict=True)
    ]
    snapshot = Snapshot(
        time=now, pools=tuple(pools), workloads=tuple(workloads), preemption=raw.preemption
    )
    return snapshot, state


def _pool(
    p: RawPool, signal: Signal, stall: float | None, stall_last: float | None
) -> PoolObservation:
    return PoolObservation(
        name=p.name,
        utilization=signal,
        fragments=p.fragments,
        time_slice_level=p.time_slice_level,
        stall_mean_pct=None if p.problem else stall,
        stall_last_sample_time=stall_last,
        gpu_memory_gib=p.gpu_memory_gib,
        max_shares_held=p.max_shares_held,
        memory_used_gib=p.memory_used_gib,
        gpus_held=p.gpus_held,
    )


def _workload(w: RawWorkload, signal: Signal, peak: float | None) -> WorkloadObservation:
    return WorkloadObservation(
        key=w.key,
        load=signal,
        floor=w.floor,
        replicas=w.replicas,
        max_replicas=w.max_replicas,
        replica_gpu_share=w.replica_gpu_share,
        serving=w.serving,
        recent_peak=peak,
    )
