"""The whole config with what it manages (node pools and workloads, each with its
overrides), and how a YAML file becomes one: every problem named with its path."""

from __future__ import annotations

import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, Literal, Self, TypeVar

import yaml
from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from gpuscaler.config.base import (
    MAX_CONFIG_BYTES,
    M,
    StrictModel,
    format_duration,
    only_sections,
    parse_duration,
)
from gpuscaler.config.control import (
    ControlConfig,
    ForecastConfig,
    FragmentsConfig,
    MetricsConfig,
    ReplicasConfig,
    TimeSliceConfig,
)
from gpuscaler.config.systems import (
    AgentConfig,
    ExternalScalerConfig,
    KubernetesConfig,
    PreemptionConfig,
    PrometheusConfig,
    SchedulerConfig,
    SimulatorConfig,
)
from gpuscaler.demand import DemandConfig
from gpuscaler.errors import InputError

T = TypeVar("T")


class NodeSelector(StrictModel):
    label: str = Field(min_length=1)
    value: str = Field(min_length=1)


class NodePoolConfig(StrictModel):
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
    """Exact-match labels that select this pool's GPU series in Prometheus, e.g. {modelName:
    NVIDIA A100-SXM4-80GB} ("Hostname" also matches the lowercase "hostname")."""
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
        return only_sections(value, POOL_OVERRIDABLE, "a node pool")


