"""`gpuscaler whatif` against a real Prometheus backfilled by promtool with a week of the
bundled Azure LLM conversation trace (the shared data's 10 s file): the request rate, the
GPU load the simulator derives from it, and the replica counts of the KEDA-owned HPA as
kube-state-metrics names them (kubernetes/kube-state-metrics,
internal/store/horizontalpodautoscaler.go). The replay must give `gpuscaler simulate`'s
figures on the same trace at the same slot (whatif's read step, 10 s), because both run
through the same model. The whole week is not replayed here: at about 300 CPU-seconds a
workload-week for each of whatif and simulate it would take ten minutes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from builders import Terminal
from promserver import free_port, prometheus

from gpuscaler.adapters.kube.objects import rfc3339
from gpuscaler.adapters.prometheus.history import HistoryReader
from gpuscaler.config import parse_config
from gpuscaler.sim.equal_cost import WHATIF_BASELINES
from gpuscaler.sim.trace import load_trace
from gpuscaler.whatif import run_whatif, select, text

SCRIPT = Path(sys.executable).parent / "gpuscaler"
STEP = 10.0
PER_REQUEST = 0.06
"""simulator.gpu_seconds_per_request (the default): GPU load = rate x this x 100 %."""
WINDOW_AT = 3 * 86400 + 12 * 3600
"""The replayed window starts on day 4 at noon (busy hours) ..."""
WINDOW = 2 * 3600.0
"""... and lasts 2 hours: one metrics window of warm-up, one hour scored."""

GHOST = "  - {namespace: serving, kind: ScaledObject, name: ghost, node_pool: a100-80gb}\n"
"""A configured workload with no series in Prometheus."""

pytestmark = pytest.mark.timeout(900)


def _config(url: str, ghost: bool, slot: str = "500ms") -> str:
    return f"""
prometheus:
  url: "{url}"
  timeout: 20s
  queries:
    workload_requests: "sum(last_over_time(app_requests_per_second{{{{{{matchers}}}}}}[{{lookback}}]))"
simulator: {{preemption_burst_after: null, slot: {slot}}}
node_pools:
  - name: a100-80gb
    selector: {{label: nvidia.com/gpu.product, value: NVIDIA-A100-SXM4-80GB}}
    gpu_memory_gib: 80
    workload_type: inference
    profile: compute_bound
    initial_fragments: 2
