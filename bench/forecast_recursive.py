"""The recursive forecaster (bench/recursive_forecaster.py) against gpuscaler's, in one run:
cost of a steady tick and quality on every shared trace (a study for issue 20).

Cost: at each size (`--sizes`, 50, 1,000 and 10,000 series), 1 h of 10 s buckets per
series (bench/forecast_steady.py's data: bench/forecast.py's generator at 500 ms, averaged
to 10 s). gpuscaler's forecaster fits on a first tick, then `--ticks` steady ticks, each
with one new bucket, are timed as the controller runs them (states carried); the
recursive one is fed the same hour a bucket at a time, then timed on the same steady
ticks. CPU ms of this process per series and tick; BLAS pinned to one thread.

Quality: bench/forecast_quality.py's settings (2024 week-long files at 1 min sums with a
1 h window; 2023 one-hour logs at 10 s counts and sums with a 20 min window), the
origins of `gpuscaler.backtest` (`_origins`: up to `--max-origins` on the 2024 files, 400
on the 2023 ones) and its metrics (`_errors`, `scores`: MAE, relative to the last value,
coverage of the 0.7 interval, peak MAE). gpuscaler's forecaster runs as the backtest runs
it (`_gpuscaler_paths`: states carried from origin to origin, a window of history each);
the recursive one is fed every bucket of the trace from its start and read at the same
origins (it has no window: what it knows is its state). Each trace's origins are cut
into `--windows` consecutive windows (the 2023 hours into 3), each scored on its own.
`--synthetic N` also scores N generated series (bench/forecast.py's generator, 2 h each):
data no constant of the forecaster was chosen on.

Last line: RESULT series_50_ms= series_50_base_ms= series_50_signals_ms= (and 1k, 10k: CPU
ms per series-tick; signals: the recursive one's with its rows made Signal objects)
mae_rel_naive= mae_rel_naive_base= (mean over traces) coverage= coverage_base= (mean over
traces) peak_mae_ratio= (worst trace's recursive / gpuscaler peak MAE) mae_ratio_worst=
windows_lost_2pct= (windows whose MAE is over gpuscaler's by more than 2 %) traces=
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).parent))
from forecast import NOW
from forecast_quality import DATA, SETTINGS, Setting
from forecast_steady import FIT_STEP, POINTS, TICK, buckets
from recursive_forecaster import Floats, Paths, RecursiveForecaster

from gpuscaler.core.model import Forecast, Series, Signal

HORIZON = 300.0


def cost(n: int, ticks: int, seed: int) -> tuple[float, float, float]:
    """CPU ms per series and steady tick: the recursive forecaster's, the same with its
    rows made the controller's Signal objects as `forecast_series` returns them, and
    gpuscaler's."""
    from gpuscaler.config import ForecastConfig
    from gpuscaler.core.forecast import forecast_series
    from gpuscaler.core.model import FitState

    cfg = ForecastConfig()
    data = buckets(n, ticks, seed)
    keys = [f"s{i}" for i in range(n)]
    start = NOW - FIT_STEP * (POINTS - 1)
    series = [Series(start, FIT_STEP, row) for row in data[:, :POINTS]]
    states: dict[str, FitState] = {}
    forecast_series(series, cfg, NOW, keys=keys, prior={}, states=states)
    base = []
    for k in range(1, ticks + 1):
        series = [Series(start + k * TICK, FIT_STEP, row) for row in data[:, k : k + POINTS]]
        kept: dict[str, FitState] = {}
        began = time.process_time()
        forecast_series(series, cfg, NOW + k * TICK, keys=keys, prior=states, states=kept)
        base.append(time.process_time() - began)
        states = kept
    model = RecursiveForecaster(n, round(cfg.horizon / FIT_STEP))
    for j in range(POINTS):
        model.update(data[:, j])
    mine, wrapped = [], []
    for k in range(1, ticks + 1):
        began = time.process_time()
        out = model.update(data[:, POINTS - 1 + k])
        mine.append(time.process_time() - began)
        _signals(out, NOW + k * TICK, data[:, POINTS - 1 + k])
        wrapped.append(time.process_time() - began)
    per = 1000 / n
    return float(np.mean(mine)) * per, float(np.mean(wrapped)) * per, float(np.mean(base)) * per


