"""`gpuscaler whatif`: each workload's Prometheus history replayed (`whatif.history`) and
reported (`whatif.report`), with one PNG per workload under `--report DIR`."""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import wait
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TextIO, TypeVar

from gpuscaler.adapters.kube.objects import parse_time, rfc3339
from gpuscaler.adapters.prometheus.history import READERS, HistoryReader
from gpuscaler.config import Config, DurationTooLong, WorkloadConfig, parse_duration
from gpuscaler.errors import InputError
from gpuscaler.whatif.history import Skipped, replay_many
from gpuscaler.whatif.progress import Progress, drain, reporters, worker_init
from gpuscaler.whatif.report import Outcome, write
from gpuscaler.whatif.sizing import MEMORY, chunks, sized

T = TypeVar("T")

MAX_RANGE = 14 * 86400.0
"""Longest history replayed: two weeks (the replay's time grows with the range)."""


class WhatifError(InputError):
    """Arguments or history that give no answer; the message says why."""


def parse_when(text: str, now: float, flag: str) -> float:
    """Unix seconds of `now`, a duration ago ("7d"), RFC 3339 or unix seconds."""
    if text == "now":
        return now
    try:
        return now - parse_duration(text)
    except DurationTooLong as e:
        raise WhatifError(f"{flag}: {e}") from None
    except ValueError:
        pass
    try:
        parsed: float | None = float(text)
    except ValueError:
        parsed = parse_time(text)
    if parsed is None or not math.isfinite(parsed):
        raise WhatifError(
            f"{flag} {text!r}: expected 'now', a duration ago such as '7d' or '12h', an RFC "
            "3339 time such as 2026-05-12T00:00:00Z, or unix seconds"
        )
    return parsed


def select(config: Config, names: list[str]) -> list[WorkloadConfig]:
    """The configured workloads named NS/NAME (all of them when none is named)."""
    if not config.workloads:
        raise WhatifError("the config names no workloads: nothing to replay")
    if not names:
        return list(config.workloads)
    chosen: list[WorkloadConfig] = []
    for name in names:
        found = [w for w in config.workloads if f"{w.namespace}/{w.name}" == name]
        if not found:
            known = ", ".join(f"{w.namespace}/{w.name}" for w in config.workloads)
            raise WhatifError(f"--workload {name}: not in the config (configured: {known})")
        chosen.extend(w for w in found if w not in chosen)
    return chosen


@dataclass(frozen=True)
class Job:
    """What every workload's replay shares (picklable: `--jobs` runs them in processes)."""

    config: Config
    since: float
    until: float
    step: float
    seed: int = 1
    baselines: bool = True
    report: Path | None = None
    lanes: int = 1
    readers: int = READERS  # histories a process reads at once


Done = tuple[dict[str, Any] | Skipped, list[dict[str, Any]], Path | None]
"""(the workload's summary or why it was skipped, its decision records, its PNG)."""


def replay_chunk(
    job: Job,
    workloads: list[WorkloadConfig],
    reader: HistoryReader | None = None,
    progress: Callable[[float], None] | None = None,
    chunk: int = 0,
) -> list[Done]:
    """Some workloads' histories read, replayed and drawn; in a worker (no `reader`), its
    progress reported as chunk `chunk`."""
    if reader is None:
        requests, progress = reporters(chunk, len(workloads))
        reader = HistoryReader(job.config, progress=requests)
    span = (job.since - job.step, job.until + job.step, job.step)
    histories = list(zip(reader.workloads(workloads, *span, job.readers), workloads, strict=True))
    out: list[Done] = []
    draw = job.report is not None  # the PNG's series kept only when it is drawn
    given = handed_over(histories)  # each history let go once checked
    replays = replay_many(given, job.config, job.seed, job.baselines, job.lanes, draw, progress)
    for done in replays:
        if isinstance(done, Skipped):
            out.append((done, [], None))
            continue
        png, records = None, []  # the decisions' records are only written to the report
        if job.report is not None:
            decided = done.result.gpuscaler.decisions
            records = [{"workload": done.key, **d.as_record()} for d in decided]
            from gpuscaler.sim.report import plot

            png = job.report / (re.sub(r"[^A-Za-z0-9._-]+", "_", done.key) + ".png")
            plot(done.result, png)
        out.append((done.summary(), records, png))
    return out


def handed_over(items: list[T]) -> Iterator[T]:
    """The items of `items` in order, each taken out of the list as it is handed over."""
    items.reverse()
    while items:
        yield items.pop()


def _results(
    job: Job, workloads: list[WorkloadConfig], jobs: int, reader: HistoryReader, bar: Progress
) -> Iterator[Done]:
    """Each workload's replay, in order, here or in `jobs` processes (progress by queue)."""
    parts = chunks(workloads, jobs, job.lanes)
    if jobs <= 1 or len(parts) <= 1:
        for i, part in enumerate(parts):
            ticked = partial(bar.replayed, i, len(part))
            yield from replay_chunk(job, part, reader, ticked)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")  # no forked copy of a client's threads
    source = context.Queue() if bar.on else None
    with ProcessPoolExecutor(jobs, context, worker_init, (source,)) as pool:
        futures = [pool.submit(replay_chunk, job, p, chunk=i) for i, p in enumerate(parts)]
        for f in futures:
            while not f.done():
                drain(source, bar)
                wait([f], timeout=0.5)
            drain(source, bar)
            yield from f.result()


def run_whatif(
    config: Config,
    since: float,
    until: float,
    workloads: list[WorkloadConfig],
    report: Path | None = None,
    seed: int = 1,
    step: float | None = None,
    baselines: bool = True,
    err: TextIO = sys.stderr,
    jobs: int | None = None,
    lanes: int | None = None,
    memory: float = MEMORY,
) -> Outcome:
    """Read, replay and report every workload within `memory` bytes; raise WhatifError
    when none replays."""
    step = step or config.forecast.fit_step
    jobs, lanes, readers = sized(config, until - since, memory, jobs, lanes, err)
    if not until > since:
        raise WhatifError(f"--since {rfc3339(since)} is not before --until {rfc3339(until)}")
    if until - since > MAX_RANGE:
        raise WhatifError(
            f"range of {(until - since) / 86400:.1f} days: at most "
            f"{MAX_RANGE / 86400:g} days (the replay's time grows with the range)"
        )
    if until > time.time() + step:
        raise WhatifError(f"--until {rfc3339(until)} is in the future: no history there yet")
    bar = Progress(err, len(workloads))
    reader = HistoryReader(config, progress=bar.request)
    reader.probe()
    outcome = Outcome(since, until, step)
    if report is not None:
        report.mkdir(parents=True, exist_ok=True)
    job = Job(config, since, until, step, seed, baselines, report, lanes, readers)
    records: list[dict[str, Any]] = []
    try:
        for w, (done, decisions, png) in zip(
            workloads, _results(job, workloads, jobs, reader, bar), strict=True
        ):
            bar.workload(w.key)
            if isinstance(done, Skipped):
                outcome.skipped.append(done)
                continue
            outcome.summaries.append(done)
            records.extend(decisions)
            if png is not None:
                outcome.files.append(png)
    finally:
        bar.close()
    if report is not None:
        write(report, outcome, records)
    if not outcome.summaries:
        why = "; ".join(f"{s.key}: {s.reason}" for s in outcome.skipped)
        raise WhatifError(
            f"no workload could be replayed from {rfc3339(since)} to {rfc3339(until)}: {why}"
        )
    return outcome
