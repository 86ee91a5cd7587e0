"""`gpuscaler whatif`: what gpuscaler would have done on the user's own cluster.

Reads each workload's history from the configured Prometheus (`adapters/prometheus/history.py`),
replays it through the simulator's model (`sim/replay.py`) and writes the report: a
table of verdicts first, then each workload's figures and limits; with `--report DIR`,
`decisions.jsonl`, `summary.json` and one PNG per workload.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import wait
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO, TypeVar

from gpuscaler.adapters.kube.objects import parse_time, rfc3339
from gpuscaler.adapters.prometheus.history import READERS, HistoryReader
from gpuscaler.config import Config, DurationTooLong, WorkloadConfig, parse_duration
from gpuscaler.errors import InputError
from gpuscaler.sim.replay import Skipped, replay_many
from gpuscaler.whatif_progress import Progress, drain, reporters, worker_init
from gpuscaler.whatif_sizing import MEMORY, chunks, sized

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


@dataclass
class Outcome:
    since: float
    until: float
    step: float
    summaries: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "since": rfc3339(self.since),
            "until": rfc3339(self.until),
            "step_s": self.step,
            "slot_s": self.step,
            "table": [row(s) for s in self.summaries]
            + [
                {"workload": s.key, "verdict": "not enough data", "reason": s.reason}
                for s in self.skipped
            ],
            "workloads": self.summaries,
            "skipped": [{"workload": s.key, "reason": s.reason} for s in self.skipped],
        }


def row(summary: dict[str, Any]) -> dict[str, Any]:
    c = summary["comparison"]
    saved, avoided = c["gpu_hours_saved"], c["violations_avoided"]
    return {
        "workload": summary["workload"],
        "gpu_hours_saved_at_equal_slo": None if saved is None else saved["gpu_hours"],
        "slo_violations_avoided_at_equal_gpu_hours": None if avoided is None else avoided["share"],
        "verdict": c["verdict"],
    }


def _file_name(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", key) + ".png"


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
    readers: int = READERS
    """Histories a process reads at once (`prometheus.max_concurrent_queries` shared by the
    processes, at most READERS each)."""


Done = tuple[dict[str, Any] | Skipped, list[dict[str, Any]], Path | None]
"""(the workload's summary or why it was skipped, its decision records, its PNG)."""


def replay_chunk(
    job: Job,
    workloads: list[WorkloadConfig],
    reader: HistoryReader | None = None,
    progress: Callable[[float], None] | None = None,
    chunk: int = 0,
) -> list[Done]:
    """Read some workloads' histories, replay them (up to `job.lanes` in lockstep) and
    draw their PNGs. In a worker process (no `reader`), its range queries and the share of
    ticks done are reported as chunk `chunk` (`whatif_progress.reporters`)."""
    if reader is None:
        requests, progress = reporters(chunk, len(workloads))
        reader = HistoryReader(job.config, progress=requests)
    read = reader.workloads(
        workloads, job.since - job.step, job.until + job.step, job.step, job.readers
    )
    histories = list(zip(read, workloads, strict=True))
    del read
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

            png = job.report / _file_name(done.key)
            plot(done.result, png)
        out.append((done.summary(), records, png))
    return out


def handed_over(items: list[T]) -> Iterator[T]:
    """The items of `items` in order, each taken out of it as it is handed over (the
    list holds none once the last one is taken)."""
    items.reverse()
    while items:
        yield items.pop()


def _results(
    job: Job, workloads: list[WorkloadConfig], jobs: int, reader: HistoryReader, bar: Progress
) -> Iterator[Done]:
    """Each workload's replay, in order: in this process, or in `jobs` processes (which
    report their progress through a queue while the bar is shown)."""
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
    """Read, replay and report every workload; raise WhatifError when none replays. By
    default `default_jobs(memory)` processes, each with at most LANES lanes and the whole
    run within `memory` bytes."""
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
        _write(report, outcome, records)
    if not outcome.summaries:
        why = "; ".join(f"{s.key}: {s.reason}" for s in outcome.skipped)
        raise WhatifError(
            f"no workload could be replayed from {rfc3339(since)} to {rfc3339(until)}: {why}"
        )
    return outcome


def _write(report: Path, outcome: Outcome, records: list[dict[str, Any]]) -> None:
    path = report / "decisions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    outcome.files.insert(0, path)
    path = report / "summary.json"
    path.write_text(json.dumps(outcome.summary(), indent=2) + "\n", encoding="utf-8")
    outcome.files.append(path)


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:+.3f} pts"


def table_lines(outcome: Outcome) -> list[str]:
    """The verdict table: one row per workload, skipped ones included."""
    head = (
        "workload",
        "GPU-hours saved at equal SLO",
        "SLO violations avoided at equal GPU-h",
        "verdict",
    )
    rows = [head]
    for s in outcome.summaries:
        c = s["comparison"]
        saved, avoided = c["gpu_hours_saved"], c["violations_avoided"]
        saved_text = (
            "-"
            if saved is None
            else (
                f"{saved['gpu_hours']:+.2f} vs {saved['against']}"
                + (" (sweep edge)" if saved["at_sweep_edge"] else "")
            )
        )
        avoided_text = (
            "-" if avoided is None else f"{_pct(avoided['share'])} vs {avoided['against']}"
        )
        rows.append((s["workload"], saved_text, avoided_text, c["verdict"]))
    rows.extend((s.key, "-", "-", "not enough data") for s in outcome.skipped)
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return [" | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]


def text(outcome: Outcome) -> str:
    from gpuscaler.sim.report import table

    lines = [
        f"What-if from {rfc3339(outcome.since)} to {rfc3339(outcome.until)} (history read "
        f"every {outcome.step:g}s and replayed in {outcome.step:g}s slots); each baseline "
        "swept over targets 40..90 %, compared with the best one",
        *table_lines(outcome),
    ]
    for s in outcome.summaries:
        lines += ["", f"== {s['workload']} ==", f"load model: {s['load_model']}", table(s)]
        a = s["actual"]
        if a is not None:
            lines.append(
                f"replicas that ran ({a['source']}): SLO violations "
                f"{100 * a['slo_violation_share']:.3f} %, p99 wait {a['p99_wait_s']:g}s, "
                f"{a['gpu_hours']:g} GPU-hours, {a['scaling_actions']} scaling actions, "
                f"mean replicas {a['mean_replicas']:g}"
            )
        kinds = s["decision_counts"]
        lines.append(
            "decisions gpuscaler would have taken: "
            + (", ".join(f"{n} {k}" for k, n in kinds.items()) or "none")
        )
        lines += [
            f"  {d['kind']} {d['from']} -> {d['to']}: {d['reason']}" for d in s["decision_examples"]
        ]
        lines += [f"limit: {x}" for x in s["limits"]]
    for skip in outcome.skipped:
        lines.append(f"skipped {skip.key}: {skip.reason}")
    return "\n".join(lines)
