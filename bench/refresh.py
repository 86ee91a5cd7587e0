"""Times a steady tick's scoring between refits (issue 20): the kept scorings refreshed
with the origins completed since (`scored.refresh`) and the smoothing levels at the live
origin, from one fresh tape, as `forecast_series` does every tick.

Rows as the whatif lanes hold them: a window of 360 buckets, a 30-step horizon, half the
rows scored at a refit one bucket after the others' (their origins on the other phase of
the spacing: two groups before fr7), `--new` origins a row (1 or 2), or `--new 3`: 2 and 1
row by row (the lanes' other ticks). `--base REV` times that revision too, alternated in
child processes (its keys end in `_base`). CPU time (process), median of `--reps` calls.
Last line `RESULT new=K ms_N=...` (N rows).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace

import numpy as np

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast.engines import LeastSquaresArima, make_engine
from gpuscaler.core.forecast.ensemble import SesTape, assess
from gpuscaler.core.forecast.scored import refresh, score

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


def measure(sizes: list[int], new: int, reps: int) -> list[str]:
    out = [f"new={new}"]
    for n in sizes:
        args = inputs(n, new)
        tick(args)
        times = []
        for _ in range(reps):
            start = time.process_time()
            tick(args)
            times.append(time.process_time() - start)
        out.append(f"ms_{n}={1000 * statistics.median(times):.3f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="38,200,1100", help="rows in the batch")
    ap.add_argument("--new", type=int, default=1, help="new origins a row (1 or 2; 3: 2 and 1)")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--base", help="also time this git revision, alternated")
    ap.add_argument("--rounds", type=int, default=2, help="rounds with --base")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.base:
        sys.path.insert(0, __file__.rsplit("/", 1)[0])
        from revision import alternated, medians

        cmd = [sys.executable, __file__, "--sizes", args.sizes, "--new", str(args.new)]
        cmd += ["--reps", str(args.reps)]
        out = medians(alternated(args.base, args.rounds, {"base": cmd, "": cmd}))
    else:
        out = measure(sizes, args.new, args.reps)
    print("RESULT " + " ".join(out))


if __name__ == "__main__":
    main()
