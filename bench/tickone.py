"""One grouped controller alone in its own process, against bench/tick.py's Prometheus
(issue 18): the RSS gate's figure, and where a steady tick's wall time goes.

bench/tick.py holds four controllers at once (its variants), so its own peak RSS is not
one controller's. It runs this file as a child once its variants are done: the child
builds the default grouped controller (bench/tick.py's config), runs its first tick
(then waits for the background backfill of the rest of the window) and `--cycles`
steady ticks 30 s apart over the same planted samples, and prints one line
`ONE {json}` with:
- `vmhwm_mb`: the process' peak resident set (VmHWM of /proc/self/status), what a
  controller pod's memory limit meets; `after_first_mb` is the peak after the first tick
  and the backfill;
- per steady tick: the phases of bench/tick.py (`PHASES`), the process' CPU time
  (`cpu`: all its threads), Prometheus' CPU time from /proc/<pid>/stat (`prom_cpu`), the
  CPU every other process of the machine used meanwhile (`others_cpu`: /proc/stat's busy
  time minus both), and the same three for the forecast phase alone (`forecast_cpu`,
  `forecast_prom_cpu`, `forecast_others_cpu`): a phase whose wall time is well above its
  own CPU time waited for a core;
- per steady tick also the garbage collector's collections (`gc_runs`, all
  generations) and their wall time (`gc_s`);
- with `--gzip`, the answers are asked for compressed (the same-run baseline of
  `transport.PLAIN`);
- with `--profile`, cProfile's top functions over the steady ticks (printed before the
  line); with `--tracemalloc`, the largest allocations by line after the last tick.

Alone: `nice -n 10 .venv/bin/python bench/tickone.py --url URL --gpus 10000
--first-now T --cycles 5` against a Prometheus bench/tick.py planted (T its first tick).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tick import CYCLE, PHASES, NoActuator, _time_observe, config, phases_of_tick, time_phases

import gpuscaler.adapters.prometheus.transport as transport_module
import gpuscaler.controller as controller_module
from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.controller import Controller
from gpuscaler.sources import PrometheusSource

TICK = os.sysconf("SC_CLK_TCK")


def prometheus_pid(url: str) -> int | None:
    """The pid of the Prometheus listening at `url` (its --web.listen-address)."""
    wanted = f"--web.listen-address={urlsplit(url).netloc}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if wanted in (entry / "cmdline").read_bytes().split(b"\0"):
                return int(entry.name)
        except OSError:
            continue
    return None


def process_cpu(pid: int | None) -> float:
    """User + system CPU seconds of process `pid` (all its threads), 0 when unknown."""
    if pid is None:
        return 0.0
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)


def machine_busy() -> float:
    """CPU seconds every core of the machine has been busy (not idle nor waiting on I/O)."""
    head = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    jiffies = [int(x) for x in head[:8]]
    return (sum(jiffies) - jiffies[3] - jiffies[4]) / TICK


class Collections:
    """The garbage collector's collections and their wall time, from `gc.callbacks`."""

    def __init__(self) -> None:
        self.runs, self.seconds, self._began = 0, 0.0, 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.runs += 1
            self.seconds += time.perf_counter() - self._began

    def take(self) -> dict[str, float]:
        out = {"gc_runs": float(self.runs), "gc_s": self.seconds}
        self.runs, self.seconds = 0, 0.0
        return out


class Clock:
    """CPU spent by this process, by Prometheus and by the rest of the machine."""

    def __init__(self, prom_pid: int | None):
        self.prom_pid = prom_pid

    def read(self) -> tuple[float, float, float]:
        return time.process_time(), process_cpu(self.prom_pid), machine_busy()

    @staticmethod
    def spent(
        before: tuple[float, float, float], after: tuple[float, float, float]
    ) -> dict[str, float]:
        cpu, prom, busy = (b - a for a, b in zip(before, after, strict=True))
        return {"cpu": cpu, "prom_cpu": prom, "others_cpu": max(0.0, busy - cpu - prom)}


