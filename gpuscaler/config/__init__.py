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

from gpuscaler.config.base import (
    MAX_CONFIG_BYTES,
    MAX_DURATION,
    DurationTooLong,
    M,
    Seconds,
    StrictModel,
    format_duration,
    only_sections,
    parse_duration,
)
from gpuscaler.config.control import (
    TIME_SLICE_LEVELS,
    ControlConfig,
    ForecastConfig,
    FragmentsConfig,
    MetricsConfig,
    ReplicasConfig,
    TimeSliceConfig,
    TimeSliceLevel,
)
from gpuscaler.config.loading import (
    MANAGES_NOTHING,
    Config,
    ConfigError,
    Sections,
    load_config,
    merge_section,
    parse_config,
    read_config_file,
)
from gpuscaler.config.systems import (
    AgentConfig,
    ExternalScalerConfig,
    KubernetesConfig,
    LeaseConfig,
    ObjectRef,
    PreemptionConfig,
    PrometheusConfig,
    PrometheusQueries,
    SchedulerConfig,
    SimulatorConfig,
    redact_url,
)
from gpuscaler.config.targets import (
    POOL_OVERRIDABLE,
    WORKLOAD_OVERRIDABLE,
    NodePoolConfig,
    NodeSelector,
    WorkloadConfig,
)

__all__ = [
    "MANAGES_NOTHING",
    "MAX_CONFIG_BYTES",
    "MAX_DURATION",
    "POOL_OVERRIDABLE",
    "TIME_SLICE_LEVELS",
    "WORKLOAD_OVERRIDABLE",
    "AgentConfig",
    "Config",
    "ConfigError",
    "ControlConfig",
    "DurationTooLong",
    "ExternalScalerConfig",
    "ForecastConfig",
    "FragmentsConfig",
    "KubernetesConfig",
    "LeaseConfig",
    "M",
    "MetricsConfig",
    "NodePoolConfig",
    "NodeSelector",
    "ObjectRef",
    "PreemptionConfig",
    "PrometheusConfig",
    "PrometheusQueries",
    "ReplicasConfig",
    "SchedulerConfig",
    "Seconds",
    "Sections",
    "SimulatorConfig",
    "StrictModel",
    "TimeSliceConfig",
    "TimeSliceLevel",
    "WorkloadConfig",
    "format_duration",
    "load_config",
    "merge_section",
    "only_sections",
    "parse_config",
    "parse_duration",
    "read_config_file",
    "redact_url",
]
