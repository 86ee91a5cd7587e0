"""The offline subcommands: validate-config, simulate and backtest."""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpuscaler.commands.common import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    config_or_exit,
    memory_size,
    positive_int,
    report_dir,
    stop_on_signal,
)
from gpuscaler.config import parse_duration

SAMPLE_SECONDS = 0.5
"""The simulator's slot: the finest bin a trace can be resampled to."""


def cmd_validate(args: argparse.Namespace) -> int:
    config = config_or_exit(args.path)
    print(f"{args.path}: valid: {config.summary()}")
    return EXIT_OK


def _replay_window(args: argparse.Namespace) -> float | str | None:
    """The --resample bin in seconds (None: none), or what is wrong with --hours, --start
    or --resample."""
    if args.hours is not None and not (math.isfinite(args.hours) and args.hours > 0):
        return f"--hours must be a finite number > 0, got {args.hours:g}"
    if not (math.isfinite(args.start) and args.start >= 0):
        return f"--start must be a finite number >= 0, got {args.start:g}"
    if args.resample is None:
        return None
    try:
        resample = parse_duration(args.resample)
    except ValueError as e:
        return f"--resample: {e}"
    if not (math.isfinite(resample) and resample >= SAMPLE_SECONDS):
        return f"--resample must be at least 500ms, got {args.resample}"
    return resample


