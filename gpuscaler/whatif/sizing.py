"""How `gpuscaler whatif` splits its replay within `--memory`: one process a core as the
memory holds, lanes within what the processes leave, chunks that end together."""

from __future__ import annotations

import math
import os
from typing import TextIO

from gpuscaler.adapters.prometheus.history import READERS
from gpuscaler.config import Config, WorkloadConfig

LANES = 50
"""Most workloads a process replays in lockstep (more lanes: a cheaper batched forecast a
workload), fewer when the memory would not hold them."""
LANE_BYTES = 1 * 2**20
LANE_BYTES_A_WEEK = 2 * 2**20
"""What a lane adds to a process' peak: the controller's state for it, plus a week of its
arrivals, replicas read and forecast track (and per-slot records of the runs drawn);
measured peaks with a margin."""
MEMORY = 2**30
"""The whole run's memory by default (`--memory`), whatif and its workers together."""
PARENT_BYTES = 100 * 2**20
"""The whatif process' own peak: the interpreter, numpy, the config and the reports."""
WORKER_BYTES = 230 * 2**20
"""A worker's own peak beside its lanes: numpy, the forecast, its sweep's runs."""
MIN_LANES = 10
"""The fewest lanes a process is worth its WORKER_BYTES (fewer cost more a lane-tick)."""


def lane_bytes(seconds: float) -> float:
    """What a lane of a `seconds` replay adds to its process' peak."""
    return LANE_BYTES + LANE_BYTES_A_WEEK * max(seconds, 1.0) / (7 * 86400.0)


def default_jobs(memory: float = MEMORY, seconds: float = 7 * 86400.0) -> int:
    """One process a core, as many as `memory` holds with MIN_LANES lanes each (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    fit = (memory - PARENT_BYTES) // _worker_bytes(seconds)
    return max(1, min(cores, int(fit)))


def _worker_bytes(seconds: float) -> float:
    return WORKER_BYTES + MIN_LANES * lane_bytes(seconds)


def lanes_within(memory: float, jobs: int, seconds: float) -> int:
    """Lanes a process may hold for the parent and `jobs` workers to stay within `memory`,
    at least one; MIN_LANES when `jobs` workers do not fit (rather than a lane each)."""
    jobs = max(1, jobs)
    if over_budget(memory, jobs, seconds):
        return MIN_LANES
    room = memory - PARENT_BYTES - jobs * WORKER_BYTES
    return max(1, int(room // (jobs * lane_bytes(seconds))))


def over_budget(memory: float, jobs: int, seconds: float) -> bool:
    """Whether `jobs` workers of MIN_LANES lanes each pass `memory`."""
    return jobs > 1 and PARENT_BYTES + jobs * _worker_bytes(seconds) > memory


def chunks(workloads: list[WorkloadConfig], jobs: int, lanes: int) -> list[list[WorkloadConfig]]:
    """The workloads in consecutive chunks of at most `lanes`, one lockstep each, of one
    size (the last one less) giving each of `jobs` processes the same rounds (100, 2 jobs,
    34 lanes: 25 x 4, not 34, 34, 32)."""
    if not workloads:
        return []
    jobs, lanes = max(1, jobs), max(1, lanes)
    count = math.ceil(len(workloads) / (lanes * jobs)) * jobs
    count = max(1, min(count, len(workloads)))
    per = math.ceil(len(workloads) / count)
    return [workloads[i : i + per] for i in range(0, len(workloads), per)]


def sized(
    config: Config,
    seconds: float,
    memory: float = MEMORY,
    jobs: int | None = None,
    lanes: int | None = None,
    err: TextIO | None = None,
) -> tuple[int, int, int]:
    """(processes, lanes a process, histories a process reads at once) within `memory`
    where not given; a `jobs` the memory cannot hold is said on `err`. The processes share
    `prometheus.max_concurrent_queries`, at most READERS each."""
    jobs = default_jobs(memory, seconds) if jobs is None else jobs
    if lanes is None:
        lanes = min(LANES, lanes_within(memory, jobs, seconds))
        if over_budget(memory, jobs, seconds) and err is not None:
            err.write(
                f"--jobs {jobs}: {jobs} processes of {lanes} lanes need more than --memory "
                f"{memory / 2**20:.0f} MiB (about {WORKER_BYTES // 2**20} MiB a process "
                "and its lanes beside); raise --memory or lower --jobs\n"
            )
    readers = max(1, min(READERS, config.prometheus.max_concurrent_queries // max(1, jobs)))
    return jobs, lanes, readers
