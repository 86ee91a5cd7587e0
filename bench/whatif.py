"""What-if benchmark: a D-day replay of N workloads from a real Prometheus.

Backfills (promtool) N workloads' request rate (10 s samples: the bundled Azure LLM
conversation week, rotated and scaled per workload) and their HPA's replica counts
(kube-state-metrics' `kube_horizontalpodautoscaler_status_current_replicas`, 60 s).
Then, in one run:
- `read`: the backfilled workloads' history over the range, in-process, as whatif reads
  it (two series a workload, request rate and replicas, chunked under the point limit);
- `whatif`: `gpuscaler whatif --jobs J [--lanes L]` in a subprocess on the first
  `--replay` workloads (by default J of them, one per process; pass `--replay 100` for the
  whole gate: about 7 minutes of replay on 2 idle cores at 6bdd6d1, after about 5 of
  backfill and reads), wall time and its peak RSS. It replays in
  slots of its read step (10 s);
- the baseline: `gpuscaler simulate` of workload 0's trace from a CSV, at the same slot,
  for `--baseline-hours` (6 h: the same model without Prometheus);
  `ratio` = whatif seconds per workload-day / simulate's seconds per day.

Last line, when every workload was replayed:
  RESULT workloads=N days=D seconds=S rss_mb=M simulate_s=B ratio=R gate=pass|fail
and when only --replay K of them were (the replay of one workload does not depend on the
others: J at a time), the total is an estimate, whatif's wall time x N/K, and says so
(with lanes, K workloads tick in lockstep in chunks of at most L: the estimate then
holds for chunks of that size, and more lanes a chunk cost less a workload)
(only those K are backfilled: promtool takes many minutes for 100 workload-weeks; read_s,
reading all N one after another in-process, is K's read time x N/K; read_threads_s the
same read READERS workloads at a time, as whatif reads a chunk):
  RESULT workloads=N days=D replayed=K seconds_estimated=S read_s=.. ... gate=fail(estimated)
Gate (issue 20): seconds <= 120 and rss_total_mb (whatif and its worker processes
together, sampled every 0.2 s; rss_mb is the largest process') <= 1 GB; only a full run
can pass it.

`--split` instead times whatif's parts in this process on the read histories (all
--replay workloads in one lockstep), CPU seconds a workload; the reactive, actual and
baseline runs both apart (as before) and in one sweep (`around_s`, as whatif runs them
now; the summaries checked equal); replay_s sums the parts apart, replay_around_s with
`around` in their place:
  RESULT split workloads=K days=D lanes=K per_workload: read_s= read_threads_s= ready_s=
  gpuscaler_s= reactive_s= actual_s= baselines_s= report_s= around_s= replay_s= replay_around_s=
  around_speedup= rss_mb= rss_before_mb= same_summaries=true
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from promserver import binaries, prometheus

from gpuscaler.adapters.prometheus.history import READERS, HistoryReader
from gpuscaler.config import Config, parse_config
from gpuscaler.core.history import WorkloadHistory
from gpuscaler.sim.around import actual_run, around_many, reactive_run, swept_many
from gpuscaler.sim.lockstep import lockstep_runs
from gpuscaler.sim.replay import Ready, WorkloadReplay, finished, ready
from gpuscaler.sim.simulate import finish
from gpuscaler.sim.trace import load_trace

STEP = 10.0
REPLICA_STEP = 60.0
SCRIPT = Path(sys.executable).parent / "gpuscaler"
GATE_SECONDS, GATE_MB = 120.0, 1024.0


def config_text(url: str, workloads: int, slot: str = "500ms") -> str:
    lines = [
        "prometheus:",
        f'  url: "{url}"',
        "  timeout: 60s",
        "  queries:",
        '    workload_requests: "sum(last_over_time(app_requests_per_second'
        '{{{matchers}}}[{lookback}]))"',
        f"simulator: {{preemption_burst_after: null, slot: {slot}}}",
        "node_pools:",
        "  - {name: a100-80gb, selector: {label: nvidia.com/gpu.product, value: A100},",
        "     gpu_memory_gib: 80, workload_type: inference, profile: compute_bound,",
        "     initial_fragments: 2}",
        "workloads:",
    ]
    for i in range(workloads):
        lines.append(
            f"  - {{namespace: bench, kind: ScaledObject, name: w{i:03d}, node_pool: a100-80gb,"
            " overrides: {replicas: {max_replicas: 200}}}"
        )
    return "\n".join(lines) + "\n"


def demand(i: int, base: np.ndarray, points: int) -> np.ndarray:
    """Workload i's requests per second: the trace rotated by i/N of it, scaled."""
    shift = (i * 6047) % len(base)
    rate = np.roll(base, -shift)[:points]
    return np.asarray(rate * (0.5 + (i % 10) / 10), dtype=np.float64)


