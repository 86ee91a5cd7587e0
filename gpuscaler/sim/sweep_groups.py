"""A sweep's runs in groups within a memory budget (`gpuscaler.sim.sweep` runs each group):
the fewest groups the budget allows, of even sizes, one group's arrays at a time."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

from gpuscaler.config import Config
from gpuscaler.sim.cluster import SimulatedCluster
from gpuscaler.sim.scalers import IntArray, ScalerKind
from gpuscaler.sim.sweep import RUN_SLOT_BYTES, Sweep
from gpuscaler.sim.swept import SweepResult

SWEEP_BYTES = 256 * 2**20
"""Memory the recorded arrays of one sweep may take (`RUN_SLOT_BYTES` a run a slot): a
longer replay runs its points in groups (a week at 500 ms: 22 a group)."""


def sweep(
    config: Config,
    template: SimulatedCluster,
    runs: Sequence[tuple[ScalerKind, float]],
    seed: int,
    seconds: float,
) -> tuple[list[SweepResult], int]:
    """Every run of `runs` on the template's arrivals from its start for `seconds`, in
    groups within SWEEP_BYTES; and the slots simulated."""
    results: list[SweepResult] = []
    slots = 0
    for _, part, n in sweep_parts(config, template, runs, seed, seconds):
        results, slots = results + part, n
    return results, slots


def group_size(runs: int, slots: int, budget: int | None = None) -> int:
    """Runs a group of a sweep of `runs` runs of `slots` slots within `budget` bytes
    (SWEEP_BYTES): as few groups as fit, of one size (the last one may be smaller)."""
    most = max(1, (SWEEP_BYTES if budget is None else budget) // (RUN_SLOT_BYTES * max(1, slots)))
    groups = max(1, math.ceil(runs / most))
    return max(1, math.ceil(runs / groups))


def sweep_parts(
    config: Config,
    template: SimulatedCluster,
    runs: Sequence[tuple[ScalerKind, float]],
    seed: int,
    seconds: float,
    rows: Sequence[SimulatedCluster] | None = None,
    budget: int | None = None,
    record: Sequence[int] = (),
    replicas: Mapping[int, IntArray] | None = None,
) -> Iterator[tuple[int, list[SweepResult], int]]:
    """`sweep` in groups of runs within `budget` bytes (SWEEP_BYTES), one group at a time:
    (the group's first run, its results, the slots simulated). With `rows`, run i replays
    `rows[i]`'s arrivals (`Sweep`). The fewest groups the budget allows, of even sizes (a
    group's cost is mostly its steps, whatever its runs: a smaller last group saves none,
    even ones hold less at once)."""
    group = group_size(len(runs), len(template.arrivals), budget)
    for i in range(0, len(runs), group):
        part = None if rows is None else rows[i : i + group]
        mine = range(i, i + group)
        kept = [r - i for r in record if r in mine]
        fixed = {r - i: v for r, v in (replicas or {}).items() if r in mine}
        one = Sweep(config, template, runs[i : i + group], seed, part, kept, fixed)
        yield i, one.run(template.start, seconds), one.cursor
        del one  # one group's arrays at a time: let go of these before the next