def peak_rss_mb() -> float:
    """VmHWM of this process in MB (ru_maxrss where /proc is not there)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_of_forecast(clock: Clock, spent: dict[str, float]) -> None:
    """`build_snapshot` (the forecast phase) wrapped to add its CPU figures to `spent`."""
    inner: Callable[..., Any] = getattr(controller_module, "build_snapshot")  # noqa: B009

    def timed(*args: Any, **kwargs: Any) -> Any:
        before = clock.read()
        try:
            return inner(*args, **kwargs)
        finally:
            for name, value in Clock.spent(before, clock.read()).items():
                spent[f"forecast_{name}"] += value

    setattr(controller_module, "build_snapshot", timed)  # noqa: B010


def run_one(
    url: str, gpus: int, first_now: float, cycles: int, profile: bool, traced: bool
) -> dict[str, Any]:
    time_phases()
    clock = Clock(prometheus_pid(url))
    forecast = dict.fromkeys(("forecast_cpu", "forecast_prom_cpu", "forecast_others_cpu"), 0.0)
    _cpu_of_forecast(clock, forecast)
    if traced:
        tracemalloc.start(5)
    cfg = config(url, gpus, True)
    source = PrometheusSource(cfg, CurrentState())
    controller = Controller(cfg, source, NoActuator(), dry_run=True, log_decisions=False)
    began = time.perf_counter()
    controller.tick(first_now)
    first = time.perf_counter() - began
    assert source.metrics.backfill.wait(timeout=600)
    after_first = peak_rss_mb()
    _time_observe(source)
    profiler = cProfile.Profile() if profile else None
    rows = []
    collections = Collections()
    for c in range(1, cycles + 1):
        collections.take()
        for name in forecast:
            forecast[name] = 0.0
        before = clock.read()
        if profiler is not None:
            profiler.enable()
        row = phases_of_tick(controller, first_now + c * CYCLE)
        if profiler is not None:
            profiler.disable()
        row.update(Clock.spent(before, clock.read()), **forecast, **collections.take())
        row["queries"] = source.queries_last_tick
        rows.append(row)
    assert source.health.ok
    if profiler is not None:
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(40)
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    if traced:
        for stat in tracemalloc.take_snapshot().statistics("lineno")[:20]:
            print(f"tracemalloc: {stat}")
    return {
        "first": first,
        "after_first_mb": after_first,
        "vmhwm_mb": peak_rss_mb(),
        "prometheus_pid_found": clock.prom_pid is not None,
        "rows": rows,
    }


def alone(
    url: str,
    gpus: int,
    first_now: float,
    cycles: int,
    out: dict[str, float],
    tag: str,
    flags: list[str],
) -> None:
    """The default grouped controller alone in a child process (bench/tickone.py): its
    peak RSS and steady ticks with the CPU each side spent, into `out` under `tag`."""
    child = subprocess.run(
        [
            *(sys.executable, str(Path(__file__).with_name("tickone.py")), "--url", url),
            *("--gpus", str(gpus), "--first-now", f"{first_now}", "--cycles", str(cycles)),
            *flags,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=3600,
    )
    *shown, last = child.stdout.splitlines()
    for line in shown:
        print(f"[{gpus}] {tag}: {line}")
    one = json.loads(last.removeprefix("ONE "))
    rows = one["rows"]
    print(
        f"[{gpus}] {tag}: one controller alone: first tick {one['first']:.2f}s; peak RSS "
        f"{one['vmhwm_mb']:.0f} MB ({one['after_first_mb']:.0f} MB after the first tick "
        f"and the backfill); Prometheus' pid found: {one['prometheus_pid_found']}",
        flush=True,
    )
    for row in rows:
        print(
            f"[{gpus}] {tag}: tick {row['tick']:.3f} s (CPU: ours {row['cpu']:.3f}, "
            f"Prometheus {row['prom_cpu']:.3f}, others {row['others_cpu']:.3f}); forecast "
            f"{row['forecast']:.3f} s (CPU: ours {row['forecast_cpu']:.3f}, Prometheus "
            f"{row['forecast_prom_cpu']:.3f}, others {row['forecast_others_cpu']:.3f}); "
            + ", ".join(f"{n} {row[n]:.3f}" for n in PHASES if n != "forecast")
            + f" s; {row['gc_runs']:.0f} collections {row['gc_s']:.3f} s"
            + f"; queries {row['queries']}",
            flush=True,
        )
    out[f"{tag}_rss_mb"] = one["vmhwm_mb"]
    out[f"{tag}_first"] = one["first"]
    for name, key in (("steady", "tick"), ("cpu", "cpu"), ("prom_cpu", "prom_cpu"), ("gc", "gc_s")):
        out[f"{tag}_{name}"] = statistics.median(r[key] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--first-now", type=float, required=True)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--gzip", action="store_true", help="accept gzipped answers")
    args = parser.parse_args()
    if args.gzip:
        transport_module.PLAIN = {"Accept-Encoding": "gzip, deflate"}
    out = run_one(args.url, args.gpus, args.first_now, args.cycles, args.profile, args.tracemalloc)
    print("ONE " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
