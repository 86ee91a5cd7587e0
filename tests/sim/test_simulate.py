"""The simulator through its command line: the main job on the bundled trace."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from builders import run_cli

from gpuscaler.config import Config, parse_config
from gpuscaler.sim.records import SimulationResult
from gpuscaler.sim.replay import warmup_plan
from gpuscaler.sim.simulate import simulate
from gpuscaler.sim.trace import Trace, TraceError, load_trace

pytestmark = pytest.mark.timeout(900)
"""Each replay runs gpuscaler, the reactive HPA and 33 baseline runs: minutes on a busy
2-core machine, beyond the suite's 120 s default."""

FIGURES = {"slo_violation_share", "p99_wait_s"}
POLICY_KEYS = FIGURES | {
    "under_provisioned_share", "gpu_hours", "scaling_actions", "direction_reversals",
    "forecast_mae", "naive_mae",
}  # fmt: skip


def _cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return run_cli("simulate", *args, timeout=timeout)


@pytest.fixture(scope="module")
def bundled_default() -> dict[str, Any]:
    """The README's main job: simulate with no arguments."""
    out = _cli("--json")
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_simulate_with_no_arguments_reports_both_policies_the_slo_and_the_curves(
    bundled_default: dict[str, Any],
) -> None:
    out = bundled_default
    assert out["trace"] == "azure_llm_2024_conversation_10s.csv.gz" and out["hours"] == 24
    assert out["slo_wait_s"] == 2.0
    for policy in ("gpuscaler", "reactive"):
        assert set(out[policy]) >= POLICY_KEYS
        assert 0.0 <= out[policy]["slo_violation_share"] <= 1.0
    assert set(out["baselines"]) == {"reactive", "keda_rate", "predictive_floor", "dynamo_sla"}
    point_keys = {"target_pct", "gpu_hours", "slo_violation_share", "p99_wait_s", "scaling_actions"}
    for curve in out["baselines"].values():
        assert [p["target_pct"] for p in curve] == list(range(40, 91, 5))
        assert all(set(point) >= point_keys for point in curve)
    assert set(out["equal_cost"]) == set(out["baselines"])
    for name, at in out["equal_cost"].items():
        assert name in out["equal_cost_outside"] if at is None else set(at) >= FIGURES
    # The reactive run is the reactive curve's 70 % point: same cluster, same arrivals.
    reactive70 = next(p for p in out["baselines"]["reactive"] if p["target_pct"] == 70)
    assert reactive70["gpu_hours"] == out["reactive"]["gpu_hours"]
    assert reactive70["slo_violation_share"] == out["reactive"]["slo_violation_share"]


def test_gpuscaler_is_no_worse_than_the_reactive_curve_at_its_own_gpu_hours(
    bundled_default: dict[str, Any],
) -> None:
    g = bundled_default["gpuscaler"]
    at = bundled_default["equal_cost"]["reactive"]
    assert at is not None, bundled_default["equal_cost_outside"]
    assert at["gpu_hours"] == g["gpu_hours"]
    tie = g["slo_violation_share"] < 0.001 and at["slo_violation_share"] < 0.001
    assert tie or g["slo_violation_share"] <= 1.05 * at["slo_violation_share"]
    reactive70 = next(p for p in bundled_default["baselines"]["reactive"] if p["target_pct"] == 70)
    assert g["scaling_actions"] <= reactive70["scaling_actions"]


def test_the_forecast_beats_the_last_value_at_the_horizon(
    bundled_default: dict[str, Any],
) -> None:
    g = bundled_default["gpuscaler"]
    assert g["forecast_mae"] < g["naive_mae"]


RECORD = {"time", "kind", "target", "from", "to", "reason", "forecast", "detail"}


