"""Config: YAML in, typed config or every problem with its path out."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from builders import run_cli

from gpuscaler.config import (
    Config,
    ConfigError,
    ForecastConfig,
    FragmentsConfig,
    ReplicasConfig,
    TimeSliceConfig,
    format_duration,
    load_config,
    parse_config,
    parse_duration,
)

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "config" / "gpuscaler.yaml"
POOL = "node_pools:\n  - {name: p, selector: {label: a, value: b}, gpu_memory_gib: 16}\n"
DEFAULTED = ("control", "metrics", "forecast", "fragments", "time_slice", "replicas", "simulator")
"""The sections the shipped config states at their built-in defaults."""
WORKLOAD = "workloads:\n  - {namespace: ml, kind: ScaledObject, name: chat}\n"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30),
        ("5m", 300),
        ("1h", 3600),
        ("1h30m", 5400),
        ("1.5s", 1.5),
        ("2d", 172800),
    ],
)
def test_durations_parse_with_their_unit(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["30", "30x", "", "s", "5 m", "-5s", "m5", "1h 30m"])
def test_durations_without_a_valid_unit_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="bad duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.5, "500ms"), (30, "30s"), (300, "5m"), (3600, "1h"), (90, "90s")]
)
def test_durations_format_back_to_their_unit(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_the_shipped_config_is_valid() -> None:
    config = load_config(SHIPPED)
    assert len(config.node_pools) == 2 and len(config.workloads) == 2


def test_the_shipped_config_states_the_built_in_defaults() -> None:
    shipped = load_config(SHIPPED)
    defaults = Config()
    for section in DEFAULTED:
        assert getattr(shipped, section) == getattr(defaults, section), section


def test_the_shipped_config_names_every_field_with_a_comment() -> None:
    doc = yaml.safe_load(SHIPPED.read_text())
    lines = SHIPPED.read_text().splitlines()
    for section, model in (
        ("forecast", ForecastConfig),
        ("fragments", FragmentsConfig),
        ("time_slice", TimeSliceConfig),
        ("replicas", ReplicasConfig),
    ):
        assert set(doc[section]) == set(model.model_fields), section
        for name in model.model_fields:
            line = next(line for line in lines if line.strip().startswith(f"{name}:"))
            if name != "min_fragment_memory_gib":
                assert "#" in line, f"{section}.{name} has no comment"


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("not YAML", "a: [1\n", "not valid YAML at line 2"),
        ("a list at the top", "- 1\n", "expected a mapping"),
        ("an unknown key", "fragments: {bogus: 1}\n", "fragments.bogus: unknown key"),
        ("an unknown section", "frobnicate: {}\n", "frobnicate: unknown key"),
        ("a wrong type", "replicas: {max_replicas: many}\n", "replicas.max_replicas: Input should be a valid integer"),
        ("a bad duration", "control: {interval: 30x}\n", "control.interval: bad duration '30x'"),
        ("a duration without unit", "control: {interval: 30}\n", "control.interval: expected a duration string"),
        ("an out-of-range threshold", "fragments: {fewer_above_pct: 120}\n", "fragments.fewer_above_pct"),
        ("contradictory fragment thresholds", "fragments: {more_below_pct: 90}\n", "fragments.more_below_pct: more_below_pct (90) must be below fewer_above_pct (85)"),
        ("a band too narrow for doubling", "fragments: {more_below_pct: 50}\n", "must be at most half"),
        ("unsorted allowed counts", "fragments: {allowed: [4, 2]}\n", "strictly increasing"),
        ("a compute over-commit", "fragments: {max_compute_commit: 1.2}\n", "fragments.max_compute_commit"),
        ("min above max replicas", "replicas: {min_replicas: 5, max_replicas: 2}\n", "must not be below min_replicas"),
        ("recovery above the stall trigger", "time_slice: {recover_below_pct: 20}\n", "recover_below_pct (20)"),
        ("an MA term on the fast engine", "forecast: {order: [2, 1, 1]}\n", "fits ARIMA(p,d,0) only"),
        ("second differences", "forecast: {order: [2, 2, 0]}\n", "d > 1 is not supported"),
        ("a window shorter than min_history", "metrics: {window: 5m}\n", "metrics.window: shorter than"),
        ("a duplicate workload", "workloads:\n  - {namespace: a, kind: ScaledObject, name: x}\n  - {namespace: a, kind: ScaledObject, name: x}\n", "workloads[1]: duplicate workload a/ScaledObject/x"),
        ("a duplicate node pool", POOL + "  - {name: p, selector: {label: a, value: b}, gpu_memory_gib: 16}\n", "node_pools[1].name: duplicate node pool 'p'"),
        ("a workload naming an unknown pool", "workloads:\n  - {namespace: a, kind: ScaledObject, name: x, node_pool: nope}\n", "workloads[0].node_pool: no node pool named 'nope'"),
        ("an unknown workload kind", "workloads:\n  - {namespace: a, kind: Deployment, name: x}\n", "workloads[0].kind"),
        ("an override of a section a pool cannot override", "node_pools:\n  - {name: p, selector: {label: a, value: b}, gpu_memory_gib: 16, overrides: {replicas: {}}}\n", "cannot override ['replicas']"),
        ("a contradiction an override creates", "node_pools:\n  - {name: p, selector: {label: a, value: b}, gpu_memory_gib: 16, overrides: {fragments: {more_below_pct: 86}}}\n", "node_pools[0].overrides.fragments.more_below_pct"),
        ("an unknown key in an override", "workloads:\n  - {namespace: a, kind: ScaledObject, name: x, overrides: {replicas: {floor: 3}}}\n", "workloads[0].overrides.replicas.floor: unknown key"),
        ("a namespace as a list", "workloads:\n  - {namespace: [a, b], kind: ScaledObject, name: x}\n", "workloads[0].namespace: Input should be a valid string"),
        ("a name as a map", "workloads:\n  - {namespace: a, kind: ScaledObject, name: {x: 1}}\n", "workloads[0].name: Input should be a valid string"),
        ("a boolean as an integer", "replicas: {min_replicas: true}\n" + WORKLOAD, "min_replicas: expected a number, got true"),
        ("a boolean as a step", "fragments: {max_step: false}\n" + WORKLOAD, "max_step: expected a number, got false"),
        ("an absurd duration", "control: {interval: 99999999999999d}\n" + WORKLOAD, "longer than a year"),
        ("a tick slower than hourly", "control: {interval: 2h}\n" + WORKLOAD, "control.interval: Input should be less than"),
        ("a horizon beyond the window", "forecast: {horizon: 2h}\n" + WORKLOAD, "forecast.horizon: 2h is not shorter than"),
        ("an empty file", "", "manages nothing"),
        ("nothing to manage", "control: {dry_run: true}\n", "manages nothing"),
        ("deep nesting", "[" * 3000 + "]" * 3000 + "\n", "nested too deeply"),
    ],
)  # fmt: skip
def test_an_invalid_config_is_refused_naming_the_path_and_reason(
    name: str, text: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as info:  # a controller's config: it names its targets
        parse_config(text, "test.yaml", require_targets=True)
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_every_problem_is_listed_not_just_the_first() -> None:
    text = (
        "control: {interval: 30x}\nfragments: {more_below_pct: 90, bogus: 1}\n"
        "workloads:\n  - {namespace: a, kind: ScaledObject, name: x}\n  - {namespace: a, kind: ScaledObject, name: x}\n"
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert len(info.value.problems) == 4, info.value.problems


def test_overrides_merge_over_the_global_section_per_target() -> None:
    config = load_config(SHIPPED)
    l4 = config.pool_section("l4-24gb", "fragments", FragmentsConfig)
    a100 = config.pool_section("a100-80gb", "fragments", FragmentsConfig)
    assert l4.cooldown == 1200 and l4.fewer_above_pct == 85
    assert a100 is config.fragments
    chat = config.workload_section("default/ScaledObject/llm-chat", "replicas", ReplicasConfig)
    assert chat.max_replicas == 200 and chat.min_replicas == 1


def test_an_empty_file_or_one_relying_on_discovery_gives_the_defaults() -> None:
    assert parse_config("") == Config()
    assert parse_config("workloads: []\n", require_targets=True) == Config()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=60)


@pytest.mark.parametrize("path", [SHIPPED, ROOT / "deploy" / "config.yaml"])
def test_validate_config_prints_a_one_line_summary_of_a_shipped_config_and_exits_zero(
    path: Path,
) -> None:
    out = _cli("validate-config", str(path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("\n") == 1 and out.stdout.startswith(f"{path}: valid: ")
    assert path != SHIPPED or "valid: 2 node pool(s), 2 workload(s)" in out.stdout


@pytest.mark.parametrize(
    ("content", "names"),
    [
        ("a: [1\n", "not valid YAML"),
        ("fragments: {more_below_pct: 90}\ncontrol: {interval: x}\n", "control.interval"),
        ("\x00\x01binary", "invalid config"),
    ],
)
def test_validate_config_exits_two_listing_problems_without_a_traceback(
    tmp_path: Path, content: str, names: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    out = _cli("validate-config", str(path))
    assert out.returncode == 2
    assert "invalid config" in out.stderr and names in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_validate_config_on_a_missing_file_exits_two() -> None:
    out = _cli("validate-config", "/nonexistent/gpuscaler.yaml")
    assert out.returncode == 2 and "file not found" in out.stderr


@pytest.mark.parametrize("command", ["once", "run"])
def test_run_and_once_validate_before_doing_anything(tmp_path: Path, command: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("fragments: {more_below_pct: 90}\n")
    out = _cli(command, "--config", str(path))
    assert out.returncode == 2
    assert "more_below_pct" in out.stderr and "Traceback" not in out.stderr
    assert "source:" not in out.stderr  # nothing started
