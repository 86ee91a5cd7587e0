"""Typed, validated configuration loaded from YAML: every threshold with its unit and
default. `load_config` returns a frozen `Config` or raises `ConfigError` listing every
problem with its YAML path. A node pool may override `fragments`, `time_slice` and
`forecast`, a workload `replicas` and `forecast`; the merged section is validated whole,
so a contradiction an override creates is reported at the override's path.
"""

from __future__ import annotations

from gpuscaler.config.base import DurationTooLong, format_duration, parse_duration
from gpuscaler.config.control import (
    TIME_SLICE_LEVELS,
    ForecastConfig,
    FragmentsConfig,
    ReplicasConfig,
    TimeSliceConfig,
)
from gpuscaler.config.loading import (
    Config,
    ConfigError,
    NodePoolConfig,
    WorkloadConfig,
    load_config,
    merge_section,
    parse_config,
    read_config_file,
)
from gpuscaler.config.systems import (
    AgentConfig,
    DraConfig,
    KubernetesConfig,
    LeaseConfig,
    PreemptionConfig,
    PrometheusConfig,
    SchedulerConfig,
    redact_url,
)

__all__ = [
    "TIME_SLICE_LEVELS",
    "AgentConfig",
    "Config",
    "ConfigError",
    "DraConfig",
    "DurationTooLong",
    "ForecastConfig",
    "FragmentsConfig",
    "KubernetesConfig",
    "LeaseConfig",
    "NodePoolConfig",
    "PreemptionConfig",
    "PrometheusConfig",
    "ReplicasConfig",
    "SchedulerConfig",
    "TimeSliceConfig",
    "WorkloadConfig",
    "format_duration",
    "load_config",
    "merge_section",
    "parse_config",
    "parse_duration",
    "read_config_file",
    "redact_url",
]