def _signals(out: Paths, now: float, last: Floats) -> list[Signal]:
    """Each row's forecast as the controller takes it (the peak's offset as its error)."""
    offsets = (out.peak - out.mean.max(axis=1)).tolist()
    return [
        Signal(now, Forecast(now, FIT_STEP, m, lo, hi, 0.7, "recursive", "", v, {}, off))
        for m, lo, hi, v, off in zip(
            out.mean, out.lower, out.upper, last.tolist(), offsets, strict=True
        )
    ]


@dataclass(frozen=True)
class Window:
    trace: str
    part: int
    origins: int
    scores: dict[str, dict[str, float]]  # method -> mae, rel, coverage, peak


def quality(s: Setting, max_origins: int, windows: int) -> list[Window]:
    """Both forecasters on every series of one setting's file, each scored over the whole
    trace (part 0) and each of `windows` consecutive windows of its origins."""
    from gpuscaler.backtest.series import load_series_csv, to_grid

    raw = load_series_csv(DATA / s.file)
    if s.agg == "count":  # the rows counted per bin: one series whatever the column
        raw = {"count": next(iter(raw.values()))}
    tag = f"{s.file.removeprefix('azure_llm_').removesuffix('.csv')}:{s.agg}"
    out = []
    for name, series in raw.items():
        grid = to_grid(name, series, s.resample, s.agg, s.file)
        out += _scored(f"{tag}:{name}"[:30], grid, s.window, s.origins or max_origins, windows)
    return out


def _scored(tag: str, grid: Series, window: float, most: int, windows: int) -> list[Window]:
    from gpuscaler.backtest.evaluate import _errors, _gpuscaler_paths, _origins, scores
    from gpuscaler.config import ForecastConfig

    cfg = ForecastConfig()
    steps, origins, _, hist, actual = _origins(grid, cfg, HORIZON, window, most)
    step = grid.step
    fcfg = cfg.model_copy(
        update={
            "horizon": steps * step,
            "fit_step": step,
            "min_history": step * (sum(cfg.order) + 2),
        }
    )
    g_mean, g_lo, g_hi, g_peak, _ = _gpuscaler_paths(hist, origins, step, fcfg, None)
    r_mean, r_lo, r_hi, r_peak = _recursive_paths(grid.values, origins, steps)
    naive = np.repeat(hist[:, -1:], steps, axis=1)
    paths = {
        "gpuscaler": (g_mean, g_lo, g_hi),
        "recursive": (r_mean, r_lo, r_hi),
        "naive": (naive, naive, naive),
    }
    out = []
    cuts = np.array_split(np.arange(len(origins)), windows)
    for part, rows in enumerate([np.arange(len(origins)), *cuts]):
        sub = {m: (a[rows], lo[rows], hi[rows]) for m, (a, lo, hi) in paths.items()}
        peaks = {"gpuscaler": g_peak[rows], "recursive": r_peak[rows]}
        sc = scores(_errors(sub, peaks, actual[rows], None))
        table = {
            m: {
                "mae": v.mae,
                "rel": v.relative_to_naive,
                "coverage": v.coverage,
                "peak": v.peak_mae,
            }
            for m, v in sc.items()
        }
        out.append(Window(tag, part, len(rows), table))
    return out


def synthetic(n: int, seed: int) -> list[Window]:
    """Both forecasters on `n` series of bench/forecast.py's generator (GPU utilization,
    2 h of 10 s buckets; data no constant was chosen on), 20 min windows, 3 windows each;
    the last row pools them (MAE ratio of the summed MAEs)."""
    data = buckets(n, POINTS, seed + 1)
    out = []
    for i, row in enumerate(data):
        grid = Series(NOW, FIT_STEP, row)
        out += _scored(f"synthetic:{i}", grid, 1200.0, 400, 3)
    whole = [w for w in out if w.part == 0]
    pooled = {
        m: {k: float(np.mean([w.scores[m][k] for w in whole])) for k in whole[0].scores[m]}
        for m in whole[0].scores
    }
    return [*out, Window("synthetic:mean", 0, sum(w.origins for w in whole), pooled)]


