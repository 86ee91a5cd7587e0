"""How whatif splits its workloads across processes and lockstep lanes by default: one
process a core (at most two), lanes within the memory budget, chunks that end together."""

from __future__ import annotations

import os

import pytest

from gpuscaler.config import WorkloadConfig
from gpuscaler.whatif import (
    JOBS,
    LANE_BYTES,
    LANE_BYTES_A_WEEK,
    chunks,
    default_jobs,
    lanes_within,
)

WEEK = 7 * 86400.0
MB = 2**20


def _workloads(n: int) -> list[WorkloadConfig]:
    return [WorkloadConfig(namespace="bench", kind="ScaledObject", name=f"w{i}") for i in range(n)]


@pytest.mark.parametrize(
    ("n", "jobs", "lanes", "sizes"),
    [
        (100, 2, 34, [25, 25, 25, 25]),  # not 34, 34, 32: two chunks a process
        (100, 2, 50, [50, 50]),
        (100, 1, 50, [50, 50]),
        (100, 1, 34, [34, 34, 32]),
        (4, 2, 50, [2, 2]),  # fewer than lanes: one chunk a process
        (3, 2, 50, [2, 1]),
        (1, 2, 50, [1]),
        (5, 1, 1, [1, 1, 1, 1, 1]),  # lanes 1: each alone
        (7, 3, 2, [2, 2, 2, 1]),
        (0, 2, 50, []),
    ],
)
def test_chunks_hold_at_most_lanes_each_and_share_the_rounds_evenly_among_the_jobs(
    n: int, jobs: int, lanes: int, sizes: list[int]
) -> None:
    workloads = _workloads(n)
    got = chunks(workloads, jobs, lanes)
    assert [len(c) for c in got] == sizes
    assert [w for c in got for w in c] == workloads  # in order, each once
    assert all(len(c) <= lanes for c in got)


@pytest.mark.parametrize(
    ("memory_mb", "jobs", "days", "lanes"),
    [
        (512, 2, 7.0, 40),  # the default for a week on two cores
        (512, 1, 7.0, 81),  # (whatif holds at most LANES)
        (512, 2, 1.0, 98),  # a day's lanes: a seventh of a week's arrays, the same state
        (512, 2, 14.0, 24),
        (10, 2, 7.0, 1),  # never none
    ],
)
def test_lanes_fit_every_process_lanes_within_the_memory(
    memory_mb: int, jobs: int, days: float, lanes: int
) -> None:
    got = lanes_within(memory_mb * MB, jobs, days * 86400)
    assert got == lanes
    if got > 1:
        assert got * jobs * (LANE_BYTES + LANE_BYTES_A_WEEK * days / 7) <= memory_mb * MB


@pytest.mark.parametrize(("cores", "jobs"), [(1, 1), (2, 2), (16, JOBS)])
def test_the_default_jobs_are_one_a_core_at_most_two(
    monkeypatch: pytest.MonkeyPatch, cores: int, jobs: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(cores)))
    assert default_jobs() == jobs
