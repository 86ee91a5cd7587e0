"""The simulator's parts rewritten for speed give what the code before them gave, bit for
bit (the old code is kept in tests/sim_reference.py)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import sim_reference as old

from gpuscaler.config import ReplicasConfig
from gpuscaler.core.model import Series
from gpuscaler.sim.around import actual_counts
from gpuscaler.sim.pods import Pods, PodTable
from gpuscaler.sim.scalers import bounded, bounded_one, desired_one, desired_replicas
from gpuscaler.sim.ticks import control_ticks


@pytest.mark.parametrize(
    ("start", "seconds", "interval"),
    [
        (0.0, 150.0, 30.0),  # the end a tick
        (0.0, 149.9, 30.0),  # the end between ticks
        (1_700_000_000.1, 7 * 86400.0, 30.0),  # a week from an epoch time: sums drift
        (12.5, 3600.0, 0.7),  # an interval with no exact binary form
        (0.0, 10.0, 30.0),  # shorter than one interval: no tick
    ],
)
def test_the_control_ticks_are_the_floats_the_loops_stepped(
    start: float, seconds: float, interval: float
) -> None:
    assert control_ticks(start, seconds, interval) == old.while_ticks(
        start, interval, start + seconds
    )


def _series(rng: np.random.Generator, n: int, start: float, step: float) -> Series:
    values = rng.integers(0, 12, n).astype(np.float64) + rng.choice([0.0, 0.5, 0.49, 0.51], n)
    values[rng.random(n) < 0.15] = np.nan
    return Series(start, step, values)


@pytest.mark.parametrize("seed", range(6))
def test_the_replicas_that_ran_are_the_counts_read_tick_by_tick(seed: int) -> None:
    rng = np.random.default_rng(seed)
    start = float(rng.choice([-600.0, 0.0, 37.5, 1_700_000_000.0]))
    step = float(rng.choice([15.0, 30.0, 60.0, 45.3]))
    series = _series(rng, int(rng.integers(1, 400)), start, step)
    begin = start + float(rng.uniform(-900.0, 900.0))
    ticks = control_ticks(begin, float(rng.uniform(0.0, 20_000.0)), 30.0)
    got, want = actual_counts(series, ticks), old.actual_counts(series, ticks)
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


def test_a_series_with_no_count_read_is_refused_as_before() -> None:
    series = Series(0.0, 60.0, np.full(4, np.nan))
    with pytest.raises(ValueError):
        old.actual_counts(series, [30.0])
    with pytest.raises(ValueError):
        actual_counts(series, [30.0])


def _changes(rng: np.random.Generator, runs: int, steps: int) -> list[np.ndarray]:
    """Replica counts a tick of each run: up and down, some ticks unchanged."""
    counts = [rng.integers(1, 4, runs)]
    for _ in range(steps):
        step = rng.integers(-3, 5, runs) * (rng.random(runs) < 0.5)
        counts.append(np.maximum(1, counts[-1] + step))
    return counts


@pytest.mark.parametrize("seed", range(5))
def test_the_pod_table_changes_every_run_at_once_as_its_pods_change_one_by_one(
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    runs, steps, tick = 7, 120, 30.0
    ticks = _changes(rng, runs, steps)
    alone = [Pods.running(int(n), 0.0) for n in ticks[0]]
    table = PodTable([Pods.running(int(n), 0.0) for n in ticks[0]])
    draws = rng.uniform(5.0, 70.0, 10_000)
    drawn = 0
    for k in range(1, steps + 1):
        now, at = k * tick, k * tick + 2.0
        seen = now - 0.5  # counted up to the last sample before the tick
        table.count(seen - tick + 0.5, seen, partial(np.array, [seen]))
        before, after = ticks[k - 1], ticks[k]
        drain = rng.uniform(0.0, 40.0, runs)
        up, down = np.flatnonzero(after > before), np.flatnonzero(after < before)
        more = after[up] - before[up]
        cold = draws[drawn : drawn + int(more.sum())]
        drawn += int(more.sum())
        for i, run in enumerate(up.tolist()):
            alone[run].add(at, cold[int(more[:i].sum()) : int(more[: i + 1].sum())])
        for r in down.tolist():
            alone[r].remove_newest(int(after[r]), at, float(drain[r]))
        for r in np.concatenate((up, down)).tolist():
            alone[r].forget_gone(seen)
        table.scale(at, (up, more, cold), (down, after[down], drain[down]))
        times = np.arange(seen + 0.5, seen + 3 * tick, 0.5)
        ready, held = table.counts(times, np.arange(runs))
        for r in range(runs):
            want_ready, want_held = alone[r].counts(times)
            assert np.array_equal(ready[r], want_ready) and np.array_equal(held[r], want_held)
            assert table.ready_at(now + 1.0)[r] == alone[r].ready_count(now + 1.0)
            events = np.concatenate((alone[r].created, alone[r].ready, alone[r].leave))
            later = events[events > seen]
            assert table.next_event[r] == (later.min() if later.size else np.inf)
    assert table.created.shape[1] < 4 * max(len(p.created) for p in alone) + 16  # compacted


def test_the_cold_starts_of_one_stream_are_those_drawn_in_turns() -> None:
    whole = np.random.default_rng(9).uniform(30.0, 90.0, 40)
    turns = np.random.default_rng(9)
    parts = [turns.uniform(30.0, 90.0, k) for k in (1, 3, 7, 2, 11, 16)]
    assert np.concatenate(parts).tolist() == whole.tolist()


@pytest.mark.parametrize("seed", range(4))
def test_one_runs_desired_replicas_in_python_are_numpys(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(3000):
        share = float(rng.choice([1.0, 0.5, 0.25, 1 / 3, 1 / 7]))
        target = float(rng.choice([35.0, 60.0, 70.0, 82.5, 0.0]))
        current, ready = int(rng.integers(0, 30)), int(rng.integers(0, 30))
        if rng.random() < 0.5:
            ready = current
        # loads at the tolerance's edges and at whole replicas, and no load at all
        edge = share * max(ready, 1) * target * float(rng.choice([0.9, 1.1, 1.0, 0.3, 2.7]))
        load = float(rng.choice([edge, edge * (1 + 1e-16), rng.uniform(0, 800), np.nan, 0.0]))
        tol = float(rng.choice([0.1, 0.0, 0.3]))
        with np.errstate(divide="ignore", invalid="ignore"):
            want = int(desired_replicas(load, share, current, ready, target, tol))
            assert desired_one(load, share, current, ready, target, tol) == want


def test_one_runs_bounds_in_python_are_numpys() -> None:
    cfg = ReplicasConfig(min_replicas=2, max_replicas=12)
    for desired in range(-3, 40):
        for current in range(0, 16):
            want = int(bounded(desired, current, cfg))
            assert bounded_one(desired, current, cfg) == want
