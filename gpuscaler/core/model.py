"""Frozen data the core reads and writes: observations in, a plan out. Times are unix
seconds, utilization percent; a workload's `load` is its GPUs' utilization summed, in
percent of one GPU (250: 2.5 GPUs' worth of busy time)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from gpuscaler.core.preemption.views import PreemptionObservation
from gpuscaler.core.decisions import Decision, Skip, target_key

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class Series:
    """Samples of one signal on a regular grid; NaN marks a gap."""

    start: float
    step: float
    values: FloatArray

    @property
    def end(self) -> float:
        """Time of the last slot of the grid."""
        return self.start + self.step * (len(self.values) - 1)


@dataclass(frozen=True, eq=False)
class Forecast:
    """A forecast path on a grid of `step` seconds after `origin`, with its interval."""

    origin: float
    step: float
    mean: FloatArray
    lower: FloatArray
    upper: FloatArray
    level: float
    method: str
    reason: str
    last_value: float
    errors: Mapping[str, float] = field(default_factory=dict)
    """Recent in-window MAE over the horizon per candidate: the self-assessment."""
    peak_error: float = 0.0
    """Median recent error of the path's maximum against the actual one: an averaged path
    is flatter than the load, so its maximum runs low."""

    @property
    def peak(self) -> float:
        """Forecast maximum over the horizon, corrected by `peak_error`."""
        return float(np.max(self.mean)) + self.peak_error

    @property
    def peak_upper(self) -> float:
        return float(np.max(self.upper))

    def peak_upper_within(self, seconds: float) -> float:
        """Highest upper bound over the first `seconds` of the horizon."""
        steps = max(1, min(len(self.upper), round(seconds / self.step)))
        return float(np.max(self.upper[:steps]))

    def is_finite(self) -> bool:
        return bool(np.isfinite([self.mean, self.lower, self.upper]).all())


@dataclass(frozen=True)
class Signal:
    """What the core knows of one forecast input: its forecast, or why there is none."""

    last_sample_time: float | None
    forecast: Forecast | None
    problem: str | None = None
    """Set by an adapter or the forecaster when the input cannot be trusted."""


@dataclass(frozen=True)
class PoolObservation:
    name: str
    utilization: Signal
    """Mean GPU utilization of the pool's GPUs (percent)."""
    fragments: int | None
    """Fragments per GPU the pool runs now; None when unknown."""
    time_slice_level: str | None
    stall_mean_pct: float | None
    """Mean stall over the configured stall window; None when unknown."""
    stall_last_sample_time: float | None = None
    gpu_memory_gib: float | None = None
    """Overrides the config's value when the cluster reports it (nvidia.com/gpu.memory)."""
    max_shares_held: int = 0
    """Most GPU shares held by pods on any one GPU of the pool."""
    memory_used_gib: float | None = None
    """Frame buffer in use on the pool's fullest GPU."""
    gpus_held: int | None = None


@dataclass(frozen=True)
class WorkloadObservation:
    key: str
    load: Signal
    """GPU utilization summed over the workload's GPUs, percent of one GPU; or, with
    `serving`, the serving stack's demand in its unit."""
    floor: int | None
    """The replica floor set now (minReplicaCount / minReplicas); None when unknown."""
    replicas: int | None
    max_replicas: int | None = None
    """The object's own ceiling (maxReplicaCount / maxReplicas)."""
    replica_gpu_share: float = 1.0
    """GPU one replica can use: 1 for a whole GPU, about 1/n on a GPU shared n ways."""
    serving: tuple[float, str] | None = None
    """When `load` is the serving stack's demand (gpuscaler.demand), not GPU utilization:
    what one replica serves at target, and the unit."""
    recent_peak: float | None = None
    """Highest `forecast.fit_step` bucket mean of the load since the previous tick; None
    when unknown. What the floor sizes for when reactive."""


_NO_RECORDS = np.zeros((0, 4))
_NO_RECORDS.flags.writeable = False  # read-only like every kept one


@dataclass(frozen=True)
class Snapshot:
    """Everything one tick observed, with forecasts attached."""

    time: float
    pools: tuple[PoolObservation, ...] = ()
    workloads: tuple[WorkloadObservation, ...] = ()
    preemption: PreemptionObservation | None = None
    """Pods, nodes and preemptions under way, when the source reads a cluster."""


@dataclass(frozen=True, slots=True)
class TargetHistory:
    """What the policy remembers of one target between ticks."""

    last_change_at: float | None = None
    last_direction: int = 0
    pending_since: float | None = None
    """Since when the current trigger has held."""
    pending_direction: int = 0
    recommendations: tuple[tuple[float, int], ...] = ()
    """(time, recommended value) within the stabilization window; for replica floors the
    load sized for, in percent of one GPU (independent of the replicas' GPU share)."""
    calm_since: float | None = None
    """Since when the signal has stayed on the calm side (time slice recovery)."""
    seen: FloatArray = field(default_factory=lambda: _NO_RECORDS, compare=False, repr=False)
    """The replica floor's tick records, oldest first, read-only (records, 4): time,
    observed demand, forecast upper bound and mean peak over the lead time (NaN without a
    forecast). What skill and the burst reserve are judged on."""
    fallback: bool = False
    """The forecast has had no skill lately: the floor has stepped back to reactive."""


_EMPTY_TARGET = TargetHistory()


@dataclass(frozen=True)
class History:
    targets: Mapping[str, TargetHistory] = field(default_factory=lambda: MappingProxyType({}))

    def get(self, key: str) -> TargetHistory:
        return self.targets.get(key, _EMPTY_TARGET)

    def updated(self, changes: Mapping[str, TargetHistory]) -> History:
        merged = dict(self.targets)
        merged.update(changes)
        return History(MappingProxyType(merged))


@dataclass(frozen=True)
class Plan:
    time: float
    decisions: tuple[Decision, ...]
    skips: tuple[Skip, ...]
    history: History
    """History after this tick's observations, before any change is recorded."""


def record_applied(history: History, applied: tuple[Decision, ...]) -> History:
    """History after `applied` decisions really took effect: cooldowns start now."""
    changes = {}
    for d in applied:
        key = target_key(d.kind, d.target)
        changes[key] = replace(
            history.get(key),
            last_change_at=d.time,
            last_direction=d.direction,
            pending_since=None,
            pending_direction=0,
        )
    return history.updated(changes)
