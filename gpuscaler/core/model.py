"""Frozen data the core reads and writes: observations in, a plan out.

Times are float unix seconds. Utilization is in percent. A workload's `load` is the GPU
utilization summed over its GPUs, in percent of one GPU (250 means 2.5 GPUs' worth of busy
time); divided by a replica's GPU share it is the sum of replica utilization the HPA
formula divides by the target.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from gpuscaler.core.preemption.views import PreemptionObservation
from gpuscaler.core.decisions import Decision, Skip, target_key
from gpuscaler.core.lazy import Lazy

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

    def last_sample_time(self) -> float | None:
        finite = np.flatnonzero(np.isfinite(self.values))
        return None if finite.size == 0 else self.start + self.step * float(finite[-1])


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
    """Recent in-window MAE over the horizon per candidate (ensemble, arima, ses,
    window_mean, last_value): the forecaster's self-assessment."""
    peak_error: float = 0.0
    """Median of the recent errors of the path's maximum against the actual maximum over
    the horizon: an averaged path is flatter than the load, so its maximum runs low."""

    @property
    def peak(self) -> float:
        """Forecast maximum over the horizon: the path's highest point plus the median of
        its recent peak errors."""
        return float(np.max(self.mean)) + self.peak_error

    @property
    def peak_upper(self) -> float:
        """Highest point of the interval's upper bound over the horizon."""
        return float(np.max(self.upper))

    def peak_upper_within(self, seconds: float) -> float:
        """Highest point of the upper bound over the first `seconds` of the horizon."""
        steps = max(1, min(len(self.upper), round(seconds / self.step)))
        return float(np.max(self.upper[:steps]))

    def is_finite(self) -> bool:
        """Every point of the path and its interval finite: as found for the whole batch
        that made the forecast when it did (`mark_finite`), else checked now."""
        known = known_finite(self)
        if known is not None:
            return known
        return bool(
            np.isfinite(self.mean).all()
            and np.isfinite(self.lower).all()
            and np.isfinite(self.upper).all()
        )


FINITE_MARK = "_finite"
"""Where a forecast keeps whether it is finite, found for its batch (`mark_finite`)."""


def known_finite(forecast: Forecast) -> bool | None:
    """Whether `forecast` is finite as its batch found it (`mark_finite`), else None."""
    known: bool | None = forecast.__dict__.get(FINITE_MARK)
    return known


def mark_finite(forecasts: Sequence[Forecast], finite: Sequence[bool]) -> None:
    """Keep on each forecast whether it is finite (`Forecast.is_finite`), found for a
    batch's rows at once (issue 20: the planner and the simulator ask every forecast every
    tick, three numpy reductions each). Its arrays must be read-only: what was found stays
    true. A forecast made anew (`dataclasses.replace`) checks again."""
    for forecast, ok in zip(forecasts, finite, strict=True):
        assert not (
            forecast.mean.flags.writeable
            or forecast.lower.flags.writeable
            or forecast.upper.flags.writeable
        )
        object.__setattr__(forecast, FINITE_MARK, bool(ok))


Forecast.reason = Lazy("reason")  # type: ignore[assignment]


@dataclass(frozen=True)
class FitState:
    """One series' fitted forecast coefficients and when they were fitted: kept between
    ticks so parameters are refitted only every forecast.refit_every."""

    fitted_at: float
    intercept: float
    phi: tuple[float, ...]
    sigma2: float
    interval: IntervalState | None = None
    """The adaptive interval correction carried across ticks (None: not started)."""
    scored: Scored | None = field(default=None, compare=False)
    """What the ensemble's scoring found at the refit, kept until the next one (None: not
    scored yet): a steady tick does not rescore the members."""
    modulus: float | None = field(default=None, compare=False)
    """The largest inverse root modulus of `phi` (`engines.inverse_root_modulus`), found at
    the refit (None: not known, found when needed): only a refit changes it."""


@dataclass(frozen=True, eq=False)
class Scored:
    """One series' ensemble scoring, made when its coefficients are refitted and reused
    until the next refit (only the members' live paths and the adaptive level move)."""

    method: str | None
    """"ensemble" or "last_value"; None: too little recent evidence (the engine's path)."""
    weights: tuple[float, ...]
    """Per ensemble member: inverse corrected recent squared error (not normalized)."""
    errors: Mapping[str, float]
    """Recent MAE per member and candidate (the forecast's `errors`)."""
    ses_best: int
    """Index of the best-fit smoothing constant."""
    ses_inv: FloatArray
    """Inverse recent squared error of each smoothing constant (averaged smoothing)."""
    abs_errors: FloatArray
    """The chosen method's recent absolute errors (origins, steps), sorted per step (NaN
    last): its conformal interval at any level."""
    peak: float
    """The chosen method's peak offset."""
    abs_recent: FloatArray
    """The same errors in origin order, oldest first: origins completed between refits
    are appended (and the oldest dropped), so the interval and peak follow the load."""
    peak_recent: FloatArray
    """The chosen method's peak errors (origins,), oldest first."""
    newest: float
    """Time of the newest origin scored."""


def _set(obj: object, **values: object) -> None:
    """Set attributes of an object whose own `__setattr__` refuses (made once, then read)."""
    for name, value in values.items():
        object.__setattr__(obj, name, value)


