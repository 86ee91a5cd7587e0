"""Typed, validated configuration loaded from YAML: every threshold with its unit and
default. `load_config` returns a frozen `Config` or raises `ConfigError` listing every
problem with its YAML path. A node pool may override `fragments`, `time_slice` and
`forecast`, a workload `replicas` and `forecast`; the merged section is validated whole,
so a contradiction an override creates is reported at the override's path.
"""

from __future__ import annotations

from gpuscaler.config.base import (
    MAX_CONFIG_BYTES,
    MAX_DURATION,
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
    POOL_OVERRIDABLE,
    WORKLOAD_OVERRIDABLE,
    Config,
    ConfigError,
    NodePoolConfig,
    NodeSelector,
    WorkloadConfig,
    load_config,
    merge_section,
    parse_config,
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
    "redact_url",
]
