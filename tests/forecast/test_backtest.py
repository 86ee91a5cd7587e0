"""`gpuscaler backtest`: rolling-origin evaluation from any CSV."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from builders import run_cli

from gpuscaler.backtest import BacktestError, backtest, load_series_csv
from gpuscaler.config import ForecastConfig

METHODS = {"gpuscaler", "naive", "window_mean", "statsmodels_arima"}
SCORES = {"mae", "relative_to_naive", "peak_mae", "coverage", "origins"}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("backtest", *args, timeout=300)


def _ar_csv(path: Path, n: int = 900, step: int = 10, series: int = 1, seed: int = 3) -> Path:
    """Mean-reverting AR(1) load around 100 with noise: forecastable beyond the last value."""
    rng = np.random.default_rng(seed)
    lines = ["timestamp,value,series"]
    for k in range(series):
        x = 0.0
        for i in range(n):
            x = 0.9 * x + rng.normal(0, 5)
            value = 100 + x + rng.normal(0, 8)
            lines.append(f"{1_700_000_000 + i * step},{value:.3f},s{k}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_json_report_has_every_method_overall_and_per_series(tmp_path: Path) -> None:
    csv = _ar_csv(tmp_path / "ar.csv", series=2)
    out = _cli(
        "--series", str(csv), "--horizon", "2m", "--window", "1h", "--max-origins", "20", "--json"
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["horizon_s"] == 120
    assert set(report["overall"]) == METHODS
    assert set(report["series"]) == {"s0", "s1"}
    for scores in [report["overall"], *report["series"].values()]:
        for method in METHODS:
            assert set(scores[method]) == SCORES
    assert report["overall"]["naive"]["relative_to_naive"] == 1.0


def test_on_a_mean_reverting_series_the_forecaster_beats_the_last_value_and_its_peak_the_mean(
    tmp_path: Path,
) -> None:
    csv = _ar_csv(tmp_path / "ar.csv", n=1500)
    report = backtest(csv, ForecastConfig(), horizon=120, window=3600, max_origins=60)
    overall = report["overall"]
    assert overall["gpuscaler"]["relative_to_naive"] < 0.95
    assert 0.3 < overall["gpuscaler"]["coverage"] <= 1.0
    series = report["series"]["s0"]
    # A flat averaged path's maximum runs low; the peak forecast corrects for it.
    assert series["gpuscaler"]["peak_mae"] < series["window_mean"]["peak_mae"]


def test_resampling_sums_irregular_events_into_bins(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    times = np.sort(rng.uniform(0, 3 * 3600, 10000)) + 1_700_000_000
    csv = tmp_path / "events.csv"
    csv.write_text(
        "TIMESTAMP,Tokens,Generated\n"
        + "".join(f"{t:.3f},{int(rng.integers(1, 9))},3\n" for t in times)
    )
    args = ["--resample", "1m", "--agg", "count", "--window", "1h", "--max-origins", "12"]
    out = _cli("--series", str(csv), *args, "--json")
    assert out.returncode == 0, out.stderr
    assert set(json.loads(out.stdout)["series"]) == {"count"}  # rows per bin: one series


def test_each_numeric_column_is_its_own_series(tmp_path: Path) -> None:
    csv = tmp_path / "cols.csv"
    csv.write_text("t,a,b\n" + "".join(f"{i * 10},{i % 7},{i % 5}\n" for i in range(50)))
    assert sorted(load_series_csv(csv)) == ["a", "b"]


@pytest.mark.parametrize(
    ("args", "content", "message"),
    [
        ((), None, "file not found"),
        ((), "timestamp,value\n", "no data rows"),
        ((), "timestamp,value\n1,a\n2,b\n", "no numeric value column"),
        ((), "timestamp\n1\n2\n", "needs a timestamp column and a value column"),
        ((), "timestamp,value\n10,1\n5,2\n", "backwards"),
        ((), "timestamp,value\n0,1\n10,1\n25,1\n", "pass --resample"),
        ((), "timestamp,value\n0,1\n10,1\n20,1\n", "hold no origin"),
        (("--horizon", "5 minutes"), "timestamp,value\n0,1\n10,2\n", "bad duration"),
        (("--agg", "sum"), "timestamp,value\n0,1\n10,2\n", "--agg needs --resample"),
    ],
)
def test_bad_input_exits_two_with_a_clear_message(
    tmp_path: Path, args: tuple[str, ...], content: str | None, message: str
) -> None:
    csv = tmp_path / "s.csv"
    if content is not None:
        csv.write_text(content)
    out = _cli("--series", str(csv), *args)
    assert out.returncode == 2, out.stdout
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_a_value_and_series_column_split_into_named_series(tmp_path: Path) -> None:
    csv = tmp_path / "s.csv"
    csv.write_text("ts,v,pod\n0,1,a\n0,5,b\n10,2,a\n10,6,b\n")
    series = load_series_csv(csv)
    assert sorted(series) == ["a", "b"]
    assert list(series["b"].to_numpy()) == [5.0, 6.0]


def test_a_series_finer_than_the_fit_step_must_be_resampled(tmp_path: Path) -> None:
    csv = _ar_csv(tmp_path / "fine.csv", n=400, step=1)
    with pytest.raises(BacktestError, match="pass --resample"):
        backtest(csv, ForecastConfig(), horizon=60, window=300)


def _pods_csv(path: Path, n: int = 600, step: int = 10) -> Path:
    """Pod-like GPU utilization: one pod constant, one near-flat with rare blips, one
    mean-reverting busy pod."""
    rng = np.random.default_rng(11)
    lines = ["timestamp,value,pod"]
    x = 0.0
    for i in range(n):
        x = 0.9 * x + rng.normal(0, 5)
        blip = 1.5 if i % 97 == 0 else 0.0
        t = 1_700_000_000 + i * step
        lines += [f"{t},37,idle", f"{t},{12 + blip},flat", f"{t},{60 + x:.3f},busy"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_many_named_series_are_scored_pooled_and_per_series_with_the_worst_named(
    tmp_path: Path,
) -> None:
    csv = _pods_csv(tmp_path / "pods.csv")
    out = _cli("--series", str(csv), "--horizon", "2m", "--window", "30m", "--max-origins", "30")
    assert out.returncode == 0, out.stderr
    assert "worst series for gpuscaler:" in out.stdout
    report = backtest(csv, ForecastConfig(), horizon=120, window=1800, max_origins=30)
    assert set(report["series"]) == {"idle", "flat", "busy"}
    assert set(report["overall"]) == METHODS
    assert report["worst"]["series"] in {"flat", "busy"}
    for scores in report["series"].values():
        assert scores["gpuscaler"]["coverage"] is not None  # coverage per series
    # A constant series is scored, not refused, and the last value has no error there.
    idle = report["series"]["idle"]
    assert idle["naive"]["mae"] == 0.0
    assert idle["gpuscaler"]["mae"] == 0.0 and idle["gpuscaler"]["peak_mae"] == 0.0
    assert idle["gpuscaler"]["relative_to_naive"] is None  # 0 / 0: no ratio to show
    flat = report["series"]["flat"]["gpuscaler"]
    assert flat["mae"] is not None and flat["mae"] < 1.0  # never an explosive path