class IssuedInterval:
    """An interval issued at `origin`: bounds of the buckets ending `step`, 2 `step`, ...
    later, kept until every one is observed. Immutable, compared and hashed by
    (origin, step, lower, upper) as a frozen dataclass of them would be.

    Made by a batch (`in_rows`), its bounds stay a row of the batch's (n, 2, steps) array
    until `lower` or `upper` is read (issue 20: two tuples of floats a series and tick were
    most of issuing; the batched checks read the arrays, `IntervalState.bounds`)."""

    __slots__ = ("_lower", "_row", "_rows", "_upper", "origin", "step")
    origin: float
    step: float
    _lower: tuple[float, ...] | None
    _upper: tuple[float, ...] | None
    _rows: FloatArray | None
    _row: int

    def __init__(
        self, origin: float, step: float, lower: tuple[float, ...], upper: tuple[float, ...]
    ) -> None:
        _set(self, origin=origin, step=step, _lower=lower, _upper=upper, _rows=None, _row=0)

    @classmethod
    def in_rows(cls, origin: float, step: float, rows: FloatArray, row: int) -> IssuedInterval:
        """The interval whose lower and upper bounds are `rows[row, 0]` and `rows[row, 1]`
        (`rows`: (n, 2, steps), read-only)."""
        return cls.many(origin, step, rows, [row])[0]

    @classmethod
    def many(
        cls, origin: float, step: float, rows: FloatArray, idx: Sequence[int]
    ) -> list[IssuedInterval]:
        """`in_rows` of each row in `idx` (issue 20: one a series and tick, so made
        without a keyword call a field)."""
        new, put = cls.__new__, object.__setattr__
        out = []
        for row in idx:
            made = new(cls)
            put(made, "origin", origin)
            put(made, "step", step)
            put(made, "_lower", None)
            put(made, "_upper", None)
            put(made, "_rows", rows)
            put(made, "_row", row)
            out.append(made)
        return out

    def _made(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        if self._lower is None or self._upper is None:
            assert self._rows is not None
            lower, upper = self._rows[self._row].tolist()
            _set(self, _lower=tuple(lower), _upper=tuple(upper), _rows=None)
        assert self._lower is not None and self._upper is not None
        return self._lower, self._upper

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"IssuedInterval is immutable: cannot set {name}")

    @property
    def lower(self) -> tuple[float, ...]:
        return self._made()[0]

    @property
    def upper(self) -> tuple[float, ...]:
        return self._made()[1]

    def _key(self) -> tuple[float, float, tuple[float, ...], tuple[float, ...]]:
        return (self.origin, self.step, *self._made())

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, IssuedInterval)
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        lower, upper = self._made()
        return (
            f"IssuedInterval(origin={self.origin!r}, step={self.step!r}, "
            f"lower={lower!r}, upper={upper!r})"
        )


@dataclass(frozen=True)
class IntervalState:
    """Adaptive conformal inference state of one series (Gibbs & Candes 2021): the level
    the conformal quantile is taken at, moved after every tick by how often the intervals
    issued earlier missed the points observed since."""

    level: float
    checked_at: float
    pending: tuple[IssuedInterval, ...] = ()
    points: int = 0
    misses: int = 0
    layout: tuple[tuple[float, float, int], ...] | None = field(
        default=None, compare=False, repr=False
    )
    """(origin, step, size) of each pending interval when made by the batched check and
    issue (`intervals.resolve_rows`, `issue_rows`; one object for the series of a batch
    that share it); None: read from `pending`."""
    bounds: FloatArray | None = field(default=None, compare=False, repr=False)
    """The pending intervals' lower and upper bounds in order, a read-only (2, total)
    array made with `layout` (issue 18: a batch's check reads these, not the tuples).
    With both, `pending` may be left to be made from them when read (`Lazy`,
    `pending_of`): the batched check and issue read only these two."""


def pending_of(
    layout: tuple[tuple[float, float, int], ...], bounds: FloatArray
) -> tuple[IssuedInterval, ...]:
    """The pending intervals `layout` and `bounds` describe, in order: each interval's
    bounds are its columns of `bounds` (the floats it was issued with)."""
    made, at = [], 0
    for origin, step, size in layout:
        made += IssuedInterval.many(origin, step, bounds[None, :, at : at + size], [0])
        at += size
    return tuple(made)


IntervalState.pending = Lazy("pending")  # type: ignore[assignment]


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
    """Memory in use on the pool's fullest GPU (frame buffer), when measured."""
    gpus_held: int | None = None
    """GPUs held by pods of the pool now; with one, more fragments pack nothing."""


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
    """Highest `forecast.fit_step` bucket mean of the load since the previous tick (one
    control interval); None when unknown. What the floor sizes for when reactive."""


@dataclass(frozen=True)
class Snapshot:
    """Everything one tick observed, with forecasts attached."""

    time: float
    pools: tuple[PoolObservation, ...] = ()
    workloads: tuple[WorkloadObservation, ...] = ()
    fits: Mapping[str, FitState] = field(default_factory=lambda: MappingProxyType({}))
    """Forecast model state per series key, for the next tick."""
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
    seen: FloatArray = field(default_factory=lambda: np.zeros((0, 4)), compare=False, repr=False)
    """The replica floor's tick records, oldest first, a read-only (records, 4) array of
    (time, observed demand, forecast upper bound and mean peak over the lead time; both
    NaN without a forecast): what the forecast's skill and the burst reserve are judged
    on. Not compared: an array has no single truth value."""
    fallback: bool = False
    """The forecast has had no skill lately: the floor has stepped back to reactive."""


EMPTY_TARGET = TargetHistory()


@dataclass(frozen=True)
class History:
    targets: Mapping[str, TargetHistory] = field(default_factory=lambda: MappingProxyType({}))

    def get(self, key: str) -> TargetHistory:
        return self.targets.get(key, EMPTY_TARGET)

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