def cmd_simulate(args: argparse.Namespace) -> int:
    from gpuscaler.sim.report import table, write_report
    from gpuscaler.sim.simulate import simulate
    from gpuscaler.sim.trace import TraceError, load_trace

    config = config_or_exit(args.config, require_targets=False)
    resample = _replay_window(args)
    if isinstance(resample, str):
        print(resample, file=sys.stderr)
        return EXIT_BAD_INPUT
    listeners = []
    stop = threading.Event()
    if args.metrics_port:
        stop = stop_on_signal()  # a signal during the replay ends the serving after it
        from gpuscaler.observability import ControllerMetrics, ReplayHealth, serve

        metrics = ControllerMetrics()
        listeners.append(metrics)
        serve(metrics, ReplayHealth(), args.metrics_port, host="127.0.0.1")
        print(f"serving /metrics on 127.0.0.1:{args.metrics_port}", file=sys.stderr)
    try:
        trace = load_trace(args.trace, resample, args.column)
        print(f"trace {trace.name}: requests from {trace.source}", file=sys.stderr)
        result = simulate(
            trace,
            args.hours,
            args.seed,
            config,
            args.start,
            metrics=listeners,
            baselines=not args.no_baselines,
        )
    except TraceError as e:
        print(f"bad trace: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    summary = result.summary()
    print(json.dumps(summary) if args.json else table(summary))
    if args.report:
        for path in write_report(result, Path(args.report)):
            print(f"wrote {path}", file=sys.stderr)
    if args.metrics_port:
        print("replay done; still serving /metrics until interrupted", file=sys.stderr)
        sys.stdout.flush()
        while not stop.wait(0.2):  # a timeout: the signal handler runs between waits
            pass
    return EXIT_OK


def cmd_whatif(args: argparse.Namespace) -> int:
    from gpuscaler.whatif import parse_when, run_whatif, select, text

    config = config_or_exit(args.config)
    now = time.time()
    since = parse_when(args.since, now, "--since")
    until = parse_when(args.until, now, "--until")
    try:
        step = None if args.step is None else parse_duration(args.step)
    except ValueError as e:
        print(f"--step: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if step is not None and step < 1:
        print(f"--step must be at least 1s, got {args.step}", file=sys.stderr)
        return EXIT_BAD_INPUT
    report = Path(args.report) if args.report else None
    outcome = run_whatif(
        config,
        since,
        until,
        select(config, args.workload or []),
        report,
        seed=args.seed,
        step=step,
        baselines=not args.no_baselines,
        jobs=args.jobs,
        memory=args.memory,
        lanes=args.lanes,
    )
    print(json.dumps(outcome.summary()) if args.json else text(outcome))
    for path in outcome.files:
        print(f"wrote {path}", file=sys.stderr)
    return EXIT_OK


def cmd_backtest(args: argparse.Namespace) -> int:
    from gpuscaler.backtest import BacktestError, backtest

    config = config_or_exit(args.config, require_targets=False)
    try:
        horizon = parse_duration(args.horizon)
        resample = parse_duration(args.resample) if args.resample else None
        window = parse_duration(args.window) if args.window else config.metrics.window
        for flag, value in (("--horizon", horizon), ("--resample", resample), ("--window", window)):
            if value is not None and value <= 0:
                raise ValueError(f"{flag} must be longer than 0s")
    except ValueError as e:
        print(f"bad argument: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.agg != "mean" and resample is None:
        print("--agg needs --resample", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        bins = (horizon, window, resample, args.agg, args.max_origins)
        report = backtest(
            args.series, config.forecast, *bins, demand_path=args.demand, demand_agg=args.demand_agg
        )
    except BacktestError as e:
        print(f"bad series: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps(report) if args.json else backtest_table(report))
    return EXIT_OK


def backtest_table(report: dict[str, Any]) -> str:
    lines = [f"horizon {report['horizon_s']:g}s"]
    lines.append(
        f"{'series':<24}{'method':<20}{'mae':>10}{'rel_naive':>11}{'peak_mae':>10}{'coverage':>10}"
    )
    sections = {"(overall)": report["overall"], **report["series"]}
    for name, methods in sections.items():
        for method, s in methods.items():
            cells = [s.get(k) for k in ("mae", "relative_to_naive", "peak_mae", "coverage")]
            text = "".join(f"{c:>10.4g}" if c is not None else f"{'-':>10}" for c in cells)
            won = s.get("demand_won")
            text += f"  demand won at {won:.0%} of origins" if won is not None else ""
            lines.append(f"{name[:23]:<24}{method:<20}{text}")
    worst = report.get("worst") or {}
    if len(report["series"]) > 1 and worst:
        rel = worst.get("relative_to_naive")
        lines.append(
            f"worst series for gpuscaler: {worst['series']} (relative_to_naive "
            f"{rel if rel is not None else '-'}, coverage {worst.get('coverage')})"
        )
    return "\n".join(lines)


def add_simulate_parser(sub: Any) -> None:
    p = sub.add_parser("simulate", help="replay a load trace against a simulated cluster")
    p.add_argument("--trace", help="CSV: time column, then requests per bin (default: bundled)")
    hours = "hours of the trace to replay (default 24)"
    p.add_argument("--hours", type=float, default=None, help=hours)
    p.add_argument("--start", type=float, default=0.0, help="hours into the trace to start at")
    binned = "bin a per-request log or irregular series into counts per bin, e.g. 10s"
    p.add_argument("--resample", help=binned)
    column = (
        "column holding requests (default: the first numeric one; with --resample, "
        "rows are counted unless a column is named, whose values are then summed)"
    )
    p.add_argument("--column", help=column)
    skip = (
        "skip the three baselines' sweeps over targets 40..90 %% (33 runs): no "
        "equal-cost comparison and no trade-off curves; gpuscaler and the reactive HPA at "
        "70 %% still run"
    )
    p.add_argument("--no-baselines", action="store_true", help=skip)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--config", help="config YAML (default: built-in defaults)")
    written = "write decisions.jsonl, summary.json and a PNG"
    p.add_argument("--report", metavar="DIR", type=report_dir, help=written)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    serving = "serve the replay's metrics on 127.0.0.1:PORT, and keep serving until interrupted"
    p.add_argument("--metrics-port", type=int, default=0, help=serving)
    p.set_defaults(func=cmd_simulate)


def add_backtest_parser(sub: Any) -> None:
    p = sub.add_parser("backtest", help="rolling-origin forecast evaluation on a CSV")
    p.add_argument("--series", required=True, help="CSV: timestamp,value[,series]")
    p.add_argument("--horizon", default="5m")
    p.add_argument("--resample", help="bin width, e.g. 1m (irregular or fine series)")
    p.add_argument("--agg", default="mean", choices=["mean", "sum", "max", "count"])
    p.add_argument("--window", help="history per origin (default: metrics.window)")
    demand = (
        "CSV of each series' demand (request rate, queue), the leading signal: "
        "same series names, or one series for all"
    )
    p.add_argument("--demand", help=demand)
    agg = "--resample aggregation of the demand (default: --agg)"
    p.add_argument("--demand-agg", choices=["mean", "sum", "max", "count"], help=agg)
    most = "origins per series at most"
    p.add_argument("--max-origins", type=positive_int, default=400, help=most)
    p.add_argument("--config", help="config YAML (forecast section)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_backtest)


def add_whatif_parser(sub: Any) -> None:
    mine = "replay your own Prometheus history: what gpuscaler would have done"
    p = sub.add_parser("whatif", help=mine)
    p.add_argument("--config", required=True, help="config YAML with prometheus.url")
    p.add_argument("--since", default="7d", help="start: '7d' ago, RFC 3339 or unix seconds")
    p.add_argument("--until", default="now", help="end: 'now', a duration ago, RFC 3339")
    only = "only these workloads"
    p.add_argument("--workload", action="extend", nargs="+", metavar="NS/NAME", help=only)
    step = "read step, and the replay's slot (default forecast.fit_step, 10s; not coarser)"
    p.add_argument("--step", help=step)
    p.add_argument("--seed", type=int, default=1)
    jobs = (
        "processes replaying at once (default: one a core, as many as --memory holds "
        "with 10 lanes each: 2 at 1GiB for a week)"
    )
    p.add_argument("--jobs", type=positive_int, help=jobs)
    lanes = (
        "workloads a process ticks in lockstep through one controller (default 50, fewer "
        "when the run would pass --memory: about 5 MB a lane-week; 1: each alone)"
    )
    p.add_argument("--lanes", type=positive_int, help=lanes)
    memory = (
        "memory the whole run sizes its processes and lanes within (default 1GiB; e.g. "
        "4GiB on a larger machine for one process a core)"
    )
    p.add_argument("--memory", type=memory_size, default="1GiB", help=memory)
    skip = (
        "skip the three baselines' sweeps over targets 40..90 %% (33 runs a workload): "
        "no equal-cost comparison and no verdict"
    )
    p.add_argument("--no-baselines", action="store_true", help=skip)
    written = "write decisions.jsonl, summary.json and one PNG per workload"
    p.add_argument("--report", metavar="DIR", type=report_dir, help=written)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_whatif)
