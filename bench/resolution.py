"""Forecast resolution: which bucket width should the forecaster fit on (forecast.fit_step)?

GPU load at 500 ms is derived from the bundled real trace by the simulator's load model
(Poisson arrivals per 500 ms slot x GPU-seconds per request, plus measurement noise). At
origins every 5 minutes the forecaster sees the last hour and forecasts 5 minutes ahead,
fitted on buckets of 0.5, 2, 10, 30 and 60 seconds. Every forecast is scored on the same
target, the 10 s means of the next 5 minutes (what the controller acts on), against the
last 10 s mean carried forward (the naive baseline, on the same origins):
`relative_to_naive` is the forecaster's MAE over the naive one's. CPU seconds a forecast
(`time.process_time`) show what each width costs.

Gate: the default config's fit_step is the best width, or within 1 % of its
relative-to-naive error.

    python bench/resolution.py [--hours 8]

Last line: RESULT best_fit_step= relative_to_naive= default_fit_step=
default_relative_to_naive= cpu_s_per_forecast= gate=pass|fail
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gpuscaler.config import ForecastConfig
from gpuscaler.sim.load import SAMPLE, arrivals_from_trace
from gpuscaler.sim.trace import load_trace

TARGET = 10.0  # seconds: the resolution every forecast is scored at
HORIZON = 300.0
WINDOW = 3600.0


def _forecast(windows: np.ndarray, cfg: ForecastConfig) -> np.ndarray:
    """The forecast mean paths (at cfg.fit_step) of `windows`, rows of 500 ms samples
    ending at the same time: the only call into gpuscaler's forecaster."""
    from gpuscaler.core.forecast import forecast
    from gpuscaler.core.model import Series

    now = (windows.shape[1] - 1) * SAMPLE
    signals, _ = forecast([Series(0.0, SAMPLE, row) for row in windows], cfg, now)
    return np.stack([s.forecast.mean for s in signals if s.forecast])


def to_target(paths: np.ndarray, step: float) -> np.ndarray:
    """Forecast paths on `step` seconds as 10 s means over the horizon."""
    if step <= TARGET:
        per = round(TARGET / step)
        means: np.ndarray = paths.reshape(paths.shape[0], -1, per).mean(axis=2)
        return means
    return np.repeat(paths, round(step / TARGET), axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=8.0)
    parser.add_argument("--start", type=float, default=24.0, help="hours into the trace")
    args = parser.parse_args()
    trace = load_trace()
    start = trace.start + args.start * 3600
    arrivals = arrivals_from_trace(trace, start, args.hours * 3600, seed=3)
    demand = arrivals * 0.06 / SAMPLE  # GPUs' worth of work a 500 ms slot, 0.06 s a request
    rng = np.random.default_rng(4)
    load = 100 * demand + rng.normal(0, 2.0, demand.size)  # % of one GPU, as measured
    per_window, per_horizon = int(WINDOW / SAMPLE), int(HORIZON / SAMPLE)
    per_target = int(TARGET / SAMPLE)
    origins = np.arange(per_window, load.size - per_horizon, int(300 / SAMPLE))
    targets = np.stack(
        [load[o : o + per_horizon].reshape(-1, per_target).mean(axis=1) for o in origins]
    )
    last_10s = np.array([load[o - per_target : o].mean() for o in origins])
    naive_mae = float(np.mean(np.abs(targets - last_10s[:, None])))
    windows = np.stack([load[o - per_window : o] for o in origins])
    print(f"{len(origins)} origins over {args.hours:g} h of derived 500 ms load; target 10 s means")
    print(f"{'fit_step':>9} {'points':>7} {'mae':>8} {'rel_naive':>10} {'cpu_s':>9}")
    results = {}
    for fit_step in (0.5, 2.0, 10.0, 30.0, 60.0):
        cfg = ForecastConfig.model_validate(
            {"fit_step": f"{fit_step}s", "min_history": "10m", "horizon": "5m"}
        )
        began = time.process_time()
        paths = to_target(_forecast(windows, cfg), fit_step)
        cpu = (time.process_time() - began) / len(origins)
        mae = float(np.mean(np.abs(paths - targets)))
        results[fit_step] = (mae / naive_mae, cpu)
        print(
            f"{fit_step:>8g}s {int(WINDOW / fit_step):>7} {mae:>8.2f} {mae / naive_mae:>10.4f} "
            f"{cpu:>9.4f}"
        )
    best = min(results, key=lambda k: results[k][0])
    default = float(ForecastConfig().fit_step)
    ok = results[default][0] <= results[best][0] * 1.01
    print(
        f"RESULT best_fit_step={best:g} relative_to_naive={results[best][0]:.4f} "
        f"default_fit_step={default:g} default_relative_to_naive={results[default][0]:.4f} "
        f"cpu_s_per_forecast={results[default][1]:.4f} gate={'pass' if ok else 'fail'}"
    )


if __name__ == "__main__":
    main()