def backfill_base(points: int) -> np.ndarray:
    """The bundled trace's requests per second, repeated to at least `points`."""
    base = np.nan_to_num(load_trace().counts / STEP)
    return np.resize(base, points) if points > len(base) else base


def kept_blocks(
    keep: Path | None, workloads: int, days: float, start: float
) -> tuple[Path | None, float]:
    """The TSDB blocks kept in `keep` by an earlier run with the same workloads and days,
    and the start of their range; else (None, `start`)."""
    if keep is None or not (stamp := keep / "stamp.json").exists():
        return None, start
    kept = json.loads(stamp.read_text())
    if (kept["workloads"], kept["days"]) != (workloads, days):
        return None, start
    print(f"reusing the blocks in {keep} (backfilled from {kept['start']:.0f})", file=sys.stderr)
    return keep / "blocks", float(kept["start"])


def backfill(data: Path, keep: Path, workloads: int, days: float, start: float) -> Path:
    """promtool's blocks of `data`, made in `keep` (stamped for `kept_blocks`)."""
    blocks = keep / "blocks"
    shutil.rmtree(blocks, ignore_errors=True)
    blocks.mkdir(parents=True)
    tool = binaries()[1]
    cmd = [tool, "tsdb", "create-blocks-from", "openmetrics", str(data), str(blocks)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
    stamp = {"workloads": workloads, "days": days, "start": start}
    (keep / "stamp.json").write_text(json.dumps(stamp))
    return blocks


def write_data(path: Path, start: float, points: int, workloads: int) -> np.ndarray:
    base = backfill_base(points)
    times = start + STEP * np.arange(points)
    every = round(REPLICA_STEP / STEP)
    with path.open("w", encoding="utf-8") as out:
        out.write("# TYPE app_requests_per_second gauge\n")
        for i in range(workloads):
            labels = f'namespace="bench",pod="w{i:03d}-0"'
            rate = demand(i, base, points)
            out.writelines(
                f"app_requests_per_second{{{labels}}} {v:.6g} {t:.0f}\n"
                for t, v in zip(times, rate, strict=True)
            )
        name = "kube_horizontalpodautoscaler_status_current_replicas"
        out.write(f"# TYPE {name} gauge\n")
        for i in range(workloads):
            labels = f'horizontalpodautoscaler="keda-hpa-w{i:03d}",namespace="bench"'
            reps = np.maximum(1, np.ceil(demand(i, base, points) * 0.06 * 100 / 35))
            out.writelines(
                f"{name}{{{labels}}} {v:.0f} {t:.0f}\n"
                for t, v in zip(times[::every], reps[::every], strict=True)
            )
        out.write("# EOF\n")
    return demand(0, base, points)


MEASURED = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "sys.stdout.write(done.stdout)\n"
    "sys.stderr.write(done.stderr)\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "sys.stderr.write(f'\\npeak_rss_kb={peak}\\n')\n"
    "sys.exit(done.returncode)\n"
)
"""Runs a command in a fresh process and reports the command's own peak RSS (not
promtool's or Prometheus', which are children of the benchmark)."""


