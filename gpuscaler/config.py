"""Typed, validated configuration loaded from YAML.

Every threshold lives here with its unit and its default. `load_config` returns a frozen
`Config` or raises `ConfigError` listing *every* problem with its YAML path; nothing
downstream ever sees a half-valid config.

Overrides: each node pool may override any field of `fragments`, `time_slice` and
`forecast`; each workload any field of `replicas` and `forecast`. An override is merged
over the global section and the merged section is validated as a whole, so a
contradiction an override creates (say `more_below_pct` above `fewer_above_pct`) is
reported at the override's path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self, TypeVar

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpuscaler.demand import DemandConfig, check_template
from gpuscaler.errors import InputError

# --------------------------------------------------------------------------- durations

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Parse "500ms", "30s", "5m", "1h", "1h30m" into seconds; raise ValueError otherwise."""
    if isinstance(text, bool) or not isinstance(text, str):
        raise ValueError(
            f"expected a duration string such as '500ms', '30s', '5m' or '1h', got {text!r}"
        )
    stripped = text.strip()
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(stripped):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(stripped) or not stripped:
        raise ValueError(
            f"bad duration {text!r}: expected a number with a unit ms, s, m, h or d "
            "(e.g. '500ms', '30s', '5m', '1h')"
        )
    if total > MAX_DURATION:
        raise ValueError(f"duration {text!r} is longer than a year: no gpuscaler setting is")
    return total


MAX_DURATION = 366 * 86400.0
"""Longer than any sensible window, cooldown or timeout: a typo such as '99999d'."""
MAX_CONFIG_BYTES = 1 << 20
"""A config file larger than this is refused before parsing (the shipped one is 10 KB)."""


def format_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


Seconds = Annotated[float, BeforeValidator(parse_duration)]
"""A duration written in YAML as "30s"; held as float seconds."""


_NUMBERS = (int, float, int | None, float | None)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML's `true` is not the number 1: pydantic's lax mode would take it as one."""
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and field.annotation in _NUMBERS:
            raise ValueError(f"expected a number, got {str(value).lower()}")
        return value


# --------------------------------------------------------------------------- sections


class ControlConfig(_Strict):
    interval: Seconds = Field(30.0, gt=0, le=3600)
    """How often the controller ticks (at most hourly: slower cannot act ahead of load).
    30 s: twice the HPA sync period, well below the 5 min horizon, and cheap with the
    batched forecaster."""
    dry_run: bool = False
    """Plan and report, never write to the cluster."""


class MetricsConfig(_Strict):
    step: Seconds = Field(0.5, gt=0)
    """Sample spacing of the GPU series: 500 ms, dcgm-exporter's fastest useful rate."""
    window: Seconds = Field(3600.0, gt=0)
    """History the forecaster sees: 1 h holds several load swings at 500 ms (7,200 points)."""
    staleness: Seconds = Field(120.0, gt=0)
    """Newest sample older than this means the target is skipped: 2 min is four missed
    control ticks, long past any scrape jitter."""