workloads:
  - namespace: serving
    kind: ScaledObject
    name: llm-chat
    node_pool: a100-80gb
    overrides: {{replicas: {{max_replicas: 200}}}}
{GHOST if ghost else ""}"""


def _replicas(rate: np.ndarray) -> np.ndarray:
    """Replicas an HPA at 70 % of half a GPU each would have run (a planted series)."""
    return np.maximum(1, np.ceil(rate * PER_REQUEST * 100 / 35))


def _openmetrics(path: Path, start: float, rate: np.ndarray) -> None:
    pod = 'namespace="serving",pod="llm-chat-7d9f-abcde"'
    hpa = 'horizontalpodautoscaler="keda-hpa-llm-chat",namespace="serving"'
    families = (
        ("app_requests_per_second", pod, rate),
        ("DCGM_FI_DEV_GPU_UTIL", f'gpu="0",{pod}', rate * PER_REQUEST * 100),
        ("kube_horizontalpodautoscaler_status_current_replicas", hpa, _replicas(rate)),
    )
    with path.open("w", encoding="utf-8") as out:
        for name, labels, values in families:
            out.write(f"# TYPE {name} gauge\n")
            for i, v in enumerate(values):
                if math.isfinite(v):
                    out.write(f"{name}{{{labels}}} {v:.6g} {start + i * STEP:.0f}\n")
        out.write("# EOF\n")


class Week:
    def __init__(self, url: str, root: Path, start: float, rate: np.ndarray, csv: Path):
        self.url, self.root, self.start, self.rate, self.csv = url, root, start, rate, csv
        self.config = root / "whatif.yaml"
        self.config.write_text(_config(url, ghost=True))
        self.sim_config = root / "simulate.yaml"
        # whatif replays in slots of its read step (10 s): simulate at that slot.
        self.sim_config.write_text(_config(url, ghost=False, slot=f"{STEP:g}s"))


@pytest.fixture(scope="module")
def week(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Week]:
    root = tmp_path_factory.mktemp("whatif")
    trace = load_trace()  # the bundled week, 10 s bins
    assert trace.bin_seconds == STEP and trace.duration >= 7 * 86400
    # The same week, ending an hour ago: Prometheus keeps it (30 d retention).
    start = (math.floor(time.time() / STEP) * STEP) - trace.duration - 3600
    rate = trace.counts / STEP
    csv = root / "week.csv"
    times = start + STEP * np.arange(len(rate))
    csv.write_text(
        "time,requests\n"
        + "".join(f"{t:.0f},{c:.0f}\n" for t, c in zip(times, trace.counts, strict=True))
    )
    data = root / "week.om"
    _openmetrics(data, start, rate)
    with prometheus(data=data) as url:
        yield Week(url, root, start, rate, csv)


def _run(*args: str, timeout: float = 800) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_a_week_of_history_reads_back_sample_for_sample_across_chunks(week: Week) -> None:
    config = parse_config(_config(week.url, ghost=False))
    reader = HistoryReader(config)
    calls: list[int] = []
    reader.progress = calls.append
    end = week.start + STEP * (len(week.rate) - 1)
    query = "sum(last_over_time(app_requests_per_second[20s]))"
    series = reader.read(query, week.start, end, STEP)
    assert len(calls) == 6  # 60,481 points in chunks of at most 11,000 (the server's limit)
    np.testing.assert_allclose(series.values, week.rate, rtol=1e-6)


def test_without_a_request_query_the_gpu_load_is_read_and_the_replicas_too(week: Week) -> None:
    text = _config(week.url, ghost=False)
    config = parse_config(text[: text.index("  queries:")] + text[text.index("simulator:") :])
    assert config.prometheus.queries.workload_requests is None
    reader = HistoryReader(config)
    since = week.start + WINDOW_AT
    history = reader.workload(config.workloads[0], since, since + 3600, STEP)
    assert history.requests.series is None and "not set" in str(history.requests.problem)
    assert history.load.series is not None
    i = round(WINDOW_AT / STEP)
    expected = week.rate[i : i + 361] * PER_REQUEST * 100
    np.testing.assert_allclose(history.load.series.values, expected, rtol=1e-5)
    assert history.replicas.name == "kube_horizontalpodautoscaler_status_current_replicas"
    assert history.replicas.series is not None
    np.testing.assert_array_equal(history.replicas.series.values, _replicas(week.rate[i : i + 361]))


def _close(a: Any, b: Any, where: str) -> None:
    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, int | float) and not isinstance(a, bool):
        assert math.isclose(a, b, rel_tol=0.01, abs_tol=1e-9), f"{where}: {a} vs {b}"
    else:
        assert a == b, where


def test_whatif_reproduces_simulate_on_the_same_trace_within_one_percent(week: Week) -> None:
    since = week.start + WINDOW_AT
    until = since + WINDOW
    report = week.root / "report"
    # The two workloads in two processes (the same figures as in one), in less memory than
    # two processes of 10 lanes take: run so, and said.
    done = _run(
        *f"whatif --config {week.config} --since {rfc3339(since)} --until {rfc3339(until)} "
        f"--report {report} --json --jobs 2 --memory 512MiB".split()
    )
    assert done.returncode == 0, done.stderr
    assert "--jobs 2: 2 processes of 10 lanes need more than --memory 512 MiB" in done.stderr
    out = json.loads(done.stdout)
    sim = _run(
        *f"simulate --trace {week.csv} --config {week.sim_config} --start {WINDOW_AT / 3600!r} "
        f"--hours {WINDOW / 3600!r} --json".split()
    )
    assert sim.returncode == 0, sim.stderr
    expected = json.loads(sim.stdout)
    [got] = out["workloads"]
    assert got["workload"] == "serving/ScaledObject/llm-chat"
    for key in ("gpuscaler", "reactive", "scored_hours"):
        _close(got[key], expected[key], key)
    for key in ("baselines", "equal_cost"):  # simulate sweeps the Dynamo-style one too
        assert set(got[key]) == set(WHATIF_BASELINES) < set(expected[key])
        _close(got[key], {name: expected[key][name] for name in WHATIF_BASELINES}, key)
    assert got["gpuscaler"]["gpu_hours"] > 0
    assert "request rate" in got["load_model"]
    # The partial answer: the ghost workload has no series and is marked, not dropped.
    assert out["skipped"] == [
        {"workload": "serving/ScaledObject/ghost", "reason": out["skipped"][0]["reason"]}
    ]
    assert "no demand signal" in out["skipped"][0]["reason"]
    assert {r["verdict"] for r in out["table"]} <= {"enable", "keep reactive", "not enough data"}
    # The replicas that ran: the planted HPA series, held at each control interval.
    actual = got["actual"]
    assert actual["source"] == "kube_horizontalpodautoscaler_status_current_replicas"
    scored = slice(round((WINDOW_AT + 3600) / STEP), round((WINDOW_AT + WINDOW) / STEP))
    planted = float(np.mean(_replicas(week.rate[scored])))
    assert actual["mean_replicas"] == pytest.approx(planted, rel=0.05)
    assert (report / "summary.json").exists()
    assert (report / "serving_ScaledObject_llm-chat.png").stat().st_size > 10_000
    lines = (report / "decisions.jsonl").read_text().splitlines()
    assert all(json.loads(line)["workload"] == "serving/ScaledObject/llm-chat" for line in lines)


BAD = [
    (("--since", "30d", "--until", "29d"), "no workload could be replayed"),
    (("--workload", "serving/nope"), "--workload serving/nope: not in the config"),
    (("--workload", "serving/ghost"), "no demand signal"),
    (("--since", "yesterday"), "--since 'yesterday'"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "says"), BAD)
def test_whatif_bad_input_exits_2_with_the_reason(
    week: Week, args: tuple[str, ...], says: str
) -> None:
    done = _run("whatif", "--config", str(week.config), *args, timeout=120)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr


def test_whatif_on_an_unreachable_prometheus_exits_2_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    url = f"http://user:s3cret@127.0.0.1:{free_port()}"
    config.write_text(
        _config(url, ghost=False).replace("timeout: 20s", "timeout: 2s\n  retries: 0")
    )
    done = _run("whatif", "--config", str(config), timeout=60)
    assert done.returncode == 2, done.stderr
    assert "does not answer" in done.stderr and "127.0.0.1" in done.stderr
    assert "s3cret" not in done.stderr
    assert "Traceback" not in done.stderr


def test_on_a_terminal_the_workers_reads_reach_the_bar_and_the_text_leads_with_verdicts(
    week: Week,
) -> None:
    config = parse_config(week.config.read_text())
    since = week.start + WINDOW_AT
    term = Terminal()
    workloads = select(config, [])  # llm-chat and the ghost: two chunks, one a process
    outcome = run_whatif(
        config, since, since + WINDOW, workloads, baselines=False, err=term, jobs=2
    )
    assert [s["workload"] for s in outcome.summaries] == ["serving/ScaledObject/llm-chat"]
    lines = term.getvalue().split("\r")
    last = lines[-1]
    assert last.startswith("[" + "#" * 30 + "] 2/2 workloads, ")
    queries = int(last.split(" workloads, ")[1].split(" range queries")[0])
    # The probe is the parent's; every other query was a worker's, sent through the queue.
    assert queries > 1
    assert any(" 0/2 workloads, " in line and " 0 range queries" not in line for line in lines)
    report = text(outcome)
    lines = report.splitlines()
    assert lines[1].split(" | ")[0].strip() == "workload"
    assert "GPU-hours saved at equal SLO" in lines[1]
    assert lines[2].startswith("serving/ScaledObject/llm-chat")
    assert lines[2].rstrip().endswith("not enough data")  # no sweep, no comparison
    assert lines[3].startswith("serving/ScaledObject/ghost")  # skipped, still a row
    assert "load model: derived, not measured: request rate" in report