def _recursive_paths(
    values: Floats, origins: np.ndarray, steps: int
) -> tuple[Floats, Floats, Floats, Floats]:
    """The recursive forecaster fed every bucket up to the last origin; its mean, lower,
    upper (origins, steps) and peak (origins,) at each origin."""
    model = RecursiveForecaster(1, steps)
    mean, lower, upper = (np.full((len(origins), steps), np.nan) for _ in range(3))
    peak = np.full(len(origins), np.nan)
    at = {int(o): i for i, o in enumerate(origins)}
    for j in range(int(origins[-1]) + 1):
        out = model.update(values[j : j + 1])
        if j in at:
            i = at[j]
            mean[i], lower[i], upper[i], peak[i] = (
                out.mean[0],
                out.lower[0],
                out.upper[0],
                out.peak[0],
            )
    return mean, lower, upper, peak


def _table(rows: list[Window]) -> None:
    print(
        f"{'trace:window':<34}{'origins':>8}  {'mae rec/base':>22}{'ratio':>7}"
        f"{'rel_naive rec/base':>20}{'coverage rec/base':>19}{'peak rec/base':>22}"
    )
    for w in rows:
        r, g = w.scores["recursive"], w.scores["gpuscaler"]
        label = f"{w.trace}:{'all' if w.part == 0 else w.part}"
        print(
            f"{label:<34}{w.origins:>8}  {r['mae']:>11.4g}{g['mae']:>11.4g}"
            f"{r['mae'] / g['mae']:>7.3f}{r['rel']:>10.4f}{g['rel']:>10.4f}"
            f"{r['coverage']:>9.3f}{g['coverage']:>10.3f}{r['peak']:>11.4g}{g['peak']:>11.4g}"
        )
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,1000,10000")
    parser.add_argument("--ticks", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-origins", type=int, default=3000, help="2024 files' origins")
    parser.add_argument("--windows", type=int, default=7, help="windows of the 2024 files")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument(
        "--synthetic", type=int, default=0, help="also score this many generated series (2 h)"
    )
    args = parser.parse_args()
    figures: dict[str, tuple[float, float, float]] = {}
    rows: list[Window] = []
    with threadpool_limits(limits=1):
        for s in SETTINGS:
            new = quality(s, args.max_origins, args.windows if s.origins is None else 3)
            _table([w for w in new if w.part == 0])
            rows += new
        print()
        _table(rows)
        if args.synthetic:
            _table(synthetic(args.synthetic, args.seed))
        for n in [] if args.skip_cost else [int(x) for x in args.sizes.split(",")]:
            mine, wrapped, base = cost(n, args.ticks, args.seed)
            tag = f"{n // 1000}k" if n >= 1000 else str(n)
            figures[tag] = (mine, wrapped, base)
            print(
                f"{n} series: {mine:.4f} ms a series-tick recursive ({wrapped:.4f} with its "
                f"Signal objects), {base:.4f} gpuscaler ({base / mine:.1f}x, {base / wrapped:.1f}x)"
            )
            sys.stdout.flush()
    _result(figures, rows)


def _result(figures: dict[str, tuple[float, float, float]], rows: list[Window]) -> None:
    whole = [w for w in rows if w.part == 0]
    parts = [w for w in rows if w.part > 0]

    def mean(method: str, key: str) -> float:
        return float(np.mean([w.scores[method][key] for w in whole]))

    def ratio(w: Window, key: str) -> float:
        return w.scores["recursive"][key] / w.scores["gpuscaler"][key]

    lost = sum(ratio(w, "mae") > 1.02 for w in parts)
    print(
        "RESULT "
        + "".join(
            f"series_{t}_ms={a:.4f} series_{t}_base_ms={b:.4f} series_{t}_signals_ms={w:.4f} "
            for t, (a, w, b) in figures.items()
        )
        + f"mae_rel_naive={mean('recursive', 'rel'):.4f} "
        f"mae_rel_naive_base={mean('gpuscaler', 'rel'):.4f} "
        f"coverage={mean('recursive', 'coverage'):.4f} "
        f"coverage_base={mean('gpuscaler', 'coverage'):.4f} "
        f"peak_mae_ratio={max(ratio(w, 'peak') for w in whole):.4f} "
        f"mae_ratio_worst={max(ratio(w, 'mae') for w in whole):.4f} "
        f"windows_lost_2pct={lost}/{len(parts)} traces={len(whole)}"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
