"""How whatif splits its workloads across processes and lockstep lanes by default: one
process a core as the memory holds (two on this machine), lanes within the memory budget,
chunks that end together, the `--memory` sizes."""

from __future__ import annotations

import argparse
import os

import pytest

from gpuscaler.commands.common import memory_size
from gpuscaler.config import WorkloadConfig
from gpuscaler.whatif.sizing import (
    MIN_LANES,
    PARENT_BYTES,
    WORKER_BYTES,
    chunks,
    default_jobs,
    lane_bytes,
    lanes_within,
    over_budget,
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
        (1024, 2, 7.0, 77),  # the default for a week on two cores: LANES a process
        (1024, 1, 7.0, 231),  # (whatif holds at most LANES)
        (1024, 2, 1.0, 180),  # a day's lanes: a seventh of a week's arrays, the same state
        (1024, 2, 14.0, 46),
        (4096, 8, 7.0, 89),
        (1024, 4, 7.0, MIN_LANES),  # more processes than it holds: MIN_LANES each, said
        (200, 1, 7.0, 1),  # one process: never none
    ],
)
def test_lanes_fit_the_parent_and_every_process_with_its_lanes_within_the_memory(
    memory_mb: int, jobs: int, days: float, lanes: int
) -> None:
    got = lanes_within(memory_mb * MB, jobs, days * 86400)
    assert got == lanes
    need = PARENT_BYTES + jobs * (WORKER_BYTES + got * lane_bytes(days * 86400))
    assert (need <= memory_mb * MB) != over_budget(memory_mb * MB, jobs, days * 86400) or got == 1


@pytest.mark.parametrize(
    ("cores", "memory_mb", "days", "jobs"),
    [
        (1, 1024, 7.0, 1),
        (2, 1024, 7.0, 2),  # this machine: as before
        (16, 1024, 7.0, 3),  # 1 GB holds three processes of 10 lane-weeks
        (16, 4096, 7.0, 15),
        (16, 4096, 1.0, 16),  # a day's lanes are smaller: more processes
        (16, 300, 7.0, 1),  # never none
    ],
)
def test_the_default_jobs_are_one_a_core_as_many_as_the_memory_holds(
    monkeypatch: pytest.MonkeyPatch, cores: int, memory_mb: int, days: float, jobs: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(cores)))
    assert default_jobs(memory_mb * MB, days * 86400) == jobs
    if jobs > 1:
        assert not over_budget(memory_mb * MB, jobs, days * 86400)


SIZES = [
    ("1GiB", 2**30), ("512MiB", 2**29), ("2G", 2 * 10**9), ("1.5GB", 15 * 10**8),
    ("abc", "not a size"), ("-1GiB", "not a size"), ("100MiB", "less than 128MiB"), ("0", "less than"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), SIZES)
def test_memory_sizes_are_pydantic_byte_sizes_or_refused_with_what_is_wrong(
    text: str, expected: int | str
) -> None:
    if isinstance(expected, int):
        assert memory_size(text) == expected
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=expected):
            memory_size(text)