def test_report_writes_decisions_a_summary_and_a_plot_and_no_matplotlib_log_line(
    tmp_path: Path,
) -> None:
    cache, report = tmp_path / "matplotlib", tmp_path / "r"  # matplotlib builds its cache now
    out = run_cli(
        "simulate", "--hours", "3", "--report", str(report), timeout=900,
        env={"MPLCONFIGDIR": str(cache)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert any(cache.iterdir()), "the font cache was built in this run"
    assert "matplotlib." not in out.stdout + out.stderr  # its loggers' names
    assert "under_provisioned_share" in out.stdout  # the readable table
    assert out.stdout.splitlines()[1].startswith("Equal cost")  # it leads
    lines = (report / "decisions.jsonl").read_text().splitlines()
    assert lines, "a 3 h replay makes at least one decision"
    assert any('"kind": "preemption"' in line for line in lines)  # the burst at 30 min
    for record in map(json.loads, lines):
        assert set(record) == RECORD and record["reason"]
        assert (record["detail"] is not None) == (record["kind"] == "preemption")
    assert (report / "simulation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((report / "summary.json").read_text())["hours"] == 3


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _rows(n: int, step: int = 10, start: int = 1_700_000_000) -> str:
    return "".join(f"{start + i * step},{100 + (i % 7)}\n" for i in range(n))


NO_TRACE, DIRECTORY = "-", "/"
BAD = [
    (None, (), "file not found"),
    ("", (), "empty file"),
    ("time,requests\n", (), "no data rows"),
    ("time\n1\n2\n", (), "found 1 column"),
    ("time,name\n1,a\n2,b\n", (), "no numeric column"),
    ("time,requests\n" + _rows(3) + "1600000000,5\n", (), "backwards"),
    ("time,requests\n10,1\n10,2\n", (), "backwards or repeats"),
    ("time,requests\n0,1\n10,1\n25,1\n", (), "irregular spacing"),
    ("time,requests\n0,1\n10,-4\n", (), "negative"),
    ("time,requests\nmonday,1\ntuesday,2\n", (), "neither unix seconds nor ISO-8601"),
    ("time,requests\n" + _rows(150), (), "shorter than one forecast window"),
    ("time,requests\n" + _rows(150), (), "supply at least 30 min of trace (the shortest replay)"),
    ("t,r\n0,1\n10,1\n10000000000,1\n", (), "cut the gap out"),  # unbounded memory
    (DIRECTORY, (), "is a directory"),
    ("t,r\n" + _rows(1000), ("--hours", "10"), "the trace holds"),
    (NO_TRACE, ("--hours", "nan"), "--hours: must be a finite number"),
    (NO_TRACE, ("--hours", "-1"), "--hours: must be more than 0"),
    (NO_TRACE, ("--hours", "0"), "--hours: must be more than 0"),
    (NO_TRACE, ("--start", "nan"), "--start: must be a finite number"),
    (NO_TRACE, ("--start", "-2"), "--start: must be at least 0"),
    (NO_TRACE, ("--resample", "fast"), "--resample"),
    (NO_TRACE, ("--resample", "100ms"), "at least 500ms"),
]  # fmt: skip


@pytest.mark.parametrize(("content", "args", "message"), BAD)
def test_bad_input_exits_two_with_a_clear_message(
    tmp_path: Path, content: str | None, args: tuple[str, ...], message: str
) -> None:
    path = tmp_path if content == DIRECTORY else tmp_path / "trace.csv"
    if content not in (None, DIRECTORY, NO_TRACE):
        path.write_text(content)
    out = _cli(*([] if content == NO_TRACE else ["--trace", str(path)]), *args, timeout=60)
    assert out.returncode == 2, out.stdout
    assert message in out.stderr and "Traceback" not in out.stderr


def test_a_unix_seconds_trace_with_a_missing_row_replays(tmp_path: Path) -> None:
    rows = _rows(1200, step=5).splitlines()
    del rows[500]  # a gap in the middle stays a gap
    trace = load_trace(_write(tmp_path, "t.csv", "ts,count\n" + "\n".join(rows) + "\n"))
    assert trace.bin_seconds == 5 and np.isnan(trace.counts[500])
    result = simulate(trace, None, 1, Config()).summary()
    assert set(result["gpuscaler"]) >= POLICY_KEYS


def test_iso_times_parse_to_unix_seconds(tmp_path: Path) -> None:
    trace = load_trace(
        _write(tmp_path, "t.csv", "time,requests\n2024-05-12 00:00:00,1\n2024-05-12 00:00:10,2\n")
    )
    assert trace.start == 1715472000.0 and trace.bin_seconds == 10


def test_the_bundled_trace_keeps_its_attribution() -> None:
    from gpuscaler.sim.trace import bundled_trace_path

    attribution = bundled_trace_path().parent / "ATTRIBUTION.md"
    text = attribution.read_text()
    assert "CC-BY-4.0" in text and "DynamoLLM" in text
    with pytest.raises(TraceError):
        load_trace(bundled_trace_path().parent / "nope.csv")


def _flat_trace(requests_per_bin: float, hours: float = 6) -> Trace:
    return Trace("flat", 1.7e9, 10.0, np.full(int(hours * 360), requests_per_bin))


def _scenario(fragments: int, replicas: str) -> Config:
    return parse_config(
        f"""
node_pools:
  - {{name: p, selector: {{label: a, value: b}}, gpu_memory_gib: 80, initial_fragments: {fragments}}}
workloads:
  - {{namespace: a, kind: ScaledObject, name: w, node_pool: p, overrides: {{replicas: {replicas}}}}}
"""
    )


def _steps(result: SimulationResult, kind: str) -> list[tuple[Any, Any]]:
    return [(d.from_value, d.to_value) for d in result.gpuscaler.decisions if d.kind == kind]


def test_an_idle_pool_gets_more_fragments_step_by_step_through_the_controller() -> None:
    config = _scenario(1, "{min_replicas: 4, max_replicas: 200}")
    result = simulate(_flat_trace(50), None, 1, config, baselines=False)
    # 4 replicas forced by min_replicas on 0.3 GPUs of demand: packing them saves GPUs
    # until one GPU holds all four; an eighth fragment would pack nothing (no ratchet).
    assert _steps(result, "fragments") == [(1, 2), (2, 4)]
    assert result.gpuscaler.metrics["fragment_changes"] == 2  # both reached the cluster
    assert result.reactive.metrics["fragment_changes"] == 0  # the baseline never changes it


def test_a_hot_shared_pool_gets_fewer_fragments_and_a_longer_time_slice() -> None:
    config = _scenario(8, "{max_replicas: 200, target_utilization_pct: 90}")
    result = simulate(_flat_trace(500), None, 1, config, baselines=False)
    assert (8, 4) in _steps(result, "fragments")
    assert ("medium", "long") in _steps(result, "time_slice")


def test_fragments_come_back_down_when_demand_rises_after_a_quiet_start() -> None:
    # Quiet for 3 h (4 forced replicas pack onto fewer GPUs), then 20x the demand: the
    # decision goes both ways, on demand per GPU rather than utilization.
    counts = np.concatenate([np.full(3 * 360, 50.0), np.full(3 * 360, 1000.0)])
    trace = Trace("quiet-then-busy", 1.7e9, 10.0, counts)
    config = _scenario(1, "{min_replicas: 4, max_replicas: 200}")
    steps = _steps(simulate(trace, None, 1, config, baselines=False), "fragments")
    up = steps.index((1, 2))
    assert any(int(b) < int(a) for a, b in steps[up:]), steps


def test_a_short_trace_runs_reactive_until_min_history_and_says_how_much_was_scored(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path, "t.csv", "t,r\n" + _rows(270))  # 45 minutes
    out = _cli("--trace", str(path), "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["hours"] == 0.75
    assert summary["forecast_from_hours"] == pytest.approx(10 / 60, abs=1e-3)
    assert summary["scored_hours"] == pytest.approx(0.75 - 10 / 60, abs=1e-3)


def test_a_per_request_log_is_binned_by_resample_and_the_column_is_named(
    tmp_path: Path,
) -> None:
    rows = "".join(f"{1_700_000_000 + i * 0.7:.3f},{100 + i % 5},7\n" for i in range(4000))
    path = _write(tmp_path, "log.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    counted = load_trace(path, resample=10.0)
    assert counted.bin_seconds == 10.0 and counted.counts.sum() == 4000
    assert "rows counted" in counted.source
    summed = load_trace(path, resample=10.0, column="GeneratedTokens")
    assert summed.counts.sum() == 7 * 4000 and "GeneratedTokens" in summed.source
    out = _cli("--trace", str(path), "--resample", "10s", "--column", "nope", timeout=60)
    assert out.returncode == 2 and "no column 'nope'" in out.stderr
    assert "ContextTokens" in out.stderr  # the remedy: the columns there are
    out = _cli("--trace", str(path), "--resample", "10s", "--json", timeout=300)
    assert out.returncode == 0, out.stderr
    assert "rows counted as requests" in out.stderr


def test_a_trace_past_30_minutes_but_short_of_the_history_names_the_setting_that_helps() -> None:
    config = Config.model_validate({"forecast": {"min_history": "40m"}})
    with pytest.raises(TraceError) as refused:
        warmup_plan(config, 35 * 60.0, "t.csv")
    assert "supply at least 45 min of trace" in str(refused.value)
    assert "set forecast.min_history to at most 30 min" in str(refused.value)
    assert warmup_plan(config, 45 * 60.0, "t.csv") == (int(40 * 60 / 0.5), 40 * 60.0)
