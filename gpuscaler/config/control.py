"""The deciders' config sections: control loop, metrics, forecast, fragments, time slice
and replica floors."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpuscaler.config.base import Seconds, StrictModel, format_duration


class ControlConfig(StrictModel):
    interval: Seconds = Field(30.0, gt=0, le=3600)
    """How often the controller ticks: 30 s is twice the HPA sync period, well below the
    horizon (at most hourly: slower cannot act ahead of load)."""
    dry_run: bool = False
    """Plan and report, never write to the cluster."""


class MetricsConfig(StrictModel):
    step: Seconds = Field(0.5, gt=0)
    """Sample spacing of the GPU series: 500 ms, dcgm-exporter's fastest useful rate."""
    window: Seconds = Field(3600.0, gt=0)
    """History the forecaster sees: 1 h holds several load swings at 500 ms (7,200 points)."""
    staleness: Seconds = Field(120.0, gt=0)
    """Newest sample older than this: the target is skipped (four missed ticks)."""


class ForecastConfig(StrictModel):
    horizon: Seconds = Field(300.0, gt=0)
    """How far ahead to forecast: 5 min covers a replica cold start plus KEDA polling."""
    order: tuple[NonNegativeInt, NonNegativeInt, NonNegativeInt] = (5, 1, 0)
    """ARIMA (p, d, q). The fast engine covers q = 0 and d in {0, 1}."""
    fit_step: Seconds = Field(10.0, gt=0)
    """The samples are bucketed into means of this width before fitting: at 5 min ahead,
    10 s keeps the model's p lags meaningful."""
    interval_level: float = Field(0.7, ge=0.5, lt=1.0)
    """Two-sided prediction interval level; its upper bound (the 85th percentile at 0.7)
    sets replica floors: a higher level buys less under-provisioning for more GPU-hours."""
    ensemble: bool = True
    """The ensemble of ARIMA, exponential smoothing and the window mean, weighted by recent
    error on the series' own history, instead of ARIMA alone."""
    engine: Literal["fast", "statsmodels"] = "fast"
    """fast: batched least-squares ARIMA(p,d,0); statsmodels: the reference, far slower."""
    min_history: Seconds = Field(600.0, gt=0)
    """Fewer observed seconds than this in the window: no forecast, no action."""
    refit_every: Seconds = Field(300.0, gt=0)
    """Refit model parameters this often; between refits only the state is updated."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        p, d, q = self.order
        if d > 1:
            raise ValueError(f"order {self.order}: d > 1 is not supported (use 0 or 1)")
        if q > 0 and self.engine == "fast":
            raise ValueError(
                f"order {self.order}: the fast engine fits ARIMA(p,d,0) only, "
                "set q to 0 or engine to 'statsmodels'"
            )
        if self.horizon < self.fit_step:
            raise ValueError("horizon must be at least one fit_step")
        if self.min_history < self.fit_step * (p + d + 2):
            raise ValueError(
                f"min_history {format_duration(self.min_history)} holds fewer than "
                f"p + d + 2 = {p + d + 2} buckets of {format_duration(self.fit_step)}"
            )
        return self


class FragmentsConfig(StrictModel):
    fewer_above_pct: float = Field(85.0, gt=0, le=100)
    """Forecast GPU utilization above this: halve fragments, each task gets more GPU."""
    more_below_pct: float = Field(40.0, ge=0, lt=100)
    """Forecast upper bound below this: double fragments, more concurrency."""
    allowed: tuple[PositiveInt, ...] = Field((1, 2, 4, 8), min_length=1)
    """Fragment counts a node pool may use; each names a device-plugin config ts-<n>."""
    min_fragment_memory_gib: dict[Literal["training", "inference"], PositiveFloat] = Field(
        default_factory=lambda: {"training": 8.0, "inference": 4.0}  # type: ignore[arg-type]
    )
    """Memory floor per fragment: training holds optimizer state, inference the weights
    and KV cache of a small model."""
    memory_reserve_ratio: float = Field(0.10, ge=0, lt=1)
    """Kept free on every GPU against OOM from a tenant's burst (10 %)."""
    max_memory_overcommit: float = Field(1.5, ge=1.0, le=4.0)
    """Fragment memory may exceed usable memory this much: tenants rarely peak together."""
    max_compute_commit: float = Field(1.0, gt=0, le=1.0)
    """Projected compute demand per GPU after a change, as a share: never over 1.0."""
    sustain: Seconds = Field(60.0, ge=0)
    """A trigger must hold this long before acting, so a hovering value does not flap."""
    reversal_margin_pct: float = Field(5.0, ge=0)
    """A change against the previous one must pass its threshold by this much."""
    cooldown: Seconds = Field(600.0, ge=0)
    """Between fragment changes of one pool: each restarts the pool's device plugins."""
    max_step: int = Field(1, ge=1, le=3)
    """Halvings or doublings per change."""

    @field_validator("allowed")
    @classmethod
    def _allowed(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if list(value) != sorted(set(value)):
            raise ValueError("allowed must be strictly increasing without repeats")
        return value

    @field_validator("more_below_pct")
    @classmethod
    def _below_fewer(cls, value: float, info: ValidationInfo) -> float:
        fewer = info.data.get("fewer_above_pct")
        if fewer is None:
            return value
        if value >= fewer:
            raise ValueError(
                f"more_below_pct ({value:g}) must be below fewer_above_pct ({fewer:g}), "
                "or fragments would flap"
            )
        if value * 2 > fewer + 1e-9:
            raise ValueError(
                f"more_below_pct ({value:g}) must be at most half of fewer_above_pct "
                f"({fewer:g}): doubling fragments can double per-GPU demand"
            )
        return value


TimeSliceLevel = Literal["default", "short", "medium", "long"]
TIME_SLICE_LEVELS: tuple[TimeSliceLevel, ...] = ("default", "short", "medium", "long")


class TimeSliceConfig(StrictModel):
    stall_above_pct: float = Field(15.0, gt=0, lt=100)
    """Mean stall over `stall_window` above this: scheduling is wrong, lengthen the slice."""
    stall_window: Seconds = Field(300.0, gt=0)
    """Window of the stall mean (5 min, as in the alert rule)."""
    recover_below_pct: float = Field(7.5, ge=0)
    """Mean stall below this for `stabilization`: step back toward the base level."""
    compute_bound_level: TimeSliceLevel = "medium"
    """Base level for compute-bound pools: a longer slice."""
    io_bound_level: TimeSliceLevel = "short"
    """Base level for IO-bound pools: a shorter slice."""
    cooldown: Seconds = Field(600.0, ge=0)
    """Between changes of one pool: a change needs the stall window to refill."""
    stabilization: Seconds = Field(900.0, ge=0)
    """Stall must stay low this long before the slice steps back down."""
    max_step: int = Field(1, ge=1, le=3)
    """Levels per change."""

    @field_validator("recover_below_pct")
    @classmethod
    def _below_stall(cls, value: float, info: ValidationInfo) -> float:
        stall = info.data.get("stall_above_pct")
        if stall is not None and value >= stall:
            raise ValueError(
                f"recover_below_pct ({value:g}) must be below stall_above_pct ({stall:g})"
            )
        return value


class ReplicasConfig(StrictModel):
    target_utilization_pct: float = Field(70.0, gt=0, le=100)
    """Per-replica GPU utilization the floor aims at; headroom for bursts inside a tick."""
    tolerance: float = Field(0.1, ge=0, lt=1)
    """Ratio within 1 +- this changes nothing (the HPA's own default)."""
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(50, ge=1)
    scale_down_stabilization: Seconds = Field(300.0, ge=0)
    """The floor drops only to the highest recommendation of this window (HPA's 300 s)."""
    max_step_up_gpus: float = Field(4.0, gt=0)
    """GPUs' worth of replicas the floor adds per change at most, or its own size when
    larger (the HPA's default: double, or add 4 pods)."""
    scale_down_margin: float = Field(0.05, ge=0, lt=1)
    """The floor steps down only to a count whose capacity holds the window's highest
    demand this far below it, so a demand at a replica's boundary does not flip the floor
    every window. 0: down as soon as the demand fits, as the HPA does."""
    whole_gpus: bool = True
    """The floor changes in whole GPUs: replicas of a GPU share fill the last GPU they hold
    (its empty slots cost nothing), and a step down that frees no GPU is not taken."""
    max_step_down_gpus: float | None = Field(None, gt=0)
    """GPUs' worth of replicas the floor removes per change at most; null: no limit beyond
    the stabilization window, like the HPA's default."""
    cooldown: Seconds = Field(30.0, ge=0)
    """Minimum time between floor changes of one workload (one KEDA polling interval)."""
    lead_time: Seconds = Field(120.0, gt=0)
    """The floor covers the forecast's upper bound this far ahead: the time a replica added
    now needs to serve (KEDA polling + cold start)."""
    skill_check: bool = True
    """Score the forecast against reactive sizing and fall back when it has no skill
    (false: the forecast's upper bound always counts with the observed demand)."""
    skill_window: Seconds = Field(3600.0, gt=0)
    """Forecast origins of this long are scored for the skill self-assessment."""
    reserve_window: Seconds = Field(7200.0, ge=0)
    """A burst that outran reactive sizing at full use keeps a reserve this long (0: none):
    random bursts are often more than an hour apart."""
    skill_min_origins: int = Field(20, ge=1)
    """Fewer scored origins than this: no verdict yet, the floor stays reactive."""
    skill_fallback_below: float = Field(0.1, ge=-1, le=1)
    """Skill below this: the floor sizes for the observed demand alone. Skill is the share
    of reactive sizing's shortfall the forecast avoided beyond flat headroom or a level
    floor at the same cost (`assess` in gpuscaler.core.replicas)."""
    skill_return_above: float = Field(0.2, ge=-1, le=1)
    """Skill back above this: the forecast sets the floor again (hysteresis; white noise
    scores up to about 0.12)."""

    @field_validator("skill_return_above")
    @classmethod
    def _return_above_fallback(cls, value: float, info: ValidationInfo) -> float:
        below = info.data.get("skill_fallback_below")
        if below is not None and value < below:
            raise ValueError(
                f"skill_return_above ({value:g}) must not be below skill_fallback_below "
                f"({below:g}), or the floor would flap"
            )
        return value

    @field_validator("max_replicas")
    @classmethod
    def _above_min(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("min_replicas")
        if low is not None and value < low:
            raise ValueError(f"max_replicas ({value}) must not be below min_replicas ({low})")
        return value