def tree_rss_mb(root: int) -> float:
    """RSS now of `root`'s descendants (not `root` itself), in MB, from /proc (Linux)."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    total, todo = 0, list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += sum(int(x.split()[1]) for x in status.splitlines() if x.startswith("VmRSS:"))
    return total / 1024


def measured(
    cmd: list[str], env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """(the finished command, its peak RSS in MB: of its largest process, and of all its
    processes together, sampled every 0.2 s)."""
    with subprocess.Popen(
        [sys.executable, "-c", MEASURED, *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        peak_total = [0.0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.2):
                peak_total[0] = max(peak_total[0], tree_rss_mb(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        out, err = proc.communicate()
        stop.set()
        sampler.join()
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    tail = err.rsplit("peak_rss_kb=", 1)
    largest = float(tail[1].strip()) / 1024 if len(tail) == 2 else math.nan
    return done, largest, peak_total[0]


def same_history(a: WorkloadHistory, b: WorkloadHistory) -> bool:
    """Whether two reads of a workload gave the same signals, value for value."""
    pairs = zip((a.requests, a.load, a.replicas), (b.requests, b.load, b.replicas), strict=True)
    for x, y in pairs:
        if (x.series is None) != (y.series is None) or x.problem != y.problem:
            return False
        if x.series is not None and y.series is not None:
            same = np.array_equal(x.series.values, y.series.values, equal_nan=True)
            if not same:
                return False
    return a.key == b.key and (a.start, a.end, a.step) == (b.start, b.end, b.step)


def _actual(r: Ready) -> dict[str, Any] | None:
    """The replay with the replicas that ran, alone (None when they are unknown)."""
    if r.replicas.series is None:
        return None
    return {**actual_run(r.prepared, r.replicas.series), "source": r.replicas.name}


def split(config: Config, histories: list[WorkloadHistory], seed: int = 1) -> dict[str, float]:
    """Seconds of each part of whatif's replay of `histories` (in-process, all of them in
    one lockstep): ready (checks, arrivals), gpuscaler's run, the reactive HPA, the
    replicas that ran, the baselines' sweeps (each apart), the report (summaries); and
    `around`: the reactive, actual and baseline runs in one sweep (`around.around_many`,
    as whatif runs them), checked to give the same summaries."""
    clock: dict[str, float] = dict.fromkeys(
        ("ready", "gpuscaler", "reactive", "actual", "baselines", "report", "around"), 0.0
    )

    def timed(part: str, f: Any, *a: Any) -> Any:
        t0 = time.process_time()
        out = f(*a)
        clock[part] += time.process_time() - t0
        return out

    rs = [
        timed("ready", ready, h, config, w, seed)
        for h, w in zip(histories, config.workloads[: len(histories)], strict=True)
    ]
    assert all(isinstance(r, Ready) for r in rs), rs
    ok = [r for r in rs if isinstance(r, Ready)]
    prepared = [r.prepared for r in ok]
    runs = timed("gpuscaler", lockstep_runs, prepared)
    swept = timed("baselines", swept_many, prepared)  # all workloads' sweeps as one
    replicas = [r.replicas.series for r in ok]
    arounds = timed("around", around_many, prepared, replicas)
    for r, run, curves, around in zip(ok, runs, swept, arounds, strict=True):
        reactive = timed("reactive", reactive_run, r.prepared)
        actual = timed("actual", _actual, r)

        def report(
            r: Ready = r,
            run: Any = run,
            reactive: Any = reactive,
            curves: Any = curves,
            actual: Any = actual,
        ) -> dict[str, Any]:
            result = finish(r.prepared, run, reactive, curves)
            return WorkloadReplay(r.key, r.signal, result, actual, r.limits(actual)).summary()

        before = timed("report", report)
        after = finished(r, run, around).summary()
        assert after == before, f"{r.key}: one sweep's summary differs"
    return clock


def print_split(
    config: Config,
    histories: list[WorkloadHistory],
    read: tuple[float, float],
    workloads: int,
    days: float,
) -> None:
    """The split of one in-process replay: CPU seconds a workload of each part (the read:
    wall seconds a workload, one at a time and READERS at a time)."""
    n = len(histories)
    read_each, read_threads = (r / workloads for r in read)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    clock = split(config, histories)
    parts = " ".join(f"{k}_s={v / n:.2f}" for k, v in clock.items())
    separate = clock["reactive"] + clock["actual"] + clock["baselines"]
    total = (sum(clock.values()) - clock["around"]) / n
    after = total - (separate - clock["around"]) / n
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"RESULT split workloads={n} days={days:g} lanes={n} per_workload: read_s={read_each:.2f} "
        f"read_threads_s={read_threads:.2f} "
        f"{parts} replay_s={total:.2f} replay_around_s={after:.2f} "
        f"around_speedup={separate / max(clock['around'], 1e-9):.2f} rss_mb={rss:.0f} "
        f"rss_before_mb={rss0:.0f} same_summaries=true"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", type=int, default=100)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--jobs", type=int, default=2, help="whatif --jobs (processes)")
    ap.add_argument(
        "--replay", type=int, default=None, help="replay only the first K (default: --jobs)"
    )
    ap.add_argument("--baseline-hours", type=float, default=6.0, help="simulate's replay")
    ap.add_argument("--no-baselines", action="store_true", help="pass --no-baselines")
    ap.add_argument("--lanes", type=int, default=None, help="pass --lanes (1: each workload alone)")
    ap.add_argument(
        "--no-simulate", action="store_true", help="skip the simulate baseline (no ratio)"
    )
    ap.add_argument(
        "--keep-blocks",
        type=Path,
        default=None,
        help="keep the backfilled TSDB blocks in DIR and reuse them when DIR holds the same "
        "workloads and days (skips promtool's minutes; compare revisions on one backfill)",
    )
    ap.add_argument(
        "--split",
        action="store_true",
        help="time whatif's parts in-process (all --replay workloads in one lockstep) instead",
    )
    args = ap.parse_args()
    replay = min(args.jobs if args.replay is None else args.replay, args.workloads)
    seconds = args.days * 86400
    points = round(seconds / STEP) + 3  # one step of margin each side, as whatif reads
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = math.floor(time.time() / STEP) * STEP - points * STEP - 3600
        t0 = time.perf_counter()
        full = replay == args.workloads
        blocks, start = kept_blocks(args.keep_blocks, replay, args.days, start)
        if blocks is None:
            rate0 = write_data(root / "data.om", start, points, replay)
        else:
            rate0 = demand(0, backfill_base(points), points)
        csv = root / "w000.csv"
        csv.write_text(
            "time,requests\n"
            + "".join(f"{start + k * STEP:.0f},{r * STEP:.6g}\n" for k, r in enumerate(rate0))
        )
        if blocks is None:
            print(
                f"wrote {replay} workloads x {points} points in {time.perf_counter() - t0:.1f}s",
                file=sys.stderr,
            )
        since, until = start + STEP, start + STEP + seconds
        if blocks is None and args.keep_blocks is not None:
            blocks = backfill(root / "data.om", args.keep_blocks, replay, args.days, start)
        data = root / "data.om" if blocks is None else None
        with prometheus(data=data, blocks=blocks, backfill_timeout=1800) as url:
            cfg_path = root / "whatif.yaml"
            cfg_path.write_text(config_text(url, args.workloads))
            sim_path = root / "simulate.yaml"  # simulate at whatif's slot: its read step
            sim_path.write_text(config_text(url, 1, slot=f"{STEP:g}s"))
            config = parse_config(cfg_path.read_text())
            reader = HistoryReader(config)
            calls: list[int] = []
            reader.progress = calls.append
            t0 = time.perf_counter()
            histories = []
            for w in config.workloads[:replay]:
                h = reader.workload(w, since - STEP, until + STEP, STEP)
                assert h.requests.series is not None, h.requests.problem
                histories.append(h)
            read_s = (time.perf_counter() - t0) * args.workloads / replay
            t0 = time.perf_counter()
            again = reader.workloads(config.workloads[:replay], since - STEP, until + STEP, STEP)
            read_threads_s = (time.perf_counter() - t0) * args.workloads / replay
            assert all(same_history(a, b) for a, b in zip(histories, again, strict=True))
            print(
                f"read: {replay} workloads, {len(calls)} range queries; all "
                f"{args.workloads}: {read_s:.1f}s one at a time, {read_threads_s:.1f}s "
                f"{READERS} at a time (whatif's){'' if full else ' (estimated)'}",
                file=sys.stderr,
            )
            if args.split:
                return print_split(
                    config, histories, (read_s, read_threads_s), args.workloads, args.days
                )
            cmd = [
                str(SCRIPT),
                "whatif",
                "--config",
                str(cfg_path),
                "--since",
                f"{since:.0f}",
                "--until",
                f"{until:.0f}",
                "--json",
                "--jobs",
                str(args.jobs),
            ]
            for i in range(replay if replay < args.workloads else 0):
                cmd += ["--workload", f"bench/w{i:03d}"]
            if args.no_baselines:
                cmd.append("--no-baselines")
            if args.lanes is not None:
                cmd += ["--lanes", str(args.lanes)]
            t0 = time.perf_counter()
            done, rss, rss_total = measured(cmd, env)
            whatif_s = time.perf_counter() - t0
            if done.returncode != 0:
                raise SystemExit(f"whatif failed ({done.returncode}): {done.stderr[-2000:]}")
            out = json.loads(done.stdout)
            assert len(out["workloads"]) == replay, out["skipped"]
        sim_cmd = [
            str(SCRIPT),
            "simulate",
            "--trace",
            str(csv),
            "--config",
            str(sim_path),
            "--start",
            repr(STEP / 3600),
            "--hours",
            repr(min(args.baseline_hours, args.days * 24)),
            "--json",
        ]
        if args.no_baselines:
            sim_cmd.append("--no-baselines")
        sim_s = math.nan
        if not args.no_simulate:
            t0 = time.perf_counter()
            subprocess.run(sim_cmd, capture_output=True, text=True, env=env, check=True)
            sim_s = time.perf_counter() - t0
    per = whatif_s / replay
    ratio = (per / args.days) / (sim_s / (min(args.baseline_hours, args.days * 24) / 24))
    print(
        f"whatif: {replay} workload(s) in {whatif_s:.1f}s ({per:.1f}s each), peak RSS "
        f"{rss:.0f} MB; simulate of {min(args.baseline_hours, args.days * 24):g} h of the same "
        f"trace at the same slot {sim_s:.1f}s",
        file=sys.stderr,
    )
    lanes = "default" if args.lanes is None else args.lanes
    common = (
        f"lanes={lanes} rss_mb={rss:.0f} rss_total_mb={rss_total:.0f} simulate_s={sim_s:.1f} "
        f"ratio={ratio:.2f}"
    )
    if full:
        ok = whatif_s <= GATE_SECONDS and rss_total <= GATE_MB
        print(
            f"RESULT workloads={args.workloads} days={args.days:g} seconds={whatif_s:.1f} "
            f"{common} gate={'pass' if ok else 'fail'}"
        )
    else:
        # whatif's own time covers reading its workloads' history and replaying it, J at
        # a time: N workloads take N / K times as long (read_s, the in-process read of all
        # N one after another, is shown, not added: it would count reading twice).
        estimate = per * args.workloads
        ok = estimate <= GATE_SECONDS and rss_total <= GATE_MB
        print(
            f"RESULT workloads={args.workloads} days={args.days:g} replayed={replay} "
            f"seconds_estimated={estimate:.0f} read_s={read_s:.1f} "
            f"read_threads_s={read_threads_s:.1f} "
            f"whatif_s_per_workload={per:.1f} {common} "
            f"gate={'pass' if ok else 'fail'}(estimated)"
        )


if __name__ == "__main__":
    main()
