"""How `gpuscaler whatif` splits its replay across processes and lockstep lanes: within the
run's memory (`--memory`), one process a core as the memory holds, lanes within what the
processes leave, chunks that end together."""

from __future__ import annotations

import math
import os
from typing import TextIO

from gpuscaler.adapters.prometheus.history import READERS
from gpuscaler.config import Config, WorkloadConfig

LANES = 50
"""Workloads a process replays in lockstep through one controller at most (by default):
the batched forecast costs less a workload with more lanes; memory grows by about
LANE_BYTES plus LANE_BYTES_A_WEEK a lane-week, so fewer when MEMORY would not hold them."""
LANE_BYTES = 2 * 2**20
LANE_BYTES_A_WEEK = 3 * 2**20
"""What a lane adds to a process' peak: LANE_BYTES whatever the range (the controller's
state for it, bounded by its windows) and LANE_BYTES_A_WEEK a week of it: while its
lockstep runs, its simulated run's per-slot records (served work, GPUs held, capacity,
demand, replicas), its arrivals and the replicas read, and its forecast track; once the
lockstep ends its runs are released (`simulate.release`) and the sweep of the runs
around them takes their place (its group budget: what they held, `replay.freed`)."""
MEMORY = 2**30
"""The whole run's memory by default (`--memory`): 1 GB for whatif and its worker
processes together. The workers and their lanes are sized within it: the parent's own
PARENT_BYTES, each worker's own WORKER_BYTES, what is left for the lanes."""
PARENT_BYTES = 100 * 2**20
"""The whatif process' own peak: the interpreter, numpy, the config and the reports."""
WORKER_BYTES = 206 * 2**20
"""A worker's own peak beside its lanes: numpy and the forecast, plus its chunk's sweep,
one group of `around.MANY_BYTES` at a time."""
MIN_LANES = 10
"""A process is worth its WORKER_BYTES only with this many lanes of memory: fewer lanes
cost more a lane-tick."""


def lane_bytes(seconds: float) -> float:
    """What a lane of a `seconds` replay adds to its process' peak."""
    return LANE_BYTES + LANE_BYTES_A_WEEK * max(seconds, 1.0) / (7 * 86400.0)


def default_jobs(memory: float = MEMORY, seconds: float = 7 * 86400.0) -> int:
    """Processes by default: one a core this process may run on, as many as `memory` holds
    with MIN_LANES lanes each of a `seconds` replay (2 cores and 1 GB: 2), at least one."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    fit = (memory - PARENT_BYTES) // _worker_bytes(seconds)
    return max(1, min(cores, int(fit)))


def _worker_bytes(seconds: float) -> float:
    """A worker's own peak with MIN_LANES lanes of a `seconds` replay: the least a process
    is worth (`default_jobs`, `over_budget`)."""
    return WORKER_BYTES + MIN_LANES * lane_bytes(seconds)


def lanes_within(memory: float, jobs: int, seconds: float) -> int:
    """Lanes a process may hold so that the parent and `jobs` workers with their lanes of a
    `seconds` replay stay within `memory` bytes, at least one; MIN_LANES when `jobs`
    workers do not fit with them (`over_budget` says so): more processes than the memory
    holds would otherwise tick each workload alone."""
    jobs = max(1, jobs)
    if over_budget(memory, jobs, seconds):
        return MIN_LANES
    room = memory - PARENT_BYTES - jobs * WORKER_BYTES
    return max(1, int(room // (jobs * lane_bytes(seconds))))


def over_budget(memory: float, jobs: int, seconds: float) -> bool:
    """Whether `jobs` workers of MIN_LANES lanes each pass `memory`."""
    return jobs > 1 and PARENT_BYTES + jobs * _worker_bytes(seconds) > memory


def chunks(workloads: list[WorkloadConfig], jobs: int, lanes: int) -> list[list[WorkloadConfig]]:
    """The workloads in consecutive chunks, one process' lockstep each: at most `lanes` a
    chunk, all of one size (the last one less) that gives each of `jobs` processes as
    many rounds as the fewest chunks need (100 workloads, 2 jobs, 34 lanes: 4 chunks of
    25, two a process, not 34, 34, 32, where one process would run two of 34)."""
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
    """(processes, lanes a process, histories a process reads at once) for a `seconds`
    replay within `memory`: `default_jobs` and `lanes_within` (at most LANES) where not
    given; a `jobs` the memory cannot hold is said on `err`. The processes share
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
