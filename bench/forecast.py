"""Forecast speed: gpuscaler's forecaster against statsmodels' ARIMA(5,1,0), CPU time.

1,000 GPU series x 7,200 points (1 h at 500 ms: a slow swing, a wandering load, bursts,
idle stretches, missed scrapes and outages). gpuscaler forecasts the whole batch at once
(its production path: 10 s buckets, ensemble, interval); statsmodels' ARIMA(5,1,0) fits
a sample of the same series one at a time, on the same 10 s buckets. The two are timed
in CPU seconds (`time.process_time`), alternately in the same process for `--rounds`
rounds, BLAS pinned to one thread (multithreaded BLAS on a shared machine makes
statsmodels several times slower and would flatter the ratio). Each is scored on the
held-out last 5 minutes (10 s means) as a check that the speed is not bought with
accuracy.

Gate: `ratio` (statsmodels' CPU seconds a series / gpuscaler's, median over the rounds)
at least 50 (goal 100).

    python bench/forecast.py [--sample 30] [--rounds 3]

Last line: RESULT ratio= gate=pass|fail gpuscaler_cpu_ms_per_series=
statsmodels_cpu_ms_per_series= mae_ratio= (gpuscaler's held-out MAE / statsmodels')
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import numpy as np

N_SERIES = 1000
POINTS = 7200  # 1 h at 500 ms
STEP = 0.5
HELD_OUT = 600  # the last 5 minutes
NOW = 1_700_000_000.0
GATE = 50.0


def _forecast(batch: np.ndarray, now: float) -> np.ndarray:
    """gpuscaler's forecast means (one row per series, at fit_step) of `batch`, 500 ms
    samples ending at `now`, clipped to 0-100 %: the only call into its forecaster."""
    from gpuscaler.config import ForecastConfig
    from gpuscaler.core.forecast import forecast
    from gpuscaler.core.model import Series

    cfg = ForecastConfig()
    origin = now - STEP * (batch.shape[1] - 1)
    series = [Series(origin, STEP, row) for row in batch]
    signals, _ = forecast(series, cfg, now, clips=[(0.0, 100.0)] * len(series))
    steps = round(cfg.horizon / cfg.fit_step)
    return np.array([s.forecast.mean if s.forecast else np.full(steps, np.nan) for s in signals])


def _reference(buckets: np.ndarray, steps: int) -> np.ndarray:
    """statsmodels' ARIMA(5,1,0) forecast means of each row of `buckets`, one at a time."""
    from gpuscaler.core.forecast import StatsmodelsArima

    return StatsmodelsArima((5, 1, 0)).forecast(buckets, steps, 0.7)[0]


def realistic_series(n: int, points: int, seed: int) -> np.ndarray:
    """GPU utilization (%) at 500 ms: a slow daily-like swing, bursts, noise, idle
    stretches and NaN gaps, with per-series parameters."""
    rng = np.random.default_rng(seed)
    t = np.arange(points) * STEP
    phase = rng.uniform(0, 2 * np.pi, (n, 1))
    period = rng.uniform(2, 8, (n, 1)) * 3600  # part of a daily cycle inside the hour
    base = rng.uniform(20, 70, (n, 1)) + rng.uniform(5, 25, (n, 1)) * np.sin(
        2 * np.pi * t / period + phase
    )
    # Load wanders: a smoothed random walk at the 10 s scale.
    walk = np.cumsum(rng.normal(0, 0.6, (n, points // 20)), axis=1).repeat(20, axis=1)
    util = base + walk
    # Bursts: 2-6 per hour, 10-90 s long, +15..40 points.
    for i in range(n):
        for _ in range(rng.integers(2, 7)):
            start = rng.integers(0, points)
            util[i, start : start + rng.integers(20, 180)] += rng.uniform(15, 40)
    util += rng.normal(0, rng.uniform(1, 6, (n, 1)), (n, points))  # sampling noise
    # Idle stretches on a fifth of the series: 2-10 minutes near zero.
    for i in rng.choice(n, n // 5, replace=False):
        start = rng.integers(0, points - 240)
        util[i, start : start + rng.integers(240, 1200)] = rng.uniform(0, 2)
    util = np.clip(util, 0, 100)
    # Gaps: missed scrapes (0.5 %) and a 10-60 s outage on a tenth of the series.
    util[rng.random((n, points)) < 0.005] = np.nan
    for i in rng.choice(n, n // 10, replace=False):
        start = rng.integers(0, points - HELD_OUT - 120)
        util[i, start : start + rng.integers(20, 120)] = np.nan
    return util


def bucket_means(values: np.ndarray, per: int) -> np.ndarray:
    """Means of `per` consecutive samples, aligned on the newest sample."""
    usable = values.shape[1] // per * per
    block = values[:, values.shape[1] - usable :].reshape(values.shape[0], -1, per)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        means: np.ndarray = np.nanmean(block, axis=2)
        return means


def cpu_seconds(f: Callable[..., np.ndarray], *args: object) -> tuple[np.ndarray, float]:
    """`f(*args)` and the CPU seconds this process spent in it."""
    began = time.process_time()
    out = f(*args)
    return out, time.process_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=30, help="series statsmodels fits")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    import statsmodels.tsa.arima.model  # noqa: F401  # loads scipy's BLAS: the limit reaches it
    from threadpoolctl import threadpool_limits

    data = realistic_series(N_SERIES, POINTS, args.seed)
    history, held_out = data[:, :-HELD_OUT], data[:, -HELD_OUT:]
    now = NOW - HELD_OUT * STEP
    per = 20  # 10 s buckets of 500 ms samples, as gpuscaler fits
    buckets = bucket_means(history, per)
    actual = bucket_means(held_out, per)
    steps = actual.shape[1]
    sample = np.sort(np.random.default_rng(args.seed + 1).choice(N_SERIES, args.sample, False))

    with threadpool_limits(limits=1):
        _forecast(history[:8], now)  # imports and first calls outside the timing
        ours, theirs = [], []
        for r in range(args.rounds):
            means, cpu = cpu_seconds(_forecast, history, now)
            ours.append(cpu / N_SERIES)
            reference, cpu = cpu_seconds(_reference, buckets[sample], steps)
            theirs.append(cpu / args.sample)
            print(
                f"round {r}: gpuscaler {ours[-1] * 1000:.3f} CPU-ms a series, statsmodels "
                f"{theirs[-1] * 1000:.1f}: {theirs[-1] / ours[-1]:.1f}x",
                flush=True,
            )
    ratio = statistics.median(t / o for t, o in zip(theirs, ours, strict=True))
    mae = float(np.nanmean(np.abs(means[sample, :steps] - actual[sample])))
    mae_reference = float(np.nanmean(np.abs(reference - actual[sample])))
    print(
        f"{N_SERIES} series x {POINTS} points at {STEP * 1000:.0f} ms, the last {HELD_OUT} "
        f"held out; statsmodels on a sample of {args.sample}; held-out MAE on the sample: "
        f"gpuscaler {mae:.3f}, statsmodels {mae_reference:.3f}"
    )
    print(
        f"RESULT ratio={ratio:.1f} gate={'pass' if ratio >= GATE else 'fail'} "
        f"gpuscaler_cpu_ms_per_series={statistics.median(ours) * 1000:.3f} "
        f"statsmodels_cpu_ms_per_series={statistics.median(theirs) * 1000:.1f} "
        f"mae_ratio={mae / mae_reference:.4f}"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
