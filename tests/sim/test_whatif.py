"""The pure parts of `gpuscaler whatif`: history shapes, the demand it replays, the
verdict arithmetic, time arguments and workload selection (no server; the real-Prometheus
replay is in test_whatif_live.py)."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from builders import workload_history
from hypothesis import given
from hypothesis import strategies as st

from gpuscaler.adapters.prometheus.history import REQUESTS, hpa_name, replica_queries
from gpuscaler.adapters.prometheus.window import drop_outside
from gpuscaler.config import Config, WorkloadConfig, parse_config
from gpuscaler.core.history import WorkloadHistory, gaps, native_resolution
from gpuscaler.core.model import Series
from gpuscaler.demand import DemandConfig
from gpuscaler.sim.equal_cost import hours_at_share
from gpuscaler.sim.replay import Prepared
from gpuscaler.sim.sweep import around_many, held
from gpuscaler.whatif import WhatifError, parse_when, select
from gpuscaler.whatif.history import (
    Skipped,
    WorkloadReplay,
    demand_rate,
    replay_many,
    workload_config,
)
from gpuscaler.whatif.verdict import compare, verdict

SCRIPT = Path(sys.executable).parent / "gpuscaler"
NOW = 1_800_000_000.0
W = WorkloadConfig(namespace="ns", kind="ScaledObject", name="chat")


def _replay(history: WorkloadHistory, config: Config) -> WorkloadReplay | Skipped:
    [done] = replay_many([(history, W)], config, 1, baselines=False)
    return done


def _series(values: list[float], step: float = 10.0) -> Series:
    return Series(1000.0, step, np.array(values, dtype=np.float64))


def _history(*series: Series | None, n: int = 101) -> WorkloadHistory:
    return workload_history(W.key, n, *series)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1, 2, 3], []),
        ([1, math.nan, 3], []),  # one missing step is not a gap
        ([1, math.nan, math.nan, 3], [(1010.0, 1020.0)]),
        ([math.nan, math.nan, 1, math.nan, math.nan], [(1000.0, 1010.0), (1030.0, 1040.0)]),
    ],
)
def test_gaps_are_runs_of_at_least_two_missing_steps(
    values: list[float], expected: list[tuple[float, float]]
) -> None:
    assert gaps(_series(values)) == expected


def test_native_resolution_is_the_step_for_a_live_series_and_longer_for_a_downsampled_one() -> None:
    rng = np.random.default_rng(0)
    live = rng.uniform(1, 2, 600)
    assert native_resolution(_series(list(live))) == 10.0
    coarse = np.repeat(rng.uniform(1, 2, 20), 30)  # one value per 5 minutes, read every 10 s
    assert native_resolution(_series(list(coarse))) == 300.0


@pytest.mark.parametrize(
    ("requests", "load", "values", "says"),
    [
        ([1.0, 2.0], [50.0, 60.0], [1.0, 2.0], ["request rate (q_req)"]),  # the rate first
        (None, [60.0, 120.0], [10.0, 20.0], ["GPU load (q_load)", "served load"]),  # / 0.06 s
        ([1.0, math.nan], None, [1.0, math.nan], ["request rate"]),  # out of range: dropped
        (None, None, None, ["no demand signal", "workload_requests: no series", "workload_load"]),
    ],
)
def test_the_demand_is_the_request_rate_else_the_gpu_load_else_a_skip_naming_each_signal(
    requests: list[float] | None,
    load: list[float] | None,
    values: list[float] | None,
    says: list[str],
) -> None:
    found = demand_rate(
        _history(*(None if v is None else _series(v) for v in (requests, load))), Config()
    )
    what = found if isinstance(found, str) else found[1]
    assert all(word in what for word in says), what
    if values is not None:
        assert not isinstance(found, str)
        np.testing.assert_allclose(found[0].values, values)


@pytest.mark.parametrize(
    ("values", "why"),
    [
        (np.repeat(np.arange(1.0, 11.0), 10), "series coarser than the step"),
        (np.random.default_rng(1).uniform(1, 3, 101), "too little history"),
    ],
)
def test_a_history_that_cannot_be_replayed_is_a_skip_not_an_error(
    values: np.ndarray, why: str
) -> None:
    done = _replay(_history(_series(list(values))), Config())
    assert isinstance(done, Skipped) and done.reason.startswith(why)


def test_the_history_is_replayed_alone_on_its_pool_without_a_burst_in_slots_of_its_step() -> None:
    """A week is not kept at 500 ms: the replay steps at the step the history was read at."""
    cfg = workload_config(Config(workloads=(W,)), W, 10.0)
    assert [w.name for w in cfg.workloads] == ["chat"] and cfg.workloads[0].node_pool
    assert cfg.simulator.preemption_burst_after is None and cfg.simulator.slot == 10.0
    assert workload_config(Config(workloads=(W,)), W).simulator.slot == 0.5
    n = 240 + 3  # 40 min at 10 s, one step of margin each side
    rate = _series([float(v) for v in np.random.default_rng(2).uniform(20, 40, n)])
    done = _replay(_history(rate, n=n), Config(workloads=(W,)))
    assert isinstance(done, WorkloadReplay), done
    run = done.result.gpuscaler
    assert (run.slot, run.cursor, len(done.result.p.arrivals)) == (10.0, 240, 240)
    assert done.result.summary()["scored_hours"] == 0.5  # after forecast.min_history


def test_the_replicas_that_ran_hold_over_gaps_and_fill_the_start() -> None:
    assert list(held(_series([math.nan, 3, math.nan, math.nan, 5]))) == [3, 3, 3, 3, 5]


def test_the_replay_of_the_replicas_that_ran_follows_them() -> None:
    cfg = workload_config(Config(workloads=(W,)), W)
    arrivals = np.full(7200, 10.0)  # 1 h of 20 requests/s at 500 ms
    schedule = Series(0.0, 60.0, np.r_[np.full(30, 4.0), np.full(30, 8.0)])
    p = Prepared("flat", cfg, 0.0, 3600.0, arrivals, 1, 0, 0.0)
    [around] = around_many([p], [schedule], baselines=(), reactive=False)
    out = around.actual
    assert out is not None and out["scaling_actions"] == 2  # min replicas -> 4 -> 8
    assert out["mean_replicas"] == pytest.approx(6, abs=0.1)


CURVE = [
    {"target_pct": 40, "gpu_hours": 30.0, "slo_violation_share": 0.0, "p99_wait_s": 0.1},
    {"target_pct": 60, "gpu_hours": 20.0, "slo_violation_share": 0.01, "p99_wait_s": 1.0},
    {"target_pct": 90, "gpu_hours": 10.0, "slo_violation_share": 0.05, "p99_wait_s": 5.0},
]


@pytest.mark.parametrize(
    ("share", "expected"),
    [
        (0.05, (10.0, True)),  # the cheapest target already reaches it
        (0.03, (15.0, False)),  # halfway between 90 % and 60 %
        (0.01, (20.0, False)),
        (0.0, (30.0, False)),
        (-0.001, None),  # no swept target reaches it
    ],
)
def test_gpu_hours_a_baseline_needs_for_an_slo_share(
    share: float, expected: tuple[float, bool] | None
) -> None:
    assert hours_at_share(CURVE, share) == expected


def _summary(gpu_hours: float, share: float, at_equal_share: float | None) -> dict[str, Any]:
    return {
        "gpuscaler": {"gpu_hours": gpu_hours, "slo_violation_share": share},
        "baselines": {"reactive": CURVE},
        "equal_cost": {
            "reactive": None
            if at_equal_share is None
            else {"gpu_hours": gpu_hours, "slo_violation_share": at_equal_share}
        },
    }


@pytest.mark.parametrize(
    ("gpu_hours", "share", "at_equal", "saved", "avoided", "expected"),
    [
        (12.0, 0.01, 0.04, 8.0, 0.03, "enable"),  # cheaper and fewer violations
        (25.0, 0.01, 0.005, -5.0, -0.005, "keep reactive"),  # dearer and more violations
        (20.0, 0.01, 0.01, 0.0, 0.0, "keep reactive"),  # the same: nothing to gain
        (40.0, 0.0, None, -10.0, None, "keep reactive"),  # off the curve, dearer at 0 %
    ],
)
def test_the_verdict_row_against_the_best_baseline(
    gpu_hours: float,
    share: float,
    at_equal: float | None,
    saved: float,
    avoided: float | None,
    expected: str,
) -> None:
    row = compare(_summary(gpu_hours, share, at_equal))
    assert row["gpu_hours_saved"]["gpu_hours"] == pytest.approx(saved)
    if avoided is None:
        assert row["violations_avoided"] is None
    else:
        assert row["violations_avoided"]["share"] == pytest.approx(avoided)
    assert row["verdict"] == expected


def test_no_comparison_on_either_axis_is_not_enough_data() -> None:
    assert verdict({"gpu_hours": 1.0}, None, None) == "not enough data"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("7d", NOW - 7 * 86400),
        ("90m", NOW - 5400),
        ("1700000000", 1_700_000_000.0),
        ("2023-11-14T22:13:20Z", 1_700_000_000.0),
        ("2023-11-14T23:13:20+01:00", 1_700_000_000.0),
        *((bad, None) for bad in ("yesterday", "7x", "", "2023-13-45T00:00:00Z", "nan", "inf")),
    ],
)
def test_when_arguments_or_an_error_naming_the_flag(text: str, expected: float | None) -> None:
    if expected is not None:
        assert parse_when(text, NOW, "--since") == expected
    else:
        with pytest.raises(WhatifError, match="--since"):
            parse_when(text, NOW, "--since")


def test_a_duration_past_the_maximum_names_the_maximum() -> None:
    with pytest.raises(
        WhatifError, match="--since: duration '10000d' is longer than a year: the maximum is 366d"
    ):
        parse_when("10000d", NOW, "--since")


def test_samples_out_of_range_are_the_reason_of_a_skip_not_too_little_history() -> None:
    values = np.full(101, 1e300)
    problem = drop_outside(values, REQUESTS)
    history = _history(_series(list(values)))
    history = replace(history, requests=replace(history.requests, problem=problem))
    done = _replay(history, Config())
    assert isinstance(done, Skipped)
    assert done.reason.startswith("workload_requests: 101 value(s) outside 0..1e+09, e.g. 1e+300")
    assert "too little history" not in done.reason


@given(st.text(max_size=30))
def test_parse_when_gives_a_finite_time_or_a_whatif_error(text: str) -> None:
    try:
        t = parse_when(text, NOW, "--until")
    except WhatifError:
        return
    assert math.isfinite(t)


def test_workloads_are_chosen_by_namespace_and_name() -> None:
    other = WorkloadConfig(namespace="ns", kind="HorizontalPodAutoscaler", name="batch")
    config = Config(workloads=(W, other))
    assert select(config, []) == [W, other]
    assert select(config, ["ns/batch"]) == [other]
    with pytest.raises(WhatifError, match="ns/nope: not in the config"):
        select(config, ["ns/nope"])
    with pytest.raises(WhatifError, match="names no workloads"):
        select(Config(), [])


def test_replicas_are_read_from_kedas_hpa_then_the_deployment() -> None:
    assert hpa_name(W) == "keda-hpa-chat"
    assert hpa_name(WorkloadConfig(namespace="a", kind="HorizontalPodAutoscaler", name="x")) == "x"
    (hpa_metric, hpa_q), (dep_metric, dep_q) = replica_queries(W)
    assert hpa_metric == "kube_horizontalpodautoscaler_status_current_replicas"
    assert 'horizontalpodautoscaler="keda-hpa-chat"' in hpa_q and 'namespace="ns"' in hpa_q
    assert dep_metric == "kube_deployment_status_replicas" and 'deployment="chat"' in dep_q


def test_the_requests_template_is_checked_like_the_others() -> None:
    from gpuscaler.config import ConfigError

    with pytest.raises(ConfigError, match="workload_requests"):
        parse_config("prometheus: {queries: {workload_requests: 'sum(rate(x[1m]))'}}\n")


CLI = [
    (None, ["--help"], 0, ["--config", "--since", "--until", "--workload", "--report", "--json"]),
    ("workloads: [{namespace: ns, kind: ScaledObject, name: chat}]\n", [], 2, ["prometheus.url is not set"]),
]  # fmt: skip


@pytest.mark.parametrize(("config", "args", "code", "says"), CLI)
def test_whatif_answers_help_and_exits_2_without_a_prometheus_url(
    tmp_path: Path, config: str | None, args: list[str], code: int, says: list[str]
) -> None:
    if config is not None:
        (tmp_path / "c.yaml").write_text(config)
        args = [*args, "--config", str(tmp_path / "c.yaml")]
    out = subprocess.run([str(SCRIPT), "whatif", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == code
    assert all(word in out.stdout + out.stderr for word in says)
    assert "Traceback" not in out.stderr


TEMPLATES = [
    ("prometheus: {queries: {workload_requests: 'sum(x{{{matchers}}})'}}\n", "workload_requests", True, None),
    ("{}\n", "workload_requests", False, "workload_requests is not set"),
    ("workload_demand: {preset: triton_rate, per_replica: 10}\n", "demand (triton_rate)", True, None),
    ("workload_demand: {preset: query, per_replica: 5, query: 'sum(r)', unit: requests/s}\n", "demand (query)", True, None),
    ("workload_demand: {preset: vllm, per_replica: 16}\n", "demand (vllm)", False, "not arrivals"),
]  # fmt: skip


@pytest.mark.parametrize(("yaml_text", "name", "is_rate", "why"), TEMPLATES)
def test_the_request_rate_comes_from_the_query_or_a_rate_demand_never_a_queue(
    yaml_text: str, name: str, is_rate: bool, why: str | None
) -> None:
    import yaml

    from gpuscaler.adapters.prometheus.history import request_template

    doc = yaml.safe_load(yaml_text)
    demand = doc.pop("workload_demand", None)
    config = Config.model_validate(doc)
    workload = W if demand is None else W.model_copy(update={"demand": DemandConfig(**demand)})
    template, what, why_not = request_template(workload, config)
    assert what == name
    assert (template is not None) == is_rate
    if why is None:
        assert why_not is None
    else:
        assert why_not is not None and why in why_not
