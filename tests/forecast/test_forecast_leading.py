"""Leading signals: a workload's demand forecast and mapped to GPU load by a fitted ratio,
used when it has been the more accurate signal, and the reason says which won."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from builders import floor_of, run_cli
from promserver import ValueAt, planted_window, prometheus, write_openmetrics

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.backtest import BacktestError, backtest, on_grid
from gpuscaler.config import ConfigError, ForecastConfig, ReplicasConfig, parse_config
from gpuscaler.core.forecast import fit_ratio, forecast, lead
from gpuscaler.core.model import Series, Signal, TargetHistory
from gpuscaler.core.snapshot import Observations, RawWorkload, build_snapshot
from gpuscaler.sources import PrometheusSource

N = 360  # 1 h of 10 s buckets
CFG = ForecastConfig()
NOW = 10.0 * (N - 1)


def _leading(
    lag: int, seed: int = 1, noise: float = 1.0, n: int = N
) -> tuple[np.ndarray, np.ndarray]:
    """Demand wandering around 50 and GPU load 5 + 2 x demand `lag` buckets later."""
    rng = np.random.default_rng(seed)
    demand = np.abs(50 + np.cumsum(rng.normal(0, 3, n)))
    load = np.full(n, np.nan)
    load[lag:] = 5 + 2 * demand[: n - lag]
    return demand, load + rng.normal(0, noise, n)


def _signal(load: np.ndarray) -> tuple[Signal, Series, float]:
    """The load's signal, its series and its adaptive interval level."""
    s = Series(0.0, 10.0, load)
    (sig,), state = forecast([s], CFG, NOW, keys=["k"])
    rows = state.get("k")
    assert rows is not None
    return sig, s, float(rows.adaptive.level[0])


@pytest.mark.parametrize("lag", [0, 2, 5])
def test_the_ratio_fit_finds_the_lag_and_the_ratio(lag: int) -> None:
    demand, load = _leading(lag)
    ratio = fit_ratio(load, demand)
    assert ratio is not None
    assert ratio.lag == lag
    assert ratio.ratio == pytest.approx(2.0, abs=0.05)
    assert ratio.error == pytest.approx(1.0, abs=0.2)  # the planted noise


def test_a_flat_demand_gives_no_ratio() -> None:
    assert fit_ratio(np.linspace(0, 10, 50), np.full(50, 3.0)) is None


def test_a_demand_that_leads_the_load_wins_and_the_reason_says_so() -> None:
    demand, load = _leading(3)
    sig, s, level = _signal(load)
    assert sig.forecast is not None
    out, used = lead(sig, s, Series(0.0, 10.0, demand), CFG, NOW, level)
    f = out.forecast
    assert f is not None and f.method == "demand"
    assert "leading signal: demand (lag 30s" in f.reason and "won" in f.reason
    assert f.errors["demand"] < f.errors[sig.forecast.method]
    assert "weight" in f.reason and "together" in f.reason
    # The first 3 steps follow from demand already observed (5 + 2 x demand): the path
    # with the demand is nearer them than the load's own forecast.
    known = 5 + 2 * demand[-3:]
    own_miss = np.abs(sig.forecast.mean[:3] - known).mean()
    assert np.abs(f.mean[:3] - known).mean() < 0.5 * own_miss
    assert np.all(f.lower <= f.mean) and np.all(f.mean <= f.upper)
    assert f.peak >= float(np.max(f.mean)) - 1e-9 or f.peak_error < 0
    assert used  # its interval replaces the one issued for the adaptive correction


def test_an_unrelated_demand_loses_and_the_load_forecast_is_kept() -> None:
    _, load = _leading(3)
    sig, s, level = _signal(load)
    noise = np.random.default_rng(9).normal(50, 5, N)
    out, used = lead(sig, s, Series(0.0, 10.0, noise), CFG, NOW, level)
    assert not used
    assert out.forecast is not None and sig.forecast is not None
    assert out.forecast.method == sig.forecast.method
    assert np.array_equal(out.forecast.mean, sig.forecast.mean)
    assert "leading signal: GPU load's own forecast won" in out.forecast.reason
    assert "demand" in out.forecast.errors


@pytest.mark.parametrize(
    ("demand", "problem", "says"),
    [
        (None, "prometheus: value -1 out of range", "demand not used: prometheus"),
        (np.full(N, np.nan), None, "demand not used: no samples"),
        (np.full(N, 7.0), None, "demand not used: too few paired points or no variation"),
        (np.concatenate([np.arange(N - 6.0), np.full(6, np.nan)]), None, "is 60s old"),
    ],
)
def test_an_unusable_demand_leaves_the_load_forecast_and_says_why(
    demand: np.ndarray | None, problem: str | None, says: str
) -> None:
    _, load = _leading(3)
    sig, s, _ = _signal(load)
    d = Series(0.0, 10.0, demand) if demand is not None else None
    out, _ = lead(sig, s, d, CFG, NOW, demand_problem=problem)
    assert out.forecast is not None and sig.forecast is not None
    assert np.array_equal(out.forecast.mean, sig.forecast.mean)
    assert says in out.forecast.reason


