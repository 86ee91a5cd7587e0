"""Steady-tick forecast cost: the ensemble scored at every tick (before issue 18) against
its scoring kept from the refit (after), in one run, at 1,000 and 10,000 series.

Each size: 1 h of 10 s buckets per series (the bench/forecast.py generator, 500 ms
samples averaged to the fit step, so the timing is the forecaster's, not the bucketing's).
A first tick fits and scores every series; then `--ticks` steady ticks, each 10 s later
with one new bucket, are timed twice from the same states: with `rescore=True` (every
member scored again at every origin, the old behaviour) and with the kept scoring. Both
see the same windows; the forecasts' means are compared (the kept weights differ from
re-scored ones only by what the new points changed).

Last line: RESULT before_1k_ms= after_1k_ms= speedup_1k= cpu_before_1k_ms=
cpu_after_1k_ms= and the same for 10k (per steady tick, ms for the whole batch, wall and
CPU of this process; BLAS pinned to one thread)
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from forecast import NOW, realistic_series  # the engine bench's generator

FIT_STEP = 10.0
TICK = 10.0
POINTS = 360  # 1 h of 10 s buckets


def buckets(n: int, ticks: int, seed: int) -> np.ndarray:
    """(n, POINTS + ticks) 10 s means of 500 ms series, built 1,000 at a time."""
    per = round(FIT_STEP / 0.5)
    out = []
    for i in range(0, n, 1000):
        raw = realistic_series(min(1000, n - i), (POINTS + ticks) * per, seed + i)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out.append(np.nanmean(raw.reshape(raw.shape[0], -1, per), axis=2))
    return np.concatenate(out)


def run(n: int, ticks: int, seed: int) -> tuple[float, float, float, float, float]:
    """Mean wall ms per steady tick with the scoring redone and kept, the same in CPU ms
    of this process (other jobs' turns on a shared machine do not count), and the largest
    difference between their means relative to the series' range."""
    from gpuscaler.config import ForecastConfig
    from gpuscaler.core.forecast import forecast_series
    from gpuscaler.core.model import FitState, Series

    cfg = ForecastConfig()
    data = buckets(n, ticks, seed)
    keys = [f"s{i}" for i in range(n)]

    def window(k: int) -> tuple[list[Series], float]:
        now = NOW + k * TICK
        rows = data[:, k : k + POINTS]
        start = now - FIT_STEP * (POINTS - 1)
        return [Series(start, FIT_STEP, row) for row in rows], now

    series, now = window(0)
    states: dict[str, FitState] = {}
    forecast_series(series, cfg, now, keys=keys, prior={}, states=states)
    times: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    worst = 0.0
    span = np.nanmax(data, axis=1) - np.nanmin(data, axis=1) + 1e-9
    for k in range(1, ticks + 1):
        series, now = window(k)
        means = {}
        for rescore in (True, False):
            kept: dict[str, FitState] = {}
            started, cpu_started = time.perf_counter(), time.process_time()
            signals = forecast_series(
                series, cfg, now, keys=keys, prior=states, states=kept, rescore=rescore
            )
            times[rescore].append(time.perf_counter() - started)
            cpu[rescore].append(time.process_time() - cpu_started)
            means[rescore] = np.array([s.forecast.mean if s.forecast else np.nan for s in signals])
        diff = np.nanmax(np.abs(means[True] - means[False]).max(axis=1) / span)
        worst = max(worst, float(diff))
        states = kept  # the kept-scoring run's states, as the controller would carry them
    before, after = (float(np.mean(times[x])) * 1000 for x in (True, False))
    cpu_before, cpu_after = (float(np.mean(cpu[x])) * 1000 for x in (True, False))
    return before, after, cpu_before, cpu_after, worst


def main() -> None:
    from threadpoolctl import threadpool_limits

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sizes", default="1000,10000")
    args = parser.parse_args()
    figures = {}
    with threadpool_limits(limits=1):
        for n in (int(x) for x in args.sizes.split(",")):
            before, after, cpu_before, cpu_after, worst = run(n, args.ticks, args.seed)
            tag = f"{n // 1000}k"
            figures[tag] = (before, after, cpu_before, cpu_after)
            print(
                f"{n} series: steady tick {before:.0f} ms scoring every tick, {after:.0f} ms "
                f"with the scoring kept ({before / after:.1f}x; CPU {cpu_before:.0f} against "
                f"{cpu_after:.0f} ms); largest mean difference {worst:.3f} of a series' range"
            )
            sys.stdout.flush()
    print(
        "RESULT "
        + " ".join(
            f"before_{t}_ms={b:.0f} after_{t}_ms={a:.0f} speedup_{t}={b / a:.1f} "
            f"cpu_before_{t}_ms={cb:.0f} cpu_after_{t}_ms={ca:.0f}"
            for t, (b, a, cb, ca) in figures.items()
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
