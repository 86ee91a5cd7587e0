"""Leading signals on every shared trace: GPU load forecast from its own history alone,
against the same forecaster with the request rate as a leading signal.

There is no public GPU-utilization trace that goes with a request trace, so GPU load is
DERIVED from the real request traces with this stated model (the request counts are the
demand, exactly as in the traces):

- each request costs GPU-seconds of work: for the 2023 logs `0.05 + 2e-4 x ContextTokens +
  0.02 x GeneratedTokens`, for the 2024 10 s counts (no token counts) a lognormal with
  mean 0.5 and coefficient of variation 1.5 per request, summed per bin (normal
  approximation of the sum);
- the work runs after arrival over a service time: 2023, `1 s + GeneratedTokens / 40`
  tokens per second, spread evenly; 2024, a service-time kernel with mean 20 s;
- the cost per request drifts (a random walk of the mix, +-20 % over hours) and the
  measured utilization gets Gaussian noise of 3 % of its mean level.

So the request rate is an imperfect proxy: the ratio drifts, request sizes vary, and the
load follows arrivals by the service time. Several windows of each trace (4 spans of 6 h
of each 2024 week, at different times of day; the 2023 hours with 2 noise seeds) are each
scored with `gpuscaler.backtest.evaluate.evaluate_series` at 10 s, a 5-minute horizon and a 1 h
(2024) or 20 min (2023) window, in the same run with the demand and without it
(`worst_with_vs_load_only` is the largest ratio of the two MAEs); statsmodels ARIMA(5,1,0)
on the load is the reference (cached like bench/forecast_quality.py's).

    python bench/forecast_leading.py [--origins 150]

Last line: RESULT cases= lead_not_worse= mean_rel_with_demand= mean_rel_load_only=
worst_with_vs_load_only= best_with_vs_load_only= mean_demand_won= coverage_miss_mean=
(lead_not_worse: cases whose MAE with the demand is at most 1 % above load-only.)
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from forecast_quality import CachedReference
from threadpoolctl import threadpool_limits

DATA = Path(os.environ.get("GPUSCALER_TRACES", "/work/shared/data"))
STEP = 10.0
DAY = 8640  # 10 s bins


def _drift(n: int, rng: np.random.Generator) -> np.ndarray:
    """Cost multiplier per bin: a slow random walk of the request mix within +-20 %."""
    walk = np.cumsum(rng.normal(0, 0.004, n))
    return 1.0 + 0.2 * np.tanh(walk)


def _noisy(util: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.clip(util + rng.normal(0, 0.03 * float(np.mean(util)), util.shape), 0, None)


def from_counts(counts: np.ndarray, seed: int) -> np.ndarray:
    """GPU load (percent of one GPU) per 10 s bin from request counts per bin."""
    rng = np.random.default_rng(seed)
    mean, cv = 0.5, 1.5
    work = counts * mean + np.sqrt(counts) * mean * cv * rng.standard_normal(counts.shape)
    work = np.clip(work, 0, None) * _drift(len(counts), rng)
    t = np.arange(0, 12) * STEP + STEP / 2  # service time kernel, mean 20 s
    kernel = np.exp(-t / 20.0)
    kernel /= kernel.sum()
    busy = np.convolve(work, kernel)[: len(work)]
    return _noisy(busy / STEP * 100.0, rng)


def from_requests(frame: pd.DataFrame, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Demand (requests per 10 s bin) and GPU load from a per-request log."""
    rng = np.random.default_rng(seed)
    t = pd.to_datetime(frame["TIMESTAMP"]).astype("int64").to_numpy() / 1e9
    t = t - t.min()
    ctx = frame["ContextTokens"].to_numpy(float)
    gen = frame["GeneratedTokens"].to_numpy(float)
    fine = 0.5
    n_fine = int(np.ceil((t.max() + 600) / fine))
    bins = int(np.ceil(t.max() / STEP)) + 1
    drift = _drift(bins, rng)
    work = (0.05 + 2e-4 * ctx + 0.02 * gen) * drift[(t // STEP).astype(int)]
    dur = 1.0 + gen / 40.0
    rate = np.zeros(n_fine + 1)
    start, end = (t / fine).astype(int), ((t + dur) / fine).astype(int) + 1
    np.add.at(rate, start, work / (end - start))
    np.add.at(rate, end, -work / (end - start))
    busy = np.cumsum(rate)[:n_fine]  # GPU-seconds per fine slot
    per = int(STEP / fine)
    load = busy[: bins * per].reshape(bins, per).sum(axis=1) / STEP * 100.0
    demand = np.bincount((t // STEP).astype(int), minlength=bins).astype(float)
    return demand, _noisy(load, rng)


def cases() -> list[tuple[str, np.ndarray, np.ndarray, float]]:
    """(name, demand, load, window seconds) per trace window."""
    out = []
    for name in ("conversation", "coding"):
        counts = pd.read_csv(DATA / f"azure_llm_2024_{name}_10s.csv")["requests"].to_numpy(float)
        load = from_counts(counts, seed=len(name))
        for day in (1.0, 2.5, 4.0, 5.5):
            lo = int(day * DAY)
            hi = lo + DAY // 4
            out.append((f"2024_{name}@d{day:g}", counts[lo:hi], load[lo:hi], 3600.0))
    for name in ("conv", "code"):
        frame = pd.read_csv(DATA / f"azure_llm_2023_{name}.csv")
        for seed in (1, 2):
            demand, load = from_requests(frame, seed)
            out.append((f"2023_{name}@seed{seed}", demand, load, 1200.0))
    return out


def run_case(demand: np.ndarray, load: np.ndarray, window: float, origins: int, cache: Any) -> Any:
    import gpuscaler.backtest.evaluate as bt_evaluate
    from gpuscaler.config import ForecastConfig
    from gpuscaler.core.model import Series

    cfg = ForecastConfig()
    s, d = Series(0.0, STEP, load), Series(0.0, STEP, demand)
    errors = bt_evaluate.evaluate_series(s, cfg, 300.0, window, origins, reference=cache, demand=d)
    return bt_evaluate.scores(errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--origins", type=int, default=150, help="origins per window")
    parser.add_argument("--cache", default="/tmp/gpuscaler-statsmodels-cache")
    args = parser.parse_args()
    import statsmodels.tsa.arima.model  # noqa: F401  # loads scipy's BLAS: the limit reaches it

    ref = CachedReference((5, 1, 0), Path(args.cache) if args.cache else None)
    print(
        f"{'case':<24}{'with':>9}{'load':>9}{'sm':>9}{'naive':>9}"
        f"{'won':>6}{'cov':>7}{'peak':>9}{'peak_lo':>9}{'peak_sm':>9}"
    )
    ratios, rel_with, rel_load, won, miss = [], [], [], [], []
    with threadpool_limits(limits=1):
        for name, demand, load, window in cases():
            sc = run_case(demand, load, window, args.origins, ref)
            g, lo, sm = sc["gpuscaler"], sc["gpuscaler_load_only"], sc["statsmodels_arima"]
            print(
                f"{name:<24}{g.mae:>9.3f}{lo.mae:>9.3f}{sm.mae:>9.3f}{sc['naive'].mae:>9.3f}"
                f"{g.demand_won:>6.2f}{g.coverage:>7.3f}{g.peak_mae:>9.3f}{lo.peak_mae:>9.3f}"
                f"{sm.peak_mae:>9.3f}",
                flush=True,
            )
            ratios.append(g.mae / lo.mae)
            rel_with.append(g.relative_to_naive)
            rel_load.append(lo.relative_to_naive)
            won.append(g.demand_won)
            miss.append(abs(g.coverage - 0.7))
    print(
        f"RESULT cases={len(ratios)} lead_not_worse={sum(r <= 1.01 for r in ratios)} "
        f"mean_rel_with_demand={np.mean(rel_with):.4f} mean_rel_load_only={np.mean(rel_load):.4f} "
        f"worst_with_vs_load_only={max(ratios):.4f} best_with_vs_load_only={min(ratios):.4f} "
        f"mean_demand_won={np.mean(won):.3f} coverage_miss_mean={np.mean(miss):.4f}"
    )


if __name__ == "__main__":
    main()