class WorkloadConfig(StrictModel):
    namespace: str = Field(min_length=1)
    kind: Literal["ScaledObject", "HorizontalPodAutoscaler"]
    name: str = Field(min_length=1)
    type: Literal["training", "inference"] = "inference"
    node_pool: str | None = None
    """The pool it runs on (for fragments and preemption); optional."""
    priority: int | None = None
    """Priority of its pods (preemption.forecast_trigger frees GPUs for those of a high one)."""
    gpus_per_replica: int = Field(1, ge=1)
    """GPU shares one replica requests (nvidia.com/gpu)."""
    demand: DemandConfig | None = None
    """Demand from the serving stack's own metrics (a preset or a query) instead of its pods'
    GPU utilization (gpuscaler.demand)."""
    leading_query: str | None = Field(None, min_length=1)
    """PromQL of the workload's demand (request rate, queue length): a leading signal, used
    when mapped to GPU load it has been more accurate than the load's own forecast."""
    overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"

    @field_validator("overrides")
    @classmethod
    def _sections(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return only_sections(value, WORKLOAD_OVERRIDABLE, "a workload")


POOL_OVERRIDABLE: dict[str, type[BaseModel]] = {
    "fragments": FragmentsConfig,
    "time_slice": TimeSliceConfig,
    "forecast": ForecastConfig,
}
WORKLOAD_OVERRIDABLE: dict[str, type[BaseModel]] = {
    "replicas": ReplicasConfig,
    "forecast": ForecastConfig,
}


class Config(StrictModel):
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
    _memo: dict[str, Any] = PrivateAttr(default_factory=dict)

    # A config is frozen: each target's section (the global one with the target's override
    # merged in) is resolved once and kept, so a tick plans in time linear in the targets.
    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with its own (empty) caches: one with other targets must not answer from
        the original's."""
        copy = super().model_copy(update=update, deep=deep)
        copy._resolved, copy._overrides, copy._memo = {}, None, {}
        return copy

    def memo(self, name: str, build: Callable[[], T]) -> T:
        """What `build` gives, built once per config and kept under `name`."""
        if name not in self._memo:
            self._memo[name] = build()
        found: T = self._memo[name]
        return found

    def pool_section(self, pool: str, section: str, model: type[M]) -> M:
        return self._section(f"pool:{pool}", section, model)

    def workload_section(self, key: str, section: str, model: type[M]) -> M:
        return self._section(f"workload:{key}", section, model)

    def pool_sections(self, section: str, model: type[M]) -> Sections[M]:
        """Every pool's `section` by name, resolved once per config."""
        return self._sections("pool", [p.name for p in self.node_pools], section, model)

    def workload_sections(self, section: str, model: type[M]) -> Sections[M]:
        """Every workload's `section` by key, resolved once per config."""
        return self._sections("workload", [w.key for w in self.workloads], section, model)

    def _sections(self, kind: str, names: list[str], section: str, model: type[M]) -> Sections[M]:
        def resolve(name: str) -> M:
            return self._section(f"{kind}:{name}", section, model)

        table = self.memo(f"{kind}:{section}", lambda: {n: resolve(n) for n in names})
        return Sections(table, resolve)

    def _section(self, owner: str, section: str, model: type[M]) -> M:
        if self._overrides is None:
            index = {f"pool:{p.name}": p.overrides for p in self.node_pools}
            self._overrides = index | {f"workload:{w.key}": w.overrides for w in self.workloads}
        override = self._overrides.get(owner, {}).get(section)
        found = getattr(self, section)
        if override is not None:
            found = self._resolved.get((owner, section))
            if found is None:
                found = self._resolved[(owner, section)] = merge_section(
                    getattr(self, section), override, model
                )
        assert isinstance(found, model)
        return found

    def summary(self) -> str:
        return (
            f"{len(self.node_pools)} node pool(s), {len(self.workloads)} workload(s), "
            f"interval {format_duration(self.control.interval)}, "
            f"horizon {format_duration(self.forecast.horizon)}, "
            f"ARIMA{self.forecast.order} on {self.forecast.engine} engine, "
            f"dry_run={'on' if self.control.dry_run else 'off'}"
        )


class Sections(Generic[M]):
    """A config's resolved sections by target; an unconfigured target gets the global one."""

    __slots__ = ("_resolve", "_table")

    def __init__(self, table: dict[str, Any], resolve: Callable[[str], M]) -> None:
        self._table, self._resolve = table, resolve

    def __getitem__(self, key: str) -> M:
        found: M | None = self._table.get(key)
        return self._resolve(key) if found is None else found


def merge_section(base: BaseModel, override: dict[str, Any], model: type[M]) -> M:
    """`base` with `override` (raw YAML values) merged in, validated as a whole; `base` as
    YAML would write it (durations with their unit again)."""
    out = base.model_dump()
    for name, info in type(base).model_fields.items():
        if any(getattr(m, "func", None) is parse_duration for m in info.metadata):
            out[name] = f"{out[name]!r}s"
    return model.model_validate({**out, **override})


class ConfigError(InputError):
    """A config that cannot be used. `problems` holds one 'path: reason' line each."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: invalid config\n" + "\n".join(f"  {p}" for p in problems))


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
        path = ""
        for part in loc:
            path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
        lines.append(f"{path or '(top level)'}: {msg}")
    return lines


def _override_problems(doc: dict[str, Any]) -> list[str]:
    """Each override merged over its global section (the default one where that is itself
    invalid) and validated, reported at the override's path."""
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
    pools, workloads = doc.get("node_pools") or [], doc.get("workloads") or []
    names: list[object] = []
    for i, p in enumerate(pools if isinstance(pools, list) else []):
        name = p.get("name") if isinstance(p, dict) else None
        if name is not None and name in names:
            problems.append(f"node_pools[{i}].name: duplicate node pool {name!r}")
        names.append(name)
    seen: set[tuple[object, ...]] = set()
    for i, w in enumerate(workloads if isinstance(workloads, list) else []):
        key = tuple(w.get(k) for k in ("namespace", "kind", "name")) if isinstance(w, dict) else ()
        if not key or not all(isinstance(k, str) for k in key):
            continue  # a list or map where a name belongs is reported by the schema
        if key in seen:
            problems.append(f"workloads[{i}]: duplicate workload {'/'.join(map(str, key))}")
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


def read_config_file(path: str | Path) -> str:
    """The file's text; ConfigError, before anything is read, unless it is a regular file
    of at most MAX_CONFIG_BYTES (a device such as /dev/zero would exhaust memory, a FIFO
    block a tick forever)."""
    p = Path(path)
    try:
        if not stat.S_ISREG(p.stat().st_mode):
            raise ConfigError(str(p), ["not a regular file (a device, FIFO or directory)"])
        with p.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(str(p), ["file not found"]) from None
    except OSError as e:
        raise ConfigError(str(p), [f"cannot read: {e.strerror}"]) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            str(p), [f"a config is at most {MAX_CONFIG_BYTES:,} bytes; this is larger"]
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(str(p), [f"not UTF-8 text (byte {e.start})"]) from None


def load_config(path: str | Path, require_targets: bool = True) -> Config:
    return parse_config(read_config_file(path), str(path), require_targets)
