"""Forecast engine benchmark: the production forecaster on 1,000 GPU series x 7,200
points (1 h at 500 ms) against the statsmodels ARIMA reference, in one run.

Measures
- the production path (`forecast_series`: 10 s buckets, batched least-squares ARIMA,
  ensemble and interval) for the whole batch: wall time, and peak RSS of a fresh process
  that does only that;
- statsmodels `ARIMA(order).fit()` + forecast on a sample of the same series, one at a
  time, on the same 10 s buckets (same input, same model class), scaled per series; and,
  for reference, on the raw 500 ms points (the seed's approach);
- MAE of each on the held-out last 5 minutes (bucket means).

Last line: RESULT speedup=<per-series ratio> batch_seconds=<s> mae_ratio=<fast/statsmodels>
rss_mb=<MB> ms_per_series=<wall ms> cpu_ms_per_series=<CPU ms of the measured process>
best_ms_per_series=<wall ms, best of REPEATS runs> best_cpu_ms_per_series=<CPU ms, best>
(the gate: under 1 ms per series at 7,200 points; BLAS pinned to one thread)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
import warnings
from queue import Empty

import numpy as np

N_SERIES = 1000
POINTS = 7200  # 1 h at 500 ms
STEP = 0.5
HELD_OUT = 600  # the last 5 minutes
REPEATS = 3
"""The measured batch runs this often; the first run is reported as before, and the best
of the runs too (other jobs' turns on a shared machine only ever add time)."""
NOW = 1_700_000_000.0


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
    usable = values.shape[1] // per * per
    block = values[:, values.shape[1] - usable :].reshape(values.shape[0], -1, per)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        means: np.ndarray = np.nanmean(block, axis=2)
        return means


def _fast_batch(path: str, queue: mp.Queue) -> None:  # type: ignore[type-arg]
    """In a fresh process: load the series, forecast the whole batch, report time and peak
    RSS (imports + the 1,000 x 7,200 input + the forecast's own memory)."""
    from threadpoolctl import threadpool_limits

    from gpuscaler.config import ForecastConfig
    from gpuscaler.core.forecast import forecast_series
    from gpuscaler.core.model import Series

    threadpool_limits(limits=1)
    data = np.load(path)[:, :-HELD_OUT]
    cfg = ForecastConfig()
    origin = NOW - HELD_OUT * STEP
    series = [Series(origin - STEP * (data.shape[1] - 1), STEP, row) for row in data]
    forecast_series(series[:8], cfg, origin)  # warm imports and caches outside the timing
    runs = []
    for _ in range(REPEATS):  # the same stateless batch: the first run, and the best
        started, cpu_started = time.perf_counter(), time.process_time()
        signals = forecast_series(series, cfg, origin, clip=(0.0, 100.0))
        runs.append((time.perf_counter() - started, time.process_time() - cpu_started))
        if len(runs) == 1:
            rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    means = np.array([s.forecast.mean if s.forecast else np.full(30, np.nan) for s in signals])
    best = (min(w for w, _ in runs), min(c for _, c in runs))
    queue.put((*runs[0], rss_mb, means, best))


def statsmodels_loop(
    histories: np.ndarray, steps: int, order: tuple[int, int, int]
) -> tuple[np.ndarray, float]:
    from statsmodels.tsa.arima.model import ARIMA

    out = np.full((histories.shape[0], steps), np.nan)
    started = time.perf_counter()
    for i, row in enumerate(histories):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = ARIMA(row, order=order).fit()
            out[i] = result.get_forecast(steps).predicted_mean
    return out, (time.perf_counter() - started) / histories.shape[0]


def main() -> None:
    import statsmodels.tsa.arima.model  # noqa: F401  # loads scipy's BLAS: the limit reaches it
    from threadpoolctl import threadpool_limits

    # One BLAS thread: with multithreaded BLAS on 2 shared cores statsmodels is 10-20x
    # slower, which would flatter the speedup.
    with threadpool_limits(limits=1):
        _main()


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=30, help="series for statsmodels")
    parser.add_argument(
        "--raw-sample", type=int, default=5, help="series for statsmodels at 500 ms"
    )
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    from gpuscaler.config import ForecastConfig
    from gpuscaler.core.forecast import LeastSquaresArima

    cfg = ForecastConfig()
    per = round(cfg.fit_step / STEP)
    steps = HELD_OUT // per

    data = realistic_series(N_SERIES, POINTS, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "series.npy")
        np.save(path, data)
        ctx = mp.get_context("spawn")
        queue: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
        proc = ctx.Process(target=_fast_batch, args=(path, queue))
        proc.start()
        while True:
            try:
                batch_seconds, cpu_seconds, rss_mb, fast_means, best = queue.get(timeout=1)
                break
            except Empty:
                if not proc.is_alive():
                    sys.exit(f"the measured process died (exit code {proc.exitcode})")
        proc.join(timeout=60)

    history, held_out = data[:, :-HELD_OUT], data[:, -HELD_OUT:]
    actual = bucket_means(held_out, per)
    buckets = bucket_means(history, per)

    rng = np.random.default_rng(args.seed + 1)
    sample = np.sort(rng.choice(N_SERIES, args.sample, replace=False))
    sm_means, sm_per_series = statsmodels_loop(buckets[sample], steps, cfg.order)
    raw = sample[: args.raw_sample]
    _, sm_raw_per_series = statsmodels_loop(history[raw], HELD_OUT, cfg.order)

    engine = LeastSquaresArima(cfg.order[0], cfg.order[1])
    started = time.perf_counter()
    ls_means = engine.forecast(buckets, steps, cfg.interval_level).mean
    engine_seconds = time.perf_counter() - started

    def mae(pred: np.ndarray, rows: np.ndarray) -> float:
        return float(np.nanmean(np.abs(pred - actual[rows])))

    fast_per_series = batch_seconds / N_SERIES
    fast_mae = mae(fast_means[sample], sample)
    sm_mae = mae(sm_means, sample)
    ls_mae = mae(ls_means[sample], sample)
    print(
        f"series: {N_SERIES} x {POINTS} points at {STEP * 1000:.0f} ms, {HELD_OUT} held out; "
        f"fit on {cfg.fit_step:g}s buckets ({buckets.shape[1]} points), horizon {steps} steps"
    )
    print(
        f"production forecaster (ensemble, batched): {batch_seconds:.3f} s for the batch, "
        f"{fast_per_series * 1000:.3f} ms/series ({cpu_seconds / N_SERIES * 1000:.3f} ms of "
        f"CPU: the wall time counts other processes' turns on a shared machine), "
        f"peak RSS {rss_mb:.0f} MB"
    )
    print(f"least-squares ARIMA{cfg.order} engine alone: {engine_seconds:.3f} s for the batch")
    print(
        f"statsmodels ARIMA{cfg.order} on the same buckets: {sm_per_series * 1000:.1f} ms/series "
        f"(sample of {args.sample})"
    )
    print(
        f"statsmodels ARIMA{cfg.order} on raw 500 ms points: "
        f"{sm_raw_per_series * 1000:.1f} ms/series "
        f"(sample of {len(raw)}; the seed's approach)"
    )
    print(
        f"held-out MAE on the sample: production {fast_mae:.3f}, "
        f"least-squares engine {ls_mae:.3f}, "
        f"statsmodels {sm_mae:.3f} (engine/statsmodels {ls_mae / sm_mae:.4f})"
    )
    print(
        f"RESULT speedup={sm_per_series / fast_per_series:.1f} batch_seconds={batch_seconds:.3f} "
        f"mae_ratio={fast_mae / sm_mae:.4f} rss_mb={rss_mb:.0f} "
        f"ms_per_series={fast_per_series * 1000:.3f} "
        f"cpu_ms_per_series={cpu_seconds / N_SERIES * 1000:.3f} "
        f"best_ms_per_series={best[0] / N_SERIES * 1000:.3f} "
        f"best_cpu_ms_per_series={best[1] / N_SERIES * 1000:.3f}"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
