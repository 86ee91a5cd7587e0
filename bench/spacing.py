"""Cost of the sample-spacing measurement (gpuscaler/adapters/prometheus/spacing.py) in a tick.

A series not yet found coarse is measured on its window (7,200 points, 1 h at 500 ms)
every RECHECK_EVERY-th read; the amortized cost is that share of a full measurement. A
window is one target's query (four per node pool, one per workload), not one GPU. This
compares, for 1,000 windows (half scraped every 500 ms, half every 15 s, as a 1 s
lookback returns them), measuring all of them with the per-window work the adapter does
in a steady tick anyway, measured in the same run: decoding an incremental fetch (35 s of
points: the 30 s tick plus the 5 s overlap) and writing it into the window.

Last line: RESULT spacing_ms=<measuring all 1,000 windows> baseline_ms=<same>
ratio=<spacing/baseline> amortized_ratio=<ratio / RECHECK_EVERY>
"""

from __future__ import annotations

import logging
import time

import numpy as np

from gpuscaler.adapters.prometheus.spacing import RECHECK_EVERY, SpacingTracker
from gpuscaler.adapters.prometheus.window import Window, decode_matrix

STEP, SIZE, SERIES = 0.5, 7200, 1000


def windows() -> list[np.ndarray]:
    """Times of the points present in each window."""
    fine = np.arange(SIZE) * STEP
    coarse = np.array([k * 15 + j * STEP for k in range(int(SIZE * STEP / 15)) for j in (0, 1)])
    return [fine if i % 2 else coarse for i in range(SERIES)]


def incremental(end: float) -> list[dict[str, object]]:
    points = [[end - 35 + i * STEP, f"{50 + i % 7:.1f}"] for i in range(int(35 / STEP))]
    return [{"metric": {}, "values": points}]


def best_of(runs: int, work: object) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        work()  # type: ignore[operator]
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    logging.disable(logging.WARNING)  # the tracker announces every coarse series
    present = windows()
    values = [np.full(SIZE, np.nan) for _ in present]
    for v, t in zip(values, present, strict=True):
        v[np.round(t / STEP).astype(np.int64)] = 1.0
    tracker = SpacingTracker(STEP)

    def per_tick() -> None:  # what PrometheusSource._fetch does for a window not yet coarse
        coarse = 0
        for v in values:
            at = np.flatnonzero(np.isfinite(v)).astype(np.float64)
            coarse += tracker.observe("s", at * STEP)
            tracker.measured.clear()
            tracker._fine.clear()  # every read measured: the cost before RECHECK_EVERY
        assert coarse == SERIES // 2, coarse  # the coarse half, and only it

    spacing = best_of(5, per_tick)
    end = SIZE * STEP
    answer = incremental(end)
    ws = [Window(step=STEP, size=SIZE) for _ in range(SERIES)]
    for w in ws:
        w.advance(end - 30)

    def baseline() -> None:
        for w in ws:
            times, values, _ = decode_matrix(answer)
            w.advance(end)
            w.write(times, values)

    base = best_of(5, baseline)
    print(
        f"{SERIES} windows of {SIZE} points: spacing measurement {spacing * 1e3:.1f} ms, "
        f"incremental decode + window {base * 1e3:.1f} ms"
    )
    print(
        f"RESULT spacing_ms={spacing * 1e3:.1f} baseline_ms={base * 1e3:.1f} "
        f"ratio={spacing / base:.2f} amortized_ratio={spacing / base / RECHECK_EVERY:.2f}"
    )


if __name__ == "__main__":
    main()
