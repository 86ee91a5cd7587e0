"""Physically impossible metrics, answers of the wrong shape, bad label names and
credentials in the URL, against a real Prometheus where the data can be planted."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from builders import run_cli
from promserver import planted_window, prometheus, write_openmetrics
from test_prometheus import _bad_server

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.adapters.prometheus.memory import GpuMemoryProbe
from gpuscaler.adapters.prometheus.transport import Transport
from gpuscaler.adapters.prometheus.window import drop_outside
from gpuscaler.config import ConfigError, parse_config, redact_url
from gpuscaler.controller import Controller
from gpuscaler.controller.assembly import NoActuator
from gpuscaler.core.preemption import VictimState
from gpuscaler.sources import PrometheusSource

POINTS = 2400  # 20 minutes at 500 ms


def _wave(i: int) -> float:
    return 50 + 5 * math.sin(i / 40)


# Each pool's utilization and stall; the last samples are where the absurd values sit.
POOLS: dict[str, tuple[Any, Any]] = {
    "huge": (lambda i: 1e300 if i > POINTS - 10 else _wave(i), lambda i: 5.0),
    "negative": (lambda i: -20.0 if i > POINTS - 10 else _wave(i), lambda i: 5.0),
    "stall150": (_wave, lambda i: 150.0 if i > POINTS - 10 else 5.0),
    "sane": (_wave, lambda i: 5.0),
}
WORKLOADS = {"absurd": 1e300, "below": -5.0, "fine": 120.0}


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    start, end = planted_window(POINTS, 20)
    util: list[tuple[dict[str, str], Any]] = []
    stall: list[tuple[dict[str, str], Any]] = []
    for name, (u, s) in POOLS.items():
        util.append(({"Hostname": f"node-{name}", "UUID": f"GPU-{name}"}, u))
        stall.append(({"Hostname": f"node-{name}", "UUID": f"GPU-{name}"}, s))
    for name, value in WORKLOADS.items():
        labels = {"Hostname": "node-w", "UUID": f"GPU-w-{name}", "namespace": "ml"}
        util.append(({**labels, "pod": f"{name}-0"}, lambda i, v=value: v))
    data = tmp_path_factory.mktemp("absurd") / "data.om"
    metrics = {"DCGM_FI_DEV_GPU_UTIL": util, "nvidia_gpu_stall_percentage": stall}
    write_openmetrics(data, metrics, start, POINTS)
    with prometheus(data) as url:
        yield url, end


CONFIG = """
prometheus: {{url: "{url}", timeout: 5s, retries: 0}}
metrics: {{window: 15m}}
forecast: {{min_history: 5m}}
fragments: {{sustain: 0s}}
time_slice: {{stall_window: 1m}}
node_pools:
{pools}
workloads:
{workloads}
"""


def test_physically_impossible_values_give_no_action_and_name_the_value(
    planted: tuple[str, float],
) -> None:
    url, end = planted
    pools = "\n".join(
        f"  - {{name: {n}, selector: {{label: pool, value: {n}}}, gpu_memory_gib: 80, "
        f"initial_fragments: 2, metrics_matchers: {{Hostname: node-{n}}}}}"
        for n in POOLS
    )
    workloads = "\n".join(
        f"  - {{namespace: ml, kind: ScaledObject, name: {n}}}" for n in WORKLOADS
    )
    config = parse_config(CONFIG.format(url=url, pools=pools, workloads=workloads))
    state = CurrentState(
        fragments={n: 2 for n in POOLS},
        floors={w.key: 1 for w in config.workloads},
        replicas={w.key: 1 for w in config.workloads},
    )
    source = PrometheusSource(config, state)
    raw = source.observe(end + 1)
    problems = {p.name: p.problem for p in raw.pools} | {
        w.key.split("/")[-1]: w.problem for w in raw.workloads
    }
    expected = {
        "huge": "e.g. 1e+300",
        "negative": "e.g. -20",
        "stall150": "e.g. 150",
        "absurd": "e.g. 1e+300",
        "below": "e.g. -5",
    }
    for name, example in expected.items():
        problem = problems[name] or ""
        assert "invalid input" in problem and example in problem, (name, problem)
    assert problems["sane"] is None and problems["fine"] is None
    plan = Controller(config, source, NoActuator(), dry_run=True).tick(end + 2).plan
    acted = {d.target.split("/")[-1] for d in plan.decisions}
    assert not acted & set(expected)
    skipped = {s.target for s in plan.skips if s.invalid_input}
    assert {"huge", "negative", "stall150"} <= skipped


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ([1.0, 50.0, 100.0], None),
        ([0.0, float("nan"), 99.9], None),
        ([1e300], "1 value(s) outside 0..100, e.g. 1e+300"),
        ([-0.5, 10, -3], "2 value(s) outside 0..100, e.g. -0.5"),
        ([100.0001], "e.g. 100"),
    ],
)
def test_out_of_range_names_how_many_and_one_example_and_keeps_them_out(
    values: list[float], problem: str | None
) -> None:
    array = np.array(values, dtype=float)
    found = drop_outside(array, (0.0, 100.0))
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
    kept = array[np.isfinite(array)]
    assert ((kept >= 0.0) & (kept <= 100.0)).all()


def test_once_survives_a_sample_that_is_a_json_object(tmp_path: Path) -> None:
    with _bad_server("object_sample") as url:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            f'prometheus: {{url: "{url}", retries: 0}}\n'
            "node_pools:\n  - {name: p, selector: {label: a, value: b}, gpu_memory_gib: 80, "
            "metrics_matchers: {Hostname: n}}\n"
        )
        out = run_cli("once", "--config", str(cfg), "--dry-run", "--state", "/dev/null")
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert "not [timestamp" in out.stdout


@pytest.mark.parametrize("name", ["bad-label", "0gpu", "__name__", "a b", ""])
def test_a_matcher_label_name_outside_prometheus_grammar_is_refused_at_validation(
    name: str,
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(
            "node_pools:\n  - {name: p, selector: {label: a, value: b}, gpu_memory_gib: 80, "
            f'metrics_matchers: {{"{name}": x}}}}\n'
        )
    assert "node_pools[0].metrics_matchers" in str(info.value)
    assert "Prometheus label name" in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:s3cret@prom:9090", "http://user:***@prom:9090"),
        ("https://u:p%40ss@prom/api", "https://u:***@prom/api"),
        ("http://prom:9090", "http://prom:9090"),
        ("http://user@prom:9090", "http://user@prom:9090"),
    ],
)
def test_a_password_in_the_url_is_masked_wherever_the_url_is_shown(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_credentials_in_the_prometheus_url_never_reach_stderr_or_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    secret = "hunter2-in-url"
    cfg.write_text(
        f'prometheus: {{url: "http://admin:{secret}@127.0.0.1:1", retries: 0, timeout: 1s}}\n'
        "node_pools:\n  - {name: p, selector: {label: a, value: b}, gpu_memory_gib: 80, "
        "metrics_matchers: {Hostname: n}}\n"
    )
    out = run_cli("once", "--config", str(cfg), "--dry-run", "--state", "/dev/null")
    assert out.returncode == 0, out.stderr
    assert secret not in out.stderr and secret not in out.stdout
    assert "admin:***@" in out.stderr
    config = parse_config(cfg.read_text())
    transport = Transport(config.prometheus)
    assert transport.scrub(f"GET http://admin:{secret}@host failed") == "GET http://***@host failed"
    bad = cfg.read_text().replace("http://", "ftp://")
    with pytest.raises(ConfigError) as info:
        parse_config(bad)
    assert secret not in str(info.value)


@pytest.mark.parametrize(
    "memory",
    [
        [{"metric": {"UUID": "GPU-1"}, "values": [[1, "garbage"]]}],
        [{"metric": {"UUID": "GPU-1"}, "values": [{"t": 1, "v": "0"}]}],
        [{"values": "0"}],
        {"not": "a list"},
    ],
    ids=["garbage value", "object sample", "no values list", "not a list"],
)
def test_a_malformed_answer_makes_a_gone_victims_memory_not_measurable(memory: Any) -> None:
    """The preemption memory check decodes as the reader does: a malformed answer is a
    source error, and the memory is not measurable (no quarantine), never a crash."""
    config = parse_config('prometheus: {url: "http://fake:1"}')

    class Fake(Transport):
        def query_range(self, query: str, start: float, end: float, step: float) -> Any:
            if "pod=" in query:  # the GPUs the pod held
                return [{"metric": {"UUID": "GPU-1"}, "values": [[start, "1000"]]}]
            return memory

    probe = GpuMemoryProbe(config, Fake(config.prometheus))
    state = VictimState("batch/p", "serving/critical", "gpu-0", 1, 10, "cleanup", 50.0, 10.0)
    assert probe.released(replace(state, gone_at=50.0), 100.0) is None