class ForecastConfig(_Strict):
    horizon: Seconds = Field(300.0, gt=0)
    """How far ahead to forecast: 5 min covers a replica cold start plus KEDA polling."""
    order: tuple[int, int, int] = (5, 1, 0)
    """ARIMA (p, d, q). The fast engine covers q = 0 and d in {0, 1}."""
    fit_step: Seconds = Field(10.0, gt=0)
    """Bucket the 500 ms samples into means of this width before fitting: at 5 min ahead,
    10 s buckets keep the model's memory (p lags) meaningful and cost 20x less."""
    interval_level: float = Field(0.7, ge=0.5, lt=1.0)
    """Two-sided prediction interval level; its upper bound (the 85th percentile at 0.7)
    sets replica floors. Measured by the simulator on six days of the bundled trace (with
    replicas.lead_time 2m): 0.6 leaves 37-54 % of the reactive HPA's under-provisioning
    for +4-7 % GPU-hours, 0.7 leaves 28-33 % for +5-9 %, 0.8 leaves 20-25 % for +6-11 %."""
    ensemble: bool = True
    """Forecast the ensemble of ARIMA, exponential smoothing (best-fit and averaged over its
    constants) and the 2-minute window mean, weighted by their recent error on the series'
    own history, instead of ARIMA alone (see the README's Forecasting section)."""
    engine: Literal["fast", "statsmodels"] = "fast"
    """fast: batched least-squares ARIMA(p,d,0) for all series at once; statsmodels: the
    reference ARIMA, 100x slower."""
    min_history: Seconds = Field(600.0, gt=0)
    """Fewer observed seconds than this in the window: no forecast, no action."""
    refit_every: Seconds = Field(300.0, gt=0)
    """Refit model parameters this often; between refits only the state is updated."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        p, d, q = self.order
        if p < 0 or d < 0 or q < 0:
            raise ValueError(f"order {self.order}: p, d, q must be >= 0")
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


class FragmentsConfig(_Strict):
    fewer_above_pct: float = Field(85.0, gt=0, le=100)
    """Forecast GPU utilization above this: halve fragments, each task gets more GPU."""
    more_below_pct: float = Field(40.0, ge=0, lt=100)
    """Forecast upper bound below this: double fragments, more concurrency."""
    allowed: tuple[int, ...] = (1, 2, 4, 8)
    """Fragment counts a node pool may use; each names a device-plugin config ts-<n>."""
    min_fragment_memory_gib: dict[Literal["training", "inference"], float] = Field(
        default_factory=lambda: {"training": 8.0, "inference": 4.0}  # type: ignore[arg-type]
    )
    """Memory floor per fragment: training holds optimizer state (8 GB), inference the
    weights and KV cache of a small model (4 GB)."""
    memory_reserve_ratio: float = Field(0.10, ge=0, lt=1)
    """Kept free on every GPU against OOM from a tenant's burst (10 %)."""
    max_memory_overcommit: float = Field(1.5, ge=1.0, le=4.0)
    """Sum of fragment memory may exceed usable memory by this factor: tenants rarely
    peak together (1.5x)."""
    max_compute_commit: float = Field(1.0, gt=0, le=1.0)
    """Projected compute demand per GPU after a change, as a share: never over 1.0."""
    sustain: Seconds = Field(60.0, ge=0)
    """A trigger must hold this long before acting, so a value hovering at a threshold
    does not flap."""
    reversal_margin_pct: float = Field(5.0, ge=0)
    """A change against the previous one must pass its threshold by this much."""
    cooldown: Seconds = Field(600.0, ge=0)
    """Minimum time between fragment changes of one pool: each change restarts the device
    plugin on every node of the pool."""
    max_step: int = Field(1, ge=1, le=3)
    """Halvings or doublings per change."""

    @field_validator("allowed")
    @classmethod
    def _allowed(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value:
            raise ValueError("allowed must list at least one fragment count")
        if any(v < 1 for v in value):
            raise ValueError("fragment counts must be >= 1")
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
            # Doubling fragments can double per-GPU demand: a "more" from above half the
            # "fewer" threshold would be undone by the next tick.
            raise ValueError(
                f"more_below_pct ({value:g}) must be at most half of fewer_above_pct "
                f"({fewer:g}): doubling fragments can double per-GPU demand"
            )
        return value

    @field_validator("min_fragment_memory_gib")
    @classmethod
    def _positive_floors(cls, value: dict[str, float]) -> dict[str, float]:
        for kind, gib in value.items():
            if gib <= 0:
                raise ValueError(f"{kind}: must be > 0 GiB")
        return value


TimeSliceLevel = Literal["default", "short", "medium", "long"]
TIME_SLICE_LEVELS: tuple[TimeSliceLevel, ...] = ("default", "short", "medium", "long")


class TimeSliceConfig(_Strict):
    stall_above_pct: float = Field(15.0, gt=0, lt=100)
    """Mean stall over `stall_window` above this: scheduling is wrong, lengthen the slice."""
    stall_window: Seconds = Field(300.0, gt=0)
    """Window of the stall mean (5 min, as in the alert rule)."""
    recover_below_pct: float = Field(7.5, ge=0)
    """Mean stall below this for `stabilization`: step back toward the base level."""
    compute_bound_level: TimeSliceLevel = "medium"
    """Base level for compute-bound pools: a longer slice (nvidia-smi levels carry no
    published durations; the design's 100 ms intent)."""
    io_bound_level: TimeSliceLevel = "short"
    """Base level for IO-bound pools: a shorter slice (the design's 50 ms intent)."""
    cooldown: Seconds = Field(600.0, ge=0)
    """Minimum time between changes of one pool; a change needs the 5 min window to refill."""
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


class ReplicasConfig(_Strict):
    target_utilization_pct: float = Field(70.0, gt=0, le=100)
    """Per-replica GPU utilization the floor aims at; headroom for bursts inside a tick."""
    tolerance: float = Field(0.1, ge=0, lt=1)
    """Ratio within 1 +- this changes nothing (the HPA's own default)."""
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(50, ge=1)
    scale_down_stabilization: Seconds = Field(300.0, ge=0)
    """The floor drops only to the highest recommendation of this window (HPA's 300 s)."""
    max_step_up_gpus: float = Field(4.0, gt=0)
    """GPUs' worth of replicas the floor adds per change at most, or the floor's own size
    when larger (the HPA's default scale-up policy: double, or add 4 pods, per period),
    in GPUs so the limit means the same at any fragment count."""
    max_step_down_gpus: float | None = Field(None, gt=0)
    """GPUs' worth of replicas the floor removes per change at most; null (default): no
    limit beyond the stabilization window, like the HPA's default scale-down policy. A
    limit spreads one fall of the load over several replica changes."""
    cooldown: Seconds = Field(30.0, ge=0)
    """Minimum time between floor changes of one workload (one KEDA polling interval)."""
    lead_time: Seconds = Field(120.0, gt=0)
    """The floor covers the forecast's upper bound from now to now + lead_time: about
    the time a replica added now needs to serve (KEDA polling + cold start)."""
    skill_check: bool = True
    """Score the forecast against reactive sizing and fall back when it has no skill
    (false: the forecast's upper bound always counts with the observed demand)."""
    skill_window: Seconds = Field(3600.0, gt=0)
    """Forecast origins of this long are scored for the skill self-assessment."""
    skill_min_origins: int = Field(20, ge=1)
    """Fewer scored origins than this: no verdict yet, the floor stays reactive until
    the forecast has shown skill."""
    skill_fallback_below: float = Field(0.1, ge=-1, le=1)
    """Skill below this: the floor stops following the forecast and sizes for the
    observed value (reactive on the workload's signal). Skill is the share of a reactive
    scaler's shortfall the forecast's extra capacity avoided beyond what the same extra
    capacity as flat headroom or as a level floor would have (gpuscaler.core.skill)."""
    skill_return_above: float = Field(0.2, ge=-1, le=1)
    """Skill back above this: the forecast sets the floor again (hysteresis). White noise
    with its level known exactly scores 0-0.12 (tests/test_skill.py), a 20-minute cycle
    0.63."""

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


# --------------------------------------------------------------------------- targets

M = TypeVar("M", bound=BaseModel)


def _only_sections(
    overrides: dict[str, dict[str, Any]], allowed: dict[str, type[BaseModel]], owner: str
) -> dict[str, dict[str, Any]]:
    unknown = set(overrides) - set(allowed)
    if unknown:
        raise ValueError(f"cannot override {sorted(unknown)} ({owner} overrides {sorted(allowed)})")
    return overrides


class NodeSelector(_Strict):
    label: str = Field(min_length=1)
    value: str = Field(min_length=1)


class NodePoolConfig(_Strict):
    name: str = Field(min_length=1, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    selector: NodeSelector
    gpu_memory_gib: float = Field(gt=0)
    """Memory of one GPU of the pool (e.g. 80 for an A100 80GB)."""
    workload_type: Literal["training", "inference"] = "inference"
    """Sets the fragment memory floor."""
    profile: Literal["compute_bound", "io_bound"] = "compute_bound"
    """Sets the base time slice level."""
    sharing: Literal["time-slicing", "mps"] = "time-slicing"
    initial_fragments: int | None = Field(None, ge=1)
    """Fragments assumed when no adapter reports them (simulator, first cycle)."""
    metrics_matchers: dict[str, str] = Field(default_factory=dict)
    """Exact-match labels that select this pool's GPU series in Prometheus, e.g.
    {modelName: NVIDIA A100-SXM4-80GB} or {Hostname: gpu-node-1} ("Hostname" also matches
    the lowercase "hostname" newer dcgm-exporters use). Values are escaped."""
    overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("metrics_matchers")
    @classmethod
    def _label_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:  # Prometheus' grammar; a value may be anything (it is escaped)
            if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name) or name.startswith("__"):
                raise ValueError(
                    f"{name!r} is not a Prometheus label name (letters, digits and '_', not "
                    "starting with a digit or '__')"
                )
        return value

    @field_validator("overrides")
    @classmethod
    def _sections(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return _only_sections(value, POOL_OVERRIDABLE, "a node pool")


class WorkloadConfig(_Strict):
    namespace: str = Field(min_length=1)
    kind: Literal["ScaledObject", "HorizontalPodAutoscaler"]
    name: str = Field(min_length=1)
    type: Literal["training", "inference"] = "inference"
    node_pool: str | None = None
    """The pool it runs on (for fragments and preemption); optional."""
    priority: int | None = None
    """Priority of its pods. At or above preemption.beneficiary_min_priority, with
    preemption.forecast_trigger on, replicas its forecast floor asks for that do not fit
    the pool free GPUs ahead of time."""
    gpus_per_replica: int = Field(1, ge=1)
    """GPU shares one replica requests (nvidia.com/gpu)."""
    demand: DemandConfig | None = None
    """Demand from the serving stack's own metrics (a preset: vllm, tgi, triton_queue,
    triton_rate, or any query) instead of its pods' GPU utilization; gpuscaler.demand."""
    leading_query: str | None = Field(None, min_length=1)
    """PromQL of the workload's demand (request rate, queue length), sent as written: a
    leading signal. Its forecast, mapped to GPU load by a ratio fitted per workload, replaces
    the load's own forecast when it has been clearly more accurate on recent history; the
    decision's reason says which signal won."""
    overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"

    @field_validator("overrides")
    @classmethod
    def _sections(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return _only_sections(value, WORKLOAD_OVERRIDABLE, "a workload")


POOL_OVERRIDABLE: dict[str, type[BaseModel]] = {
    "fragments": FragmentsConfig,
    "time_slice": TimeSliceConfig,
    "forecast": ForecastConfig,
}
WORKLOAD_OVERRIDABLE: dict[str, type[BaseModel]] = {
    "replicas": ReplicasConfig,
    "forecast": ForecastConfig,
}


def redact_url(url: str) -> str:
    """`url` with the password of any `user:password@` part replaced by ***: safe to print."""
    return re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://[^/@:\s]*):[^/@\s]*@", r"\1:***@", url)


class PrometheusQueries(_Strict):
    """PromQL templates. `{matchers}` is replaced by the target's escaped label matchers,
    `{lookback}` by twice the metrics step: `last_over_time(...[{lookback}])` keeps a missed
    scrape a gap instead of Prometheus' 5-minute lookback filling it with an old value."""

    pool_utilization: str = "avg(last_over_time(DCGM_FI_DEV_GPU_UTIL{{{matchers}}}[{lookback}]))"
    pool_stall: str = "avg(last_over_time(nvidia_gpu_stall_percentage{{{matchers}}}[{lookback}]))"
    workload_load: str = "sum(last_over_time(DCGM_FI_DEV_GPU_UTIL{{{matchers}}}[{lookback}]))"
    pool_memory_used: str = "max(last_over_time(DCGM_FI_DEV_FB_USED{{{matchers}}}[{lookback}]))"
    """MiB used on the pool's fullest GPU."""
    pool_memory_total: str = (
        "min(last_over_time(DCGM_FI_DEV_FB_USED{{{matchers}}}[{lookback}])"
        " + last_over_time(DCGM_FI_DEV_FB_FREE{{{matchers}}}[{lookback}]))"
    )
    """MiB of the pool's smallest GPU (used + free)."""
    workload_requests: str | None = None
    """Requests per second of a workload, over its pods (`gpuscaler whatif` replays it),
    e.g. `sum(rate(vllm:request_success_total{{{matchers}}}[1m]))`; unset: whatif derives
    the demand from `workload_load`."""

    @field_validator(
        "pool_utilization",
        "pool_stall",
        "workload_load",
        "pool_memory_used",
        "pool_memory_total",
        "workload_requests",
    )
    @classmethod
    def _placeholders(cls, value: str | None) -> str | None:
        return None if value is None else check_template(value)


class PrometheusConfig(_Strict):
    url: str | None = None
    """Prometheus base URL; unset = no Prometheus source (simulator only)."""
    timeout: Seconds = Field(10.0, gt=0)
    """Per request: a slow server costs at most this per query and cycle."""
    retries: int = Field(2, ge=0, le=10)
    """Retries of a failed request (connection errors and 5xx), with backoff."""
    backoff: Seconds = Field(0.5, ge=0)
    """First backoff between retries; doubles each retry."""
    overlap: Seconds = Field(5.0, ge=0)
    """Each incremental fetch re-reads this much before the newest sample held, for samples
    that arrived late."""
    # issue 18: grouped, concurrent reads (adapters/prometheus_grouped.py)
    grouped_queries: bool = True
    """One query per signal and pool family and one for all workloads (through the shipped
    recording rule), instead of one per target; targets a group does not cover are still
    read one by one. false: one query per target (a Prometheus without the rule)."""
    max_concurrent_queries: int = Field(4, ge=1, le=64)
    """Queries in flight at once: 4 keeps a tick's wait short without loading a shared
    Prometheus with one tick's worth of concurrent evaluations."""
    warm_state_file: str | None = None
    """Warm start (issue 18): the fetched windows are saved here (an emptyDir survives a
    container restart) and read back at start, so a restart fetches only the gap. None:
    every start backfills the whole window."""
    warm_state_every: Seconds = Field(120.0, gt=0)
    """The windows are saved after a tick at most this often: a restart then refetches at
    most this much plus what passed while down."""
    bearer_token_file: str | None = None
    """Re-read whenever the file changes (projected service account tokens rotate)."""
    basic_auth_username: str | None = None
    basic_auth_password_file: str | None = None
    ca_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    insecure_skip_verify: bool = False
    """Explicitly skip TLS verification (never the default)."""
    queries: PrometheusQueries = PrometheusQueries()

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.url is not None and not re.match(r"^https?://[^\s/]+", self.url):
            raise ValueError(f"url {redact_url(self.url)!r} is not an http(s) URL")
        if (self.basic_auth_username is None) != (self.basic_auth_password_file is None):
            raise ValueError(
                "basic auth needs both basic_auth_username and basic_auth_password_file"
            )
        if self.basic_auth_username is not None and self.bearer_token_file is not None:
            raise ValueError("use either a bearer token or basic auth, not both")
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("a client certificate needs both client_cert_file and client_key_file")
        return self


class PreemptionConfig(_Strict):
    enabled: bool = True
    """Free GPUs for pending high-priority pods; off = plan nothing, touch nothing."""
    beneficiary_min_priority: int = 1_000_000
    """Pods at or above this priority (e.g. PriorityClass gpu-critical) may have GPUs freed
    for them when they are pending because no GPU fits."""
    victim_max_priority: int = 10_000
    """Only pods below this priority are ever victims."""
    protected_namespaces: tuple[str, ...] = (
        "kube-system",
        "gpu-operator",
        "nvidia-device-plugin",
        "gpuscaler",
    )
    """Never a victim: the cluster's own machinery."""
    protected_labels: dict[str, str] = Field(default_factory=dict)
    """A pod with any of these label values is never a victim."""
    pending_for: Seconds = Field(30.0, ge=0)
    """A beneficiary must be unschedulable this long first: the scheduler may still place
    it, and a pod that just arrived often fits after a scale-down settles."""
    soft_grace: Seconds = Field(300.0, ge=0)
    """Tier 1: time a victim gets to checkpoint (annotation gpuscaler.io/checkpoint-done)
    or exit before it is evicted; 5 min fits one checkpoint of a large model."""
    checkpoint_endpoint: str | None = None
    """Optional: POST here to ask for a checkpoint ({pod_ip} is replaced), e.g.
    "http://{pod_ip}:8080/checkpoint"."""
    checkpoint_fresh: Seconds = Field(900.0, gt=0)
    """Victims whose last checkpoint (gpuscaler.io/last-checkpoint) is younger than this
    lose least work and are preferred."""
    eviction_grace_period: Seconds = Field(30.0, ge=0)
    """Tier 2: deleteOptions.gracePeriodSeconds of the eviction (SIGTERM to SIGKILL)."""
    eviction_retry: Seconds = Field(30.0, gt=0)
    """After a 429 (a PodDisruptionBudget), wait this long before trying again."""
    max_eviction_attempts: int = Field(4, ge=1)
    """Then the victim is given up and another is chosen (or, with escalate_to_delete, the
    pod is deleted)."""
    escalate_to_delete: bool = False
    """Delete a pod whose eviction a PDB keeps refusing (off: PDBs are respected)."""
    terminating_timeout: Seconds = Field(300.0, gt=0)
    """Tier 3: a victim still Terminating this long after eviction is force-deleted."""
    memory_release_timeout: Seconds = Field(120.0, gt=0)
    """Tier 3: GPU memory of a gone victim must be seen released within this, else the
    node is tainted for a node-side cleanup."""
    released_below_mib: float = Field(1024.0, ge=0)
    """Frame buffer used at or below this on a GPU with no pod = released (the reference
    leak check: util < 5 % and FB used > 1 GiB)."""
    max_in_flight: int = Field(2, ge=1)
    """Victims being preempted at once, at most."""
    max_per_hour: int = Field(10, ge=1)
    """Victims chosen per rolling hour, at most."""
    forecast_trigger: bool = False
    """Also free GPUs ahead of time for replicas that a high-priority workload's forecast
    floor asks for and its pool has no room for (off: only pods already pending)."""
    fragments_trigger: bool = False
    """Also preempt low-priority pods holding more shares of a GPU than the fewer fragments
    a hot pool should go to (off: the fragments change waits until they leave)."""


class ObjectRef(_Strict):
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)


class LeaseConfig(_Strict):
    name: str = Field("gpuscaler-leader", min_length=1)
    namespace: str | None = None
    """Unset: the pod's own namespace (POD_NAMESPACE), else `default`."""
    duration: Seconds = Field(15.0, gt=0)
    """A leader silent this long is presumed gone (client-go's default, 15 s)."""
    renew_deadline: Seconds = Field(10.0, gt=0)
    """A leader that has not renewed for this long stops acting, before its lease
    expires and another replica may take over."""
    retry_period: Seconds = Field(2.0, gt=0)
    """How often the lease is renewed or, on a standby, tried."""

    @model_validator(mode="after")
    def _order(self) -> Self:
        if not self.retry_period < self.renew_deadline < self.duration:
            raise ValueError(
                "need retry_period < renew_deadline < duration, so a leader stops acting "
                "before its lease can expire"
            )
        return self


class KubernetesConfig(_Strict):
    device_plugin_config_map: ObjectRef = ObjectRef(
        namespace="nvidia-device-plugin", name="gpuscaler-sharing-configs"
    )
    """The ConfigMap the NVIDIA device plugin's config-manager reads named configs from."""
    sharing_config_names: dict[Literal["time-slicing", "mps"], str] = Field(
        default_factory=lambda: {"time-slicing": "ts-{n}", "mps": "mps-{n}"}  # type: ignore[arg-type]
    )
    """Name of the device-plugin config giving n fragments per GPU; a node selects one with
    the label nvidia.com/device-plugin.config."""
    time_slice_label: str = Field("gpuscaler.io/time-slice", min_length=1)
    """Node label a node-side agent reads to set the time slice (default/short/medium/long)."""
    config_propagation: Seconds = Field(90.0, ge=0)
    """A sharing config gpuscaler adds to the device-plugin ConfigMap is named on a node
    only this long after: the kubelet syncs a mounted ConfigMap after a delay (about a
    minute), and the config-manager exits when the label names a config its copy lacks
    (NVIDIA/k8s-device-plugin cmd/config-manager/main.go). 0: relabel at once (only when
    the configs are pre-provisioned)."""
    max_nodes_per_tick: int = Field(2, ge=1)
    """Nodes relabelled per pool per tick: each relabel restarts that node's device plugin,
    so a pool changes a few nodes at a time and a bad config shows before it is everywhere."""
    max_writes_per_minute: int = Field(30, ge=1)
    """All Kubernetes writes of one controller (patches, creates) per minute at most, a
    bound on what a runaway plan could do."""
    events_namespace: str = Field("default", min_length=1)
    """Namespace of Events about cluster-scoped objects (Nodes), as kubectl expects."""
    lease: LeaseConfig = LeaseConfig()
    connect_timeout: Seconds = Field(5.0, gt=0, le=60)
    """Every API call gives up connecting after this: an API server that does not accept
    connections must not hold a tick (or a lease renewal) for long."""
    read_timeout: Seconds = Field(15.0, gt=0, le=300)
    """Every API call gives up waiting for an answer after this (a server that accepts and
    never answers). Lists of a large cluster take a few seconds; 15 s leaves room."""
    tick_api_budget: Seconds = Field(60.0, gt=0, le=3600)
    """Total Kubernetes API time one tick may spend; once spent, the tick's further calls
    fail at once (their targets get no action, with the reason) and the next tick starts
    afresh. Lease renewals, on their own thread, are not charged."""
    # issue 18: the watch cache (adapters/kube/cache.py)
    watch_cache: bool = True
    """Read the cluster from a watch cache (list once, then watch) instead of listing
    nodes, pods, ScaledObjects, HPAs, PDBs and PriorityClasses every tick. false: list
    every tick (small clusters, or an API server that cannot hold watches)."""
    watch_timeout: Seconds = Field(300.0, ge=1, le=3600)
    """Each watch asks the server to end it after this (timeoutSeconds); it is then opened
    again from the last resourceVersion. 5 min is about client-go's (a random 5-10 min)."""
    watch_stale_after: Seconds = Field(30.0, gt=0, le=3600)
    """A cache whose watch has been failing this long is not trusted: ticks flag every
    target until it is back. 30 s: a few retries (the backoff reaches 30 s), and well under
    the 5 min a decision looks ahead."""
    gitops_field_managers: tuple[str, ...] = (
        "argocd-controller",
        "argocd-application-controller",
        "kustomize-controller",
        "helm-controller",
    )
    """Field managers of GitOps tools (Argo CD's server-side apply manager is
    argoproj/argo-cd common/common.go ArgoCDSSAManager; Flux applies as kustomize-controller
    and helm-controller). When one of them owns a floor field (managedFields), gpuscaler
    does not patch it: the tool would put its value back, and the two would fight."""

    @field_validator("sharing_config_names")
    @classmethod
    def _has_n(cls, value: dict[str, str]) -> dict[str, str]:
        for strategy, pattern in value.items():
            if "{n}" not in pattern or not re.fullmatch(r"[A-Za-z0-9._{}-]+", pattern):
                raise ValueError(
                    f"{strategy}: {pattern!r} must contain {{n}} and only label-value "
                    "characters (letters, digits, '-', '_', '.')"
                )
        return value


class SimulatorConfig(_Strict):
    cold_start: Seconds = Field(60.0, ge=0)
    """A new replica serves at the earliest this long after its pod is created (image
    pull, model load); each cold start is drawn uniformly from [cold_start,
    cold_start_max]."""
    cold_start_max: Seconds = Field(120.0, ge=0)
    """Slowest cold start (uniform draw, seeded): 60-120 s loads a model onto a GPU."""
    sync_delay: Seconds = Field(15.0, ge=0)
    """Between a scaler's decision (HPA recommendation, KEDA poll, floor write) and the
    pod being created or deleted: the HPA's 15 s sync period."""
    drain_max: Seconds = Field(30.0, ge=0)
    """A leaving replica keeps its GPU and serves the queue until the queue present at
    its removal is drained, at most this long (terminationGracePeriodSeconds 30 s)."""
    slo_wait: Seconds = Field(2.0, gt=0)
    """A request waiting longer than this in the queue violates the SLO."""
    fragment_disruption: Seconds = Field(30.0, ge=0)
    """After a fragment change the device plugin restarts on each node of the pool and
    replicas move to the new layout: capacity is reduced for this long."""
    fragment_disruption_capacity: float = Field(0.5, ge=0, le=1)
    """Share of capacity left during a fragment change's disruption."""
    gpu_seconds_per_request: float = Field(0.06, gt=0)
    """GPU-busy seconds one request costs on a whole GPU: the load model's scale."""
    replica_gpu_share: float = Field(1.0, gt=0, le=1)
    """GPU share one replica holds at 1 fragment."""
    noise_pct: float = Field(2.0, ge=0)
    """Std dev of measurement noise added to utilization (percentage points)."""
    switch_overhead: float = Field(0.03, ge=0, lt=0.5)
    """Throughput lost per doubling of time-slicing tenants on a busy GPU."""
    preemption_burst_after: Seconds | None = 1800.0
    """A burst of high-priority pods into a full batch pool this long into the replay,
    to exercise the preemption tiers (null: none). 30 min: after the forecaster's warm-up,
    inside even a 2 h replay."""

    @model_validator(mode="after")
    def _cold_start_range(self) -> Self:
        if self.cold_start_max < self.cold_start:
            raise ValueError(
                f"cold_start_max ({self.cold_start_max:g}s) must not be below cold_start "
                f"({self.cold_start:g}s)"
            )
        return self


class AgentConfig(_Strict):
    """The node agent (`gpuscaler agent`, a DaemonSet): time slices, GPU topology and the
    cleanup of GPU processes that evicted pods leave behind."""

    poll_interval: Seconds = Field(10.0, gt=0)
    """How often the agent reads the node, NVML and the pods: a label change applies
    within this, and an orphan is seen this late at most."""
    orphan_grace: Seconds = Field(60.0, ge=0)
    """A GPU process whose pod is gone must stay so this long before SIGTERM: a pod list
    read an instant before its pod appeared, or a container still shutting down."""
    kill_timeout: Seconds = Field(10.0, gt=0)
    """SIGTERM, then SIGKILL when the process is still alive this long after."""
    dry_run: bool | None = None
    """Report what would be killed, set and lifted, and change nothing. Unset: follows
    `control.dry_run`, so a deployment that starts dry starts dry on the nodes too."""
    time_slice: bool = True
    """Apply the node's time-slice label with nvidia-smi (needs CAP_SYS_ADMIN; off: the
    DaemonSet may drop that capability)."""
    proc_root: str = "/proc"
    """The host's /proc (the DaemonSet runs with hostPID)."""
    sys_root: str = "/sys"
    """The host's /sys (NUMA node of each GPU's PCI device)."""
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    """The kubelet pod-resources API (read-only mount); unreachable: no device metric."""
    nvidia_smi: str = Field("nvidia-smi", min_length=1)
    """The nvidia-smi binary (name on PATH or a path)."""
    command_timeout: Seconds = Field(30.0, gt=0)
    """An nvidia-smi call slower than this failed."""
    pod_resources_timeout: Seconds = Field(5.0, gt=0)
    """A kubelet pod-resources `List` is abandoned after this (Kubernetes API calls are
    bounded by kubernetes.connect_timeout, read_timeout and tick_api_budget per poll)."""


class SchedulerConfig(_Strict):
    """The scheduler extender (`gpuscaler extender`): memory- and NUMA-aware placement."""

    scheduler_name: str = Field("gpu-scheduler", min_length=1)
    """spec.schedulerName of the pods the second kube-scheduler (and so the extender) places."""
    cache_ttl: Seconds = Field(5.0, gt=0)
    """GPU state is refreshed this often; a node not refreshed for 3 TTLs is filtered out
    as stale (the design's 5 s)."""
    memory_margin: float = Field(0.1, ge=0, lt=1)
    """Share of each GPU's memory never handed out: the design's 10 % OOM margin."""
    reservation_ttl: Seconds = Field(300.0, gt=0)
    """A bound pod's memory counts as used until measured memory shows it, or this long:
    5 min covers an image pull and a CUDA start."""
    sample_max_age: Seconds = Field(60.0, gt=0)
    """Only dcgm-exporter samples younger than this count (two 30 s exporter intervals)."""
    node_resync: Seconds = Field(30.0, gt=0)
    """Node objects (topology annotation, NUMA label, pool labels) are re-read this often."""
    lease: LeaseConfig = LeaseConfig(name="gpuscaler-extender")
    """The extender's own Lease: one replica holds the reservation ledger."""


class ExternalScalerConfig(_Strict):
    """KEDA's External Scaler gRPC service (gpuscaler.extscaler): a ScaledObject adds a
    trigger `type: external` pointing at gpuscaler and gets the forecast floor as a metric,
    with its own triggers still the ceiling. Nothing patches the user's object."""

    port: int | None = Field(None, ge=1, le=65535)
    """Port `gpuscaler run` serves the service on; null: off. Off unless set, so a bare
    config opens no port; deploy/config.yaml sets 9095 and the Service exposes it."""
    host: str = Field("0.0.0.0", min_length=1)
    """Address to listen on (all: KEDA's operator reaches it through the Service)."""
    service_names: tuple[str, ...] = ("gpuscaler",)
    """A ScaledObject trigger `type: external|external-push` whose scalerAddress host starts
    with one of these names (`gpuscaler`, `gpuscaler.gpuscaler.svc:9095`) is gpuscaler's:
    that ScaledObject's floor is served, never patched into spec.minReplicaCount."""
    max_age: Seconds | None = Field(None, gt=0)
    """A floor older than this is not served (the reactive triggers decide, as in an
    outage); null: three control intervals."""
    workers: int = Field(16, ge=3, le=256)
    """gRPC threads. Each open StreamIsActive (one per `external-push` ScaledObject) holds
    one; at most workers - 2 streams are open at once, so the polled calls always find a
    thread (a further stream is refused with RESOURCE_EXHAUSTED, and KEDA retries)."""
    stream_interval: Seconds = Field(5.0, gt=0, le=300)
    """StreamIsActive sends the activity this often (and at once when it changes)."""


class Config(_Strict):
    control: ControlConfig = ControlConfig()
    metrics: MetricsConfig = MetricsConfig()
    forecast: ForecastConfig = ForecastConfig()
    fragments: FragmentsConfig = FragmentsConfig()
    time_slice: TimeSliceConfig = TimeSliceConfig()
    replicas: ReplicasConfig = ReplicasConfig()
    node_pools: tuple[NodePoolConfig, ...] = ()
    workloads: tuple[WorkloadConfig, ...] = ()
    simulator: SimulatorConfig = SimulatorConfig()
    prometheus: PrometheusConfig = PrometheusConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()
    preemption: PreemptionConfig = PreemptionConfig()
    agent: AgentConfig = AgentConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    external_scaler: ExternalScalerConfig = ExternalScalerConfig()

    @model_validator(mode="after")
    def _check(self) -> Self:
        problems: list[str] = []
        if self.metrics.window < self.forecast.min_history:
            problems.append(
                "metrics.window: shorter than forecast.min_history, no forecast could be made"
            )
        if self.metrics.staleness < self.metrics.step:
            problems.append("metrics.staleness: shorter than metrics.step")
        if self.forecast.horizon >= self.metrics.window:
            problems.append(
                f"forecast.horizon: {format_duration(self.forecast.horizon)} is not shorter "
                f"than metrics.window {format_duration(self.metrics.window)}; a forecast "
                "cannot see further ahead than the history it learns from"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    _resolved: dict[tuple[str, str], BaseModel] = PrivateAttr(default_factory=dict)
    _overrides: dict[str, dict[str, dict[str, Any]]] | None = PrivateAttr(default=None)

    # Resolved per-target policy: global section with the target's override merged in,
    # validated once and kept. Targets are indexed once per config (a config is frozen),
    # so a tick plans in time linear in the number of targets.
    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with its own (empty) caches: pydantic copies private attributes, and a
        copy with other targets must not answer from the original's index."""
        copy = super().model_copy(update=update, deep=deep)
        copy._resolved, copy._overrides = {}, None
        return copy

    def _target_overrides(self, owner: str) -> dict[str, dict[str, Any]]:
        if self._overrides is None:
            index = {f"pool:{p.name}": p.overrides for p in self.node_pools}
            index |= {f"workload:{w.key}": w.overrides for w in self.workloads}
            self._overrides = index
        return self._overrides.get(owner, {})

    def pool_section(self, pool: str, section: str, model: type[M]) -> M:
        owner = f"pool:{pool}"
        return self._section(owner, section, self._target_overrides(owner).get(section), model)

    def workload_section(self, key: str, section: str, model: type[M]) -> M:
        owner = f"workload:{key}"
        return self._section(owner, section, self._target_overrides(owner).get(section), model)

    def _section(
        self, owner: str, section: str, override: dict[str, Any] | None, model: type[M]
    ) -> M:
        base = getattr(self, section)
        if override is None:
            assert isinstance(base, model)
            return base
        cached = self._resolved.get((owner, section))
        if cached is None:
            cached = merge_section(base, override, model)
            self._resolved[(owner, section)] = cached
        assert isinstance(cached, model)
        return cached

    def summary(self) -> str:
        return (
            f"{len(self.node_pools)} node pool(s), {len(self.workloads)} workload(s), "
            f"interval {format_duration(self.control.interval)}, "
            f"horizon {format_duration(self.forecast.horizon)}, "
            f"ARIMA{self.forecast.order} on {self.forecast.engine} engine, "
            f"dry_run={'on' if self.control.dry_run else 'off'}"
        )


# --------------------------------------------------------------------------- loading


def _as_yaml(section: BaseModel) -> dict[str, Any]:
    """A section's values as YAML would write them (durations with their unit again)."""
    out = section.model_dump()
    for name, info in type(section).model_fields.items():
        if any(getattr(m, "func", None) is parse_duration for m in info.metadata):
            out[name] = f"{out[name]!r}s"
    return out


def merge_section(base: BaseModel, override: dict[str, Any], model: type[M]) -> M:
    """`base` with `override` (raw YAML values) merged in, validated as a whole."""
    return model.model_validate({**_as_yaml(base), **override})


class ConfigError(InputError):
    """A config that cannot be used. `problems` holds one 'path: reason' line each."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: invalid config\n" + "\n".join(f"  {p}" for p in problems))


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _problems(error: ValidationError, prefix: tuple[int | str, ...] = ()) -> list[str]:
    lines = []
    for err in error.errors():
        loc = prefix + tuple(p for p in err["loc"] if p not in ("function-after",))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        if "\n" in msg:
            lines += msg.split("\n")  # several problems, each naming its own path
            continue
        lines.append(f"{_path(loc)}: {msg}")
    return lines


def _override_problems(doc: dict[str, Any]) -> list[str]:
    """Each override merged over its global section (or the default section, where the
    global one is itself invalid) and validated, reported at the override's path."""
    problems: list[str] = []
    for list_name, sections in (
        ("node_pools", POOL_OVERRIDABLE),
        ("workloads", WORKLOAD_OVERRIDABLE),
    ):
        items = doc.get(list_name)
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            overrides = item.get("overrides") if isinstance(item, dict) else None
            if not isinstance(overrides, dict):
                continue
            for section, override in overrides.items():
                model = sections.get(section)
                if model is None or not isinstance(override, dict):
                    continue  # reported by the schema
                try:
                    base = model.model_validate(doc.get(section) or {})
                except ValidationError:
                    base = model()
                try:
                    merge_section(base, override, model)
                except ValidationError as e:
                    problems += _problems(e, (list_name, i, "overrides", section))
    return problems


def _reference_problems(doc: dict[str, Any]) -> list[str]:
    """Duplicates and dangling references, found on the raw document so they are reported
    even when other fields are invalid."""
    problems: list[str] = []
    pools = doc.get("node_pools") or []
    names: list[object] = []
    if isinstance(pools, list):
        for i, p in enumerate(pools):
            name = p.get("name") if isinstance(p, dict) else None
            if name is not None and name in names:
                problems.append(f"node_pools[{i}].name: duplicate node pool {name!r}")
            names.append(name)
    workloads = doc.get("workloads") or []
    if isinstance(workloads, list):
        seen: set[tuple[object, ...]] = set()
        for i, w in enumerate(workloads):
            if not isinstance(w, dict):
                continue
            key = (w.get("namespace"), w.get("kind"), w.get("name"))
            if not all(isinstance(k, str) for k in key):
                continue  # a list or map where a name belongs is reported by the schema
            if key in seen:
                problems.append(
                    f"workloads[{i}]: duplicate workload {'/'.join(str(k) for k in key)}"
                )
            seen.add(key)
            pool = w.get("node_pool")
            if pool is not None and pool not in names:
                problems.append(f"workloads[{i}].node_pool: no node pool named {pool!r}")
    return problems


MANAGES_NOTHING = (
    "(top level): manages nothing: no node_pools and no workloads. List them, or write "
    "`workloads: []` to manage only the ScaledObjects and HPAs labelled "
    "gpuscaler.io/enabled=true"
)


def parse_config(text: str, source: str = "<config>", require_targets: bool = False) -> Config:
    """The validated config, or ConfigError listing every problem with its path.
    `require_targets`: a config for a controller must say what it manages (an empty file
    is a mistake, not a valid config)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(source, [f"not valid YAML{where}: {getattr(e, 'problem', e)}"]) from e
    except RecursionError:
        raise ConfigError(source, ["not valid YAML: nested too deeply"]) from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(source, [f"(top level): expected a mapping, got {type(doc).__name__}"])
    problems = _reference_problems(doc) + _override_problems(doc)
    if require_targets and "node_pools" not in doc and "workloads" not in doc:
        problems.append(MANAGES_NOTHING)
    try:
        config = Config.model_validate(doc)
    except ValidationError as e:
        raise ConfigError(source, _problems(e) + problems) from e
    if problems:
        raise ConfigError(source, problems)
    return config


def load_config(path: str | Path, require_targets: bool = True) -> Config:
    """The config file, checked; see `parse_config`."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(
                str(p), [f"file is {size:,} bytes; a config is at most {MAX_CONFIG_BYTES:,}"]
            )
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ConfigError(str(p), ["file not found"]) from e
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(str(p), [f"cannot read: {e}"]) from e
    return parse_config(text, str(p), require_targets)
