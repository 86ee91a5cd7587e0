"""The simulator through its command line: the main job on the bundled trace."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from builders import run_cli

from gpuscaler.config import Config, parse_config
from gpuscaler.sim.simulate import simulate
from gpuscaler.sim.trace import Trace, TraceError, load_trace

POLICY_KEYS = {
    "under_provisioned_share",
    "gpu_hours",
    "scaling_actions",
    "direction_reversals",
    "forecast_mae",
    "naive_mae",
}


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_cli("simulate", *args, timeout=timeout)


@pytest.fixture(scope="module")
def bundled_default() -> dict[str, dict[str, float]]:
    """The README's main job: simulate with no arguments."""
    out = _cli("--json")
    assert out.returncode == 0, out.stderr
    result: dict[str, dict[str, float]] = json.loads(out.stdout)
    return result


def test_simulate_with_no_arguments_reports_both_policies_on_the_bundled_trace(
    bundled_default: dict[str, dict[str, float]],
) -> None:
    assert bundled_default["trace"] == "azure_llm_2024_conversation_10s.csv.gz"
    assert bundled_default["hours"] == 24
    for policy in ("gpuscaler", "reactive"):
        assert set(bundled_default[policy]) >= POLICY_KEYS


def test_gpuscaler_is_less_under_provisioned_than_reactive_for_at_most_ten_percent_more_gpu_hours(
    bundled_default: dict[str, dict[str, float]],
) -> None:
    g, r = bundled_default["gpuscaler"], bundled_default["reactive"]
    assert g["under_provisioned_share"] < r["under_provisioned_share"]
    assert g["gpu_hours"] <= 1.10 * r["gpu_hours"]


def test_the_forecast_beats_the_last_value_at_the_horizon(
    bundled_default: dict[str, dict[str, float]],
) -> None:
    g = bundled_default["gpuscaler"]
    assert g["forecast_mae"] < g["naive_mae"]


def test_report_writes_decisions_a_summary_and_a_plot(tmp_path: Path) -> None:
    out = _cli("--hours", "3", "--report", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "under_provisioned_share" in out.stdout  # the readable table
    lines = (tmp_path / "decisions.jsonl").read_text().splitlines()
    assert lines, "a 3 h replay makes at least one decision"
    assert any('"kind": "preemption"' in line for line in lines)  # the burst at 30 min
    for line in lines:
        record = json.loads(line)
        assert set(record) == {
            "time",
            "kind",
            "target",
            "from",
            "to",
            "reason",
            "forecast",
            "detail",
        }
        assert (record["detail"] is not None) == (record["kind"] == "preemption")
        assert record["reason"]
    assert (tmp_path / "simulation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "summary.json").read_text())["hours"] == 3


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _rows(n: int, step: int = 10, start: int = 1_700_000_000) -> str:
    return "".join(f"{start + i * step},{100 + (i % 7)}\n" for i in range(n))


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing file", None, "file not found"),
        ("empty file", "", "empty file"),
        ("header only", "time,requests\n", "no data rows"),
        ("one column", "time\n1\n2\n", "found 1 column"),
        ("no numeric column", "time,name\n1,a\n2,b\n", "no numeric column"),
        ("time going backwards", "time,requests\n" + _rows(3) + "1600000000,5\n", "backwards"),
        ("a repeated time", "time,requests\n10,1\n10,2\n", "backwards or repeats"),
        ("irregular spacing", "time,requests\n0,1\n10,1\n25,1\n", "irregular spacing"),
        ("negative counts", "time,requests\n0,1\n10,-4\n", "negative"),
        (
            "unparseable times",
            "time,requests\nmonday,1\ntuesday,2\n",
            "neither unix seconds nor ISO-8601",
        ),
        (
            "fewer points than one forecast window",
            "time,requests\n" + _rows(300),
            "shorter than one forecast window",
        ),
    ],
)
def test_a_bad_trace_exits_two_with_a_clear_message(
    tmp_path: Path, name: str, content: str | None, message: str
) -> None:
    path = tmp_path / "missing.csv" if content is None else _write(tmp_path, "trace.csv", content)
    out = _cli("--trace", str(path), timeout=60)
    assert out.returncode == 2, out.stdout
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_a_directory_is_not_a_trace(tmp_path: Path) -> None:
    out = _cli("--trace", str(tmp_path), timeout=60)
    assert out.returncode == 2 and "is a directory" in out.stderr


def test_more_hours_than_the_trace_holds_exits_two(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", "t,r\n" + _rows(1000))
    out = _cli("--trace", str(path), "--hours", "10", timeout=60)
    assert out.returncode == 2 and "the trace holds" in out.stderr


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


def test_an_idle_pool_gets_more_fragments_step_by_step_through_the_controller() -> None:
    result = simulate(
        _flat_trace(50), None, 1, _scenario(1, "{min_replicas: 4, max_replicas: 200}")
    )
    steps = [
        (d.from_value, d.to_value) for d in result.gpuscaler.decisions if d.kind == "fragments"
    ]
    assert steps == [(1, 2), (2, 4), (4, 8)]
    assert result.gpuscaler.cluster.fragments == 8
    assert result.reactive.cluster.fragments == 1  # the baseline never changes sharing


def test_a_hot_shared_pool_gets_fewer_fragments_and_a_longer_time_slice() -> None:
    result = simulate(
        _flat_trace(500), None, 1, _scenario(8, "{max_replicas: 200, target_utilization_pct: 90}")
    )
    kinds = {(d.kind, d.from_value, d.to_value) for d in result.gpuscaler.decisions}
    assert ("fragments", 8, 4) in kinds
    assert ("time_slice", "medium", "long") in kinds
