"""Per-target config sections resolved once per config (core/sections.py) are the very
sections `Config.workload_section` and `pool_section` give, for each config."""

from __future__ import annotations

import gc

from builders import config

from gpuscaler.config import ForecastConfig, FragmentsConfig, ReplicasConfig
from gpuscaler.core import sections
from gpuscaler.core.sections import pool_sections, workload_sections

YAML = (
    "node_pools:\n"
    "  - {name: a, selector: {label: p, value: a}, gpu_memory_gib: 80,"
    " overrides: {fragments: {max_step: 1}}}\n"
    "  - {name: b, selector: {label: p, value: b}, gpu_memory_gib: 80}\n"
    "workloads:\n"
    "  - {namespace: ml, kind: ScaledObject, name: w0, overrides: {replicas: {max_replicas: 7}}}\n"
    "  - {namespace: ml, kind: ScaledObject, name: w1}\n"
)


def test_each_workloads_section_is_the_one_the_config_gives() -> None:
    cfg = config(YAML)
    table = workload_sections(cfg, "replicas", ReplicasConfig)
    for key in ("ml/ScaledObject/w0", "ml/ScaledObject/w1", "ml/ScaledObject/not-configured"):
        assert table[key] is cfg.workload_section(key, "replicas", ReplicasConfig)
    assert table["ml/ScaledObject/w0"].max_replicas == 7
    assert table["ml/ScaledObject/w1"] is cfg.replicas


def test_each_pools_section_is_the_one_the_config_gives() -> None:
    cfg = config(YAML)
    table = pool_sections(cfg, "fragments", FragmentsConfig)
    for name in ("a", "b", "c"):
        assert table[name] is cfg.pool_section(name, "fragments", FragmentsConfig)
    assert table["a"] is not cfg.fragments


def test_a_new_config_gets_its_own_sections_and_a_dropped_one_is_forgotten() -> None:
    first = config(YAML)
    second = config(YAML.replace("max_replicas: 7", "max_replicas: 9"))
    assert (
        workload_sections(first, "replicas", ReplicasConfig)["ml/ScaledObject/w0"].max_replicas == 7
    )
    assert (
        workload_sections(second, "replicas", ReplicasConfig)["ml/ScaledObject/w0"].max_replicas
        == 9
    )
    assert (
        workload_sections(first, "forecast", ForecastConfig)["ml/ScaledObject/w1"] is first.forecast
    )
    key = id(second)
    assert key in sections._TABLES
    del second
    gc.collect()
    assert key not in sections._TABLES
