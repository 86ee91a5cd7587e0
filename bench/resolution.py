"""Which resolution should the forecaster fit on? Evidence for forecast.fit_step.

GPU load at 500 ms is derived from the bundled real trace by the simulator's load model
(Poisson arrivals per 500 ms slot x GPU-seconds per request, plus measurement noise). At
rolling origins every 5 minutes, the production forecaster sees the last hour and forecasts
5 minutes ahead, fitted on buckets of 0.5, 2, 10 and 30 seconds. Every forecast is scored
on the same target, the 10 s means of the next 5 minutes (what the controller acts on),
against the last-value forecast on the same target.

Last line: RESULT best_fit_step=<s> relative_to_naive=<at that step> seconds_per_forecast=<s>
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast import forecast_series
from gpuscaler.core.model import Series
from gpuscaler.sim.load import SAMPLE, demand_from_trace
from gpuscaler.sim.trace import load_trace

TARGET = 10.0  # seconds: the resolution every forecast is scored at
HORIZON = 300.0
WINDOW = 3600.0


def to_target(path: np.ndarray, step: float) -> np.ndarray:
    """A forecast path on `step` seconds as 10 s means over the horizon."""
    if step <= TARGET:
        per = round(TARGET / step)
        means: np.ndarray = path.reshape(-1, per).mean(axis=1)
        return means
    return np.repeat(path, round(step / TARGET))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=8.0)
    parser.add_argument("--start", type=float, default=24.0, help="hours into the trace")
    args = parser.parse_args()
    trace = load_trace()
    start = trace.start + args.start * 3600
    demand = demand_from_trace(trace, start, args.hours * 3600, 0.06, seed=3)
    rng = np.random.default_rng(4)
    load = 100 * demand + rng.normal(0, 2.0, demand.size)  # % of one GPU, as measured
    per_window = int(WINDOW / SAMPLE)
    per_horizon = int(HORIZON / SAMPLE)
    origins = np.arange(per_window, load.size - per_horizon, int(300 / SAMPLE))
    targets = np.stack(
        [load[o : o + per_horizon].reshape(-1, int(TARGET / SAMPLE)).mean(axis=1) for o in origins]
    )
    last_10s = np.array([load[o - int(TARGET / SAMPLE) : o].mean() for o in origins])
    naive_mae = float(np.mean(np.abs(targets - last_10s[:, None])))
    print(f"{len(origins)} origins over {args.hours:g} h of derived 500 ms load; target 10 s means")
    print(f"{'fit_step':>9} {'points':>7} {'mae':>8} {'rel_naive':>10} {'s/forecast':>11}")
    results = []
    for fit_step in (0.5, 2.0, 10.0, 30.0, 60.0):
        cfg = ForecastConfig.model_validate(
            {"fit_step": f"{fit_step}s", "min_history": "10m", "horizon": "5m"}
        )
        series = [Series(start=0.0, step=SAMPLE, values=load[o - per_window : o]) for o in origins]
        now = (per_window - 1) * SAMPLE
        started = time.perf_counter()
        signals = forecast_series(series, cfg, now, clip=(0.0, None))
        seconds = (time.perf_counter() - started) / len(series)
        paths = np.stack([to_target(s.forecast.mean, fit_step) for s in signals if s.forecast])
        mae = float(np.mean(np.abs(paths - targets)))
        results.append((fit_step, mae / naive_mae, seconds))
        print(
            f"{fit_step:>8g}s {int(WINDOW / fit_step):>7} {mae:>8.2f} {mae / naive_mae:>10.4f} "
            f"{seconds:>11.4f}"
        )
    best = min(results, key=lambda r: r[1])
    print(
        f"RESULT best_fit_step={best[0]:g} relative_to_naive={best[1]:.4f} "
        f"seconds_per_forecast={best[2]:.4f}"
    )


if __name__ == "__main__":
    main()
