"""Per-target config sections resolved once per config (`Config.pool_sections` and
`workload_sections`) are the very sections `Config.workload_section` and `pool_section`
give, for each config."""

from __future__ import annotations

from builders import config

from gpuscaler.config import ForecastConfig, FragmentsConfig, ReplicasConfig

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
    table = cfg.workload_sections("replicas", ReplicasConfig)
    for key in ("ml/ScaledObject/w0", "ml/ScaledObject/w1", "ml/ScaledObject/not-configured"):
        assert table[key] is cfg.workload_section(key, "replicas", ReplicasConfig)
    assert table["ml/ScaledObject/w0"].max_replicas == 7
    assert table["ml/ScaledObject/w1"] is cfg.replicas


def test_each_pools_section_is_the_one_the_config_gives() -> None:
    cfg = config(YAML)
    table = cfg.pool_sections("fragments", FragmentsConfig)
    for name in ("a", "b", "c"):
        assert table[name] is cfg.pool_section(name, "fragments", FragmentsConfig)
    assert table["a"] is not cfg.fragments


def test_a_new_config_and_a_copy_get_their_own_sections() -> None:
    first = config(YAML)
    second = config(YAML.replace("max_replicas: 7", "max_replicas: 9"))
    w0, w1 = "ml/ScaledObject/w0", "ml/ScaledObject/w1"
    assert first.workload_sections("replicas", ReplicasConfig)[w0].max_replicas == 7
    assert second.workload_sections("replicas", ReplicasConfig)[w0].max_replicas == 9
    assert first.workload_sections("forecast", ForecastConfig)[w1] is first.forecast
    # A copy with other targets answers from its own table, not the original's.
    renamed = first.workloads[0].model_copy(update={"name": "w9"})
    copy = first.model_copy(update={"workloads": [renamed, *first.workloads[1:]]})
    table = copy.workload_sections("replicas", ReplicasConfig)
    assert table["ml/ScaledObject/w9"].max_replicas == 7
    assert table[w0] is copy.replicas
