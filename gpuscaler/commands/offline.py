"""The offline subcommands: validate-config, simulate and backtest."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpuscaler.commands.common import (
    COUNT,
    EXIT_OK,
    bounded,
    config_or_default,
    memory_size,
    report_dir,
)
from gpuscaler.setup import stop_on_signal


def cmd_validate(args: argparse.Namespace) -> int:
    config = config_or_default(args.path)
    print(f"{args.path}: valid: {config.summary()}")
    return EXIT_OK


def cmd_simulate(args: argparse.Namespace) -> int:
    from gpuscaler.sim.report import table, write_report
    from gpuscaler.sim.simulate import simulate
    from gpuscaler.sim.trace import load_trace

    config = config_or_default(args.config, require_targets=False)
    listeners = []
    stop = threading.Event()
    if args.metrics_port:
        stop = stop_on_signal()  # a signal during the replay ends the serving after it
        from gpuscaler.observability import ControllerMetrics, ReplayHealth, serve

        metrics = ControllerMetrics()
        listeners.append(metrics)
        serve(metrics, ReplayHealth(), args.metrics_port, host="127.0.0.1")
        print(f"serving /metrics on 127.0.0.1:{args.metrics_port}", file=sys.stderr)
    trace = load_trace(args.trace, args.resample, args.column)  # TraceError: exit 2
    print(f"trace {trace.name}: requests from {trace.source}", file=sys.stderr)
    baselines = not args.no_baselines
    result = simulate(trace, args.hours, args.seed, config, args.start, listeners, baselines)
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

    config = config_or_default(args.config)
    now = time.time()
    since = parse_when(args.since, now, "--since")
    until = parse_when(args.until, now, "--until")
    report = Path(args.report) if args.report else None
    workloads = select(config, args.workload or [])
    options = {n: getattr(args, n) for n in ("seed", "step", "jobs", "memory", "lanes")}
    baselines = not args.no_baselines
    outcome = run_whatif(config, since, until, workloads, report, baselines=baselines, **options)
    print(json.dumps(outcome.summary()) if args.json else text(outcome))
    for path in outcome.files:
        print(f"wrote {path}", file=sys.stderr)
    return EXIT_OK


def cmd_backtest(args: argparse.Namespace) -> int:
    from gpuscaler.backtest import BacktestError, backtest

    config = config_or_default(args.config, require_targets=False)
    if args.agg != "mean" and args.resample is None:
        raise BacktestError("--agg needs --resample")
    window = args.window or config.metrics.window
    bins = (args.horizon, window, args.resample, args.agg, args.max_origins)
    report = backtest(
        args.series, config.forecast, *bins, demand_path=args.demand, demand_agg=args.demand_agg
    )
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
    p.add_argument("--hours", type=bounded(0, above=True, parse=float), help=hours)
    start = "hours into the trace to start at"
    p.add_argument("--start", type=bounded(0, parse=float), default=0.0, help=start)
    binned = "bin a per-request log or irregular series into counts per bin, e.g. 10s"
    p.add_argument("--resample", type=bounded(0.5), help=binned)
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
    p.add_argument("--config", help="config YAML (default: built-in defaults)")
    _replay_outputs(p, skip, "write decisions.jsonl, summary.json and a PNG")
    serving = "serve the replay's metrics on 127.0.0.1:PORT, and keep serving until interrupted"
    p.add_argument("--metrics-port", type=int, default=0, help=serving)
    p.set_defaults(func=cmd_simulate)


def add_backtest_parser(sub: Any) -> None:
    p = sub.add_parser("backtest", help="rolling-origin forecast evaluation on a CSV")
    p.add_argument("--series", required=True, help="CSV: timestamp,value[,series]")
    p.add_argument("--horizon", type=bounded(0, above=True), default="5m")
    bins = "bin width, e.g. 1m (irregular or fine series)"
    p.add_argument("--resample", type=bounded(0, above=True), help=bins)
    p.add_argument("--agg", default="mean", choices=["mean", "sum", "max", "count"])
    window = "history per origin (default: metrics.window)"
    p.add_argument("--window", type=bounded(0, above=True), help=window)
    demand = (
        "CSV of each series' demand (request rate, queue), the leading signal: "
        "same series names, or one series for all"
    )
    p.add_argument("--demand", help=demand)
    agg = "--resample aggregation of the demand (default: --agg)"
    p.add_argument("--demand-agg", choices=["mean", "sum", "max", "count"], help=agg)
    most = "origins per series at most"
    p.add_argument("--max-origins", type=COUNT, default=400, help=most)
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
    p.add_argument("--step", type=bounded(1), help=step)
    jobs = (
        "processes replaying at once (default: one a core, as many as --memory holds "
        "with 10 lanes each: 2 at 1GiB for a week)"
    )
    p.add_argument("--jobs", type=COUNT, help=jobs)
    lanes = (
        "workloads a process ticks in lockstep through one controller (default 50, fewer "
        "when the run would pass --memory: about 5 MB a lane-week; 1: each alone)"
    )
    p.add_argument("--lanes", type=COUNT, help=lanes)
    memory = (
        "memory the whole run sizes its processes and lanes within (default 1GiB; e.g. "
        "4GiB on a larger machine for one process a core)"
    )
    p.add_argument("--memory", type=memory_size, default="1GiB", help=memory)
    skip = (
        "skip the three baselines' sweeps over targets 40..90 %% (33 runs a workload): "
        "no equal-cost comparison and no verdict"
    )
    _replay_outputs(p, skip, "write decisions.jsonl, summary.json and one PNG per workload")
    p.set_defaults(func=cmd_whatif)


def _replay_outputs(p: Any, skip: str, written: str) -> None:
    """What `simulate` and `whatif` share: the seed, --no-baselines and their outputs."""
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-baselines", action="store_true", help=skip)
    p.add_argument("--report", metavar="DIR", type=report_dir, help=written)
    p.add_argument("--json", action="store_true", help="print one JSON object")
