"""Times a steady tick's scoring between refits (issue 20): the kept scorings refreshed
with the origins completed since (`scored.refresh`) and the smoothing levels at the live
origin, from one fresh tape, as `forecast_series` does every tick.

Rows as the whatif lanes hold them: a window of 360 buckets, a 30-step horizon, half the
rows scored at a refit one bucket after the others' (their origins on the other phase of
the spacing: two groups before fr7), `--new` origins a row (1 or 2), or `--new 3`: 2 and 1
row by row (the lanes' other ticks). `--part live`: the tick's live paths and half widths from
the refreshed scorings (`live_paths`, `half_widths`, rows taken as `assembly` takes
them); `--part assess`: a refit's assessment of every row (`assess`). `--base REV` times
that revision too, alternated in child processes (its keys end in `_base`). CPU time
(process), median of `--reps` calls. Last line `RESULT new=K ms_N=...` (N rows; `ms_PART_N`
for another part).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast.engines import LeastSquaresArima, make_engine
from gpuscaler.core.forecast.ensemble import SesTape, assess
from gpuscaler.core.forecast.scored import half_widths, live_paths, refresh, score

STEP, NOW, POINTS, STEPS = 10.0, 1_700_000_000.0, 360, 30


def inputs(n: int, new: int) -> tuple[object, ...]:
    """A batch of `n` rows' kept scorings, their window and coefficients."""
    rng = np.random.default_rng(11)
    hist = 50 + np.cumsum(rng.normal(0, 1.0, (n, POINTS)), axis=1)
    hist += (rng.random((n, POINTS)) < 0.03) * rng.uniform(5, 20, (n, 1))
    engine = make_engine(ForecastConfig())
    assert isinstance(engine, LeastSquaresArima)
    fitted = engine.fit(hist)
    usable = np.ones(n, dtype=bool)
    a = assess(engine, fitted, hist, STEPS, engine.predict_mean(fitted, hist, STEPS), usable)
    assert a is not None
    first = NOW - STEPS * STEP
    made = score(a, first)
    # spacing 2 buckets: `2 * new` behind gives `new` origins, one more bucket another phase
    behind = [4 - r % 2 if new == 3 else 2 * new + r % 2 for r in range(n)]
    kept = [replace(s, newest=first - b * STEP) for s, b in zip(made, behind, strict=True)]
    return engine, fitted, hist, kept, usable


def tick(args: tuple[object, ...]) -> None:
    engine, fitted, hist, kept, usable = args
    tape = SesTape(hist)  # type: ignore[arg-type]
    refresh(engine, fitted, hist, kept, usable, NOW, STEP, tape)  # type: ignore[arg-type]
    tape.at(POINTS - 1)


def live(args: tuple[object, ...]) -> Callable[[], None]:
    """A tick's live paths and half widths from the refreshed scorings, each tick's rows a
    new list of them (`assembly._from_scored`)."""
    engine, fitted, hist, kept, usable = args
    assert isinstance(engine, LeastSquaresArima) and isinstance(hist, np.ndarray)
    tape = SesTape(hist)
    scored = refresh(engine, fitted, hist, kept, usable, NOW, STEP, tape)  # type: ignore[arg-type]
    smoothed = tape.at(POINTS - 1)
    arima = engine.predict_mean(fitted, hist, STEPS)  # type: ignore[arg-type]
    levels = np.full(len(scored), 0.9)

    # the steps argument before c26c459 (a --base revision's signature)
    with_steps = "steps" in inspect.signature(live_paths).parameters
    paths: Callable[..., object] = live_paths

    def part() -> None:
        rows = list(scored)
        if with_steps:
            paths(hist, rows, arima, usable, STEPS, smoothed)
        else:
            paths(hist, rows, arima, usable, smoothed)
        half_widths(rows, levels)

    return part


def assessed(args: tuple[object, ...]) -> Callable[[], None]:
    """A refit's assessment of every row."""
    engine, fitted, hist, _, usable = args
    assert isinstance(engine, LeastSquaresArima) and isinstance(hist, np.ndarray)
    arima = engine.predict_mean(fitted, hist, STEPS)  # type: ignore[arg-type]

    def part() -> None:
        assess(engine, fitted, hist, STEPS, arima, usable)  # type: ignore[arg-type]

    return part


def refreshed(args: tuple[object, ...]) -> Callable[[], None]:
    """A steady tick's refresh and live tape."""

    def part() -> None:
        tick(args)

    return part


PARTS: dict[str, Callable[[tuple[object, ...]], Callable[[], None]]] = {
    "refresh": refreshed,
    "live": live,
    "assess": assessed,
}


def measure(sizes: list[int], new: int, reps: int, which: str) -> list[str]:
    out = [f"new={new}"]
    for n in sizes:
        args = inputs(n, new)
        call = PARTS[which](args)
        call()
        times = []
        for _ in range(reps):
            start = time.process_time()
            call()
            times.append(time.process_time() - start)
        key = f"ms_{n}" if which == "refresh" else f"ms_{which}_{n}"
        out.append(f"{key}={1000 * statistics.median(times):.3f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="38,200,1100", help="rows in the batch")
    ap.add_argument("--new", type=int, default=1, help="new origins a row (1 or 2; 3: 2 and 1)")
    ap.add_argument("--part", choices=["refresh", "live", "assess"], default="refresh")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--base", help="also time this git revision, alternated")
    ap.add_argument("--rounds", type=int, default=2, help="rounds with --base")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.base:
        sys.path.insert(0, __file__.rsplit("/", 1)[0])
        from revision import alternated, medians

        cmd = [sys.executable, __file__, "--sizes", args.sizes, "--new", str(args.new)]
        cmd += ["--reps", str(args.reps), "--part", args.part]
        out = medians(alternated(args.base, args.rounds, {"base": cmd, "": cmd}))
    else:
        out = measure(sizes, args.new, args.reps, args.part)
    print("RESULT " + " ".join(out))


if __name__ == "__main__":
    main()