def test_the_snapshot_forecasts_a_workload_from_its_demand_when_it_wins() -> None:
    demand, load = _leading(3)
    config = parse_config(
        "workloads:\n  - {namespace: ml, kind: ScaledObject, name: chat, "
        "leading_query: 'sum(rate(vllm:request_success_total[1m]))'}\n"
    )
    assert config.workloads[0].leading_query == "sum(rate(vllm:request_success_total[1m]))"
    raw = RawWorkload(
        key="ml/ScaledObject/chat",
        load=Series(0.0, 10.0, np.clip(load, 0, None)),
        floor=1,
        replicas=1,
        demand=Series(0.0, 10.0, demand),
    )
    snap, _ = build_snapshot(Observations(NOW, (), (raw,)), config, NOW)
    f = snap.workloads[0].load.forecast
    assert f is not None and f.method == "demand" and "leading signal" in f.reason
    # The replica floor decision carries which signal won in its reason.
    out = floor_of(
        snap.workloads[0], ReplicasConfig(skill_check=False), 120.0, TargetHistory(), NOW
    )
    assert out.decision is not None, out.skip
    assert "leading signal: demand (lag 30s" in out.decision.reason
    plain, _ = build_snapshot(
        Observations(NOW, (), (RawWorkload(raw.key, raw.load, 1, 1),)), config, NOW
    )
    assert plain.workloads[0].load.forecast is not None
    assert "leading signal" not in plain.workloads[0].load.forecast.reason


def test_an_empty_leading_query_is_refused() -> None:
    with pytest.raises(ConfigError, match="leading_query"):
        parse_config(
            "workloads:\n  - {namespace: ml, kind: ScaledObject, name: c, leading_query: ''}\n"
        )


def _csv(path: Path, values: np.ndarray) -> Path:
    lines = ["timestamp,value"] + [
        f"{1_700_000_000 + i * 10},{v:.4f}" for i, v in enumerate(values) if math.isfinite(v)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_backtest_scores_the_leading_signal_against_the_load_alone(tmp_path: Path) -> None:
    demand, load = _leading(3, seed=4, n=2 * N)  # 2 h
    ld, dd = _csv(tmp_path / "load.csv", load), _csv(tmp_path / "demand.csv", demand)
    report = backtest(ld, CFG, 300.0, 3600.0, max_origins=40, demand_path=dd)
    g, alone = report["overall"]["gpuscaler"], report["overall"]["gpuscaler_load_only"]
    assert g["demand_won"] > 0.5
    assert g["mae"] < alone["mae"]
    out = run_cli(
        "backtest", "--series", str(ld), "--demand", str(dd), "--window", "1h",
        "--max-origins", "10", timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "gpuscaler_load_only" in out.stdout and "demand won at" in out.stdout
    bad = run_cli(
        "backtest", "--series", str(ld), "--demand", str(tmp_path / "none.csv"), timeout=300
    )
    assert bad.returncode == 2 and "none.csv" in bad.stderr and "Traceback" not in bad.stderr


POINTS = 3600  # 30 min at 500 ms


@pytest.fixture(scope="module")
def demand_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    data = tmp_path_factory.mktemp("prom") / "data.om"
    start, end = planted_window(POINTS, 30)
    pod = {"Hostname": "n", "gpu": "0", "UUID": "GPU-0", "namespace": "ml", "pod": "chat-1"}
    metrics: dict[str, list[tuple[dict[str, str], ValueAt]]] = {
        "DCGM_FI_DEV_GPU_UTIL": [(pod, lambda i: 40 + 20 * math.sin(i / 300))],
        "app_requests": [
            ({"app": "chat"}, lambda i: 10 + 5 * math.sin(i / 300)),
            ({"app": "broken"}, lambda i: -1.0),
        ],
    }
    write_openmetrics(data, metrics, start, POINTS)
    with prometheus(data) as url:
        yield url, end


def _demand_source(url: str, app: str) -> PrometheusSource:
    config = parse_config(
        f'prometheus: {{url: "{url}", timeout: 5s, retries: 1, backoff: 100ms, '
        "background_backfill: false}\n"
        "workloads:\n  - {namespace: ml, kind: ScaledObject, name: chat, "
        f"leading_query: 'sum(app_requests{{app=\"{app}\"}})'}}\n"
    )
    return PrometheusSource(config, CurrentState())


def test_the_prometheus_source_reads_the_leading_query(demand_prom: tuple[str, float]) -> None:
    url, end = demand_prom
    (w,) = _demand_source(url, "chat").observe(end + 1).workloads
    assert w.demand is not None and w.demand_problem is None
    values = w.demand.values[np.isfinite(w.demand.values)]
    assert values.size >= POINTS * 0.5 / 10 - 1  # the planted half hour in 10 s buckets
    assert values.min() >= 5 - 1e-6 and values.max() <= 15 + 1e-6  # the planted sine
    assert w.load is not None and w.problem is None
    (bad,) = _demand_source(url, "broken").observe(end + 1).workloads
    assert bad.demand_problem is not None and bad.demand_problem.startswith("prometheus:")
    assert bad.problem is None  # the load itself is fine: it is forecast on its own


@pytest.mark.parametrize(
    ("start", "values", "expect"),
    [
        (0.0, [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]),  # the same grid
        (20.0, [3.0, 4.0], [math.nan, math.nan, 3.0, 4.0]),  # starts later: gaps before
        (-20.0, [9.0, 9.0, 1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0]),  # earlier, longer
        (100.0, [7.0], [math.nan] * 4),  # no overlap at all
    ],
)
def test_a_demand_is_put_on_the_load_series_time_slots(
    start: float, values: list[float], expect: list[float]
) -> None:
    grid = Series(0.0, 10.0, np.zeros(4))
    out = on_grid(Series(start, 10.0, np.array(values)), grid)
    assert out.start == grid.start and out.step == grid.step
    np.testing.assert_array_equal(out.values, np.array(expect))


def test_a_demand_on_another_step_is_refused() -> None:
    with pytest.raises(BacktestError, match="demand step 5s differs"):
        on_grid(Series(0.0, 5.0, np.zeros(8)), Series(0.0, 10.0, np.zeros(4)))
