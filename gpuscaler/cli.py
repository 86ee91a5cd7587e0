"""Command line: validate-config, simulate, once, run.

Exit codes: 0 success, 2 bad input (config, trace, arguments), 1 a failure at run time.
Bad input never prints a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuscaler.config import Config, ConfigError, load_config
from gpuscaler.controller import Controller
from gpuscaler.logs import decision_outcome

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2

NO_ADAPTER_NOTICE = (
    "source: simulator on the bundled trace (no prometheus.url in the config): `once` and "
    "`run` observe and act on an in-process simulated cluster, never a real one."
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _config_or_exit(path: str | None) -> Config:
    if path is None:
        return Config()
    try:
        return load_config(path)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None


def cmd_validate(args: argparse.Namespace) -> int:
    config = _config_or_exit(args.path)
    print(f"{args.path}: valid: {config.summary()}")
    return EXIT_OK


def cmd_simulate(args: argparse.Namespace) -> int:
    from gpuscaler.sim.report import table, write_report
    from gpuscaler.sim.simulate import simulate
    from gpuscaler.sim.trace import TraceError, load_trace

    config = _config_or_exit(args.config)
    if args.hours is not None and args.hours <= 0:
        print("--hours must be > 0", file=sys.stderr)
        return EXIT_BAD_INPUT
    listeners = []
    stop = threading.Event()
    if args.metrics_port:
        stop = _stop_on_signal()  # a signal during the replay ends the serving after it
        from gpuscaler.observability import ControllerMetrics, serve, sim_health

        metrics = ControllerMetrics()
        listeners.append(metrics)
        serve(metrics, sim_health(), args.metrics_port, host="127.0.0.1")
        print(f"serving /metrics on 127.0.0.1:{args.metrics_port}", file=sys.stderr)
    try:
        trace = load_trace(args.trace)
        result = simulate(trace, args.hours, args.seed, config, args.start, metrics=listeners)
    except TraceError as e:
        print(f"bad trace: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    summary = result.summary()
    if args.json:
        print(json.dumps(summary))
    else:
        print(table(summary))
    if args.report:
        for path in write_report(result, Path(args.report)):
            print(f"wrote {path}", file=sys.stderr)
    if args.metrics_port:
        print("replay done; still serving /metrics until interrupted", file=sys.stderr)
        sys.stdout.flush()
        while not stop.wait(0.2):
            pass
    return EXIT_OK


def _stop_on_signal() -> threading.Event:
    """An event set by SIGTERM or SIGINT."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    return done


def cmd_backtest(args: argparse.Namespace) -> int:
    from gpuscaler.backtest import BacktestError, backtest
    from gpuscaler.config import ForecastConfig, parse_duration

    config = _config_or_exit(args.config)
    try:
        horizon = parse_duration(args.horizon)
        resample = parse_duration(args.resample) if args.resample else None
        window = parse_duration(args.window) if args.window else config.metrics.window
    except ValueError as e:
        print(f"bad argument: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.agg != "mean" and resample is None:
        print("--agg needs --resample", file=sys.stderr)
        return EXIT_BAD_INPUT
    cfg: ForecastConfig = config.forecast
    try:
        report = backtest(args.series, cfg, horizon, window, resample, args.agg, args.max_origins)
    except BacktestError as e:
        print(f"bad series: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps(report))
    else:
        print(backtest_table(report))
    return EXIT_OK


def backtest_table(report: dict[str, Any]) -> str:
    lines = [f"horizon {report['horizon_s']:g}s"]
    header = (
        f"{'series':<24}{'method':<20}{'mae':>10}{'rel_naive':>11}{'peak_mae':>10}{'coverage':>10}"
    )
    lines.append(header)
    sections = {"(overall)": report["overall"], **report["series"]}
    for name, methods in sections.items():
        for method, s in methods.items():
            cells = [s.get(k) for k in ("mae", "relative_to_naive", "peak_mae", "coverage")]
            text = "".join(f"{c:>10.4g}" if c is not None else f"{'-':>10}" for c in cells)
            lines.append(f"{name[:23]:<24}{method:<20}{text}")
    worst = report.get("worst") or {}
    if len(report["series"]) > 1 and worst:
        rel = worst.get("relative_to_naive")
        lines.append(
            f"worst series for gpuscaler: {worst['series']} (relative_to_naive "
            f"{rel if rel is not None else '-'}, coverage {worst.get('coverage')})"
        )
    return "\n".join(lines)


def _live_controller(config: Config, dry_run: bool) -> Controller:
    from gpuscaler.sim.live import LiveSimulation

    print(NO_ADAPTER_NOTICE, file=sys.stderr)
    live = LiveSimulation(config, wall_start=time.time())
    return Controller(live.config, live, live, dry_run=dry_run or config.control.dry_run)


def _prometheus_controller(config: Config, state_file: str) -> Controller:
    from gpuscaler.adapters.prometheus import PrometheusSource, load_state
    from gpuscaler.app import NoActuator

    state, said = load_state(state_file, config)
    print(
        f"source: Prometheus at {config.prometheus.url}; {said}; no cluster: dry run.",
        file=sys.stderr,
    )
    return Controller(config, PrometheusSource(config, state), NoActuator(), dry_run=True)


def _controller(args: argparse.Namespace, config: Config) -> tuple[Controller, Any]:
    """The controller for once/run, and the cluster parts around it (None without a
    cluster). Exits 2 on bad input: a bad state or snapshot file, no Kubernetes API."""
    from gpuscaler.app import SetupError, cluster_controller, kube_api, snapshot_controller

    snapshot = getattr(args, "cluster_snapshot", None)
    try:
        if snapshot is not None:
            if not args.dry_run:
                raise SetupError("--cluster-snapshot plans only: add --dry-run")
            controller = snapshot_controller(config, snapshot)
            print(
                f"cluster state from {snapshot}; metrics from Prometheus; dry run", file=sys.stderr
            )
            return controller, None
        if not config.prometheus.url:
            return _live_controller(config, args.dry_run), None
        if args.state is not None:
            return _prometheus_controller(config, args.state), None
        api = kube_api(args.kubeconfig)
        parts = cluster_controller(
            config,
            api,
            dry_run=args.dry_run,
            config_path=args.config,
            leader_election=args.command == "run" and not args.no_leader_election,
        )
        return parts.controller, parts
    except (SetupError, ValueError) as e:
        print(str(e), file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None


def cmd_once(args: argparse.Namespace) -> int:
    config = _config_or_exit(args.config)
    controller, _ = _controller(args, config)
    result = controller.tick(time.time())
    for d in result.plan.decisions:
        outcome = decision_outcome(d, result.applied, result.mode)
        print(json.dumps(d.as_record() | {"outcome": outcome}))
    for s in result.plan.skips:
        print(json.dumps(s.as_record()))
    return EXIT_OK


def _serve_metrics(
    controller: Controller, parts: Any, interval: float, port: int, host: str
) -> None:
    from gpuscaler.observability import ControllerMetrics, HealthState, serve

    metrics = ControllerMetrics()
    metrics.attach(controller)
    if parts is not None:
        metrics.attach_cluster(parts)
    serve(metrics, HealthState(controller, interval), port, host)
    print(f"serving /metrics, /healthz, /readyz on {host}:{port}", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from gpuscaler.loop import ControlLoop

    config = _config_or_exit(args.config)
    controller, parts = _controller(args, config)
    if args.metrics_port:
        _serve_metrics(
            controller, parts, config.control.interval, args.metrics_port, args.metrics_host
        )
    if parts is not None and parts.elector is not None:
        parts.elector.step()  # the first tick knows whether it leads
        parts.elector.start()
    try:
        ControlLoop(controller, config.control.interval, max_ticks=args.max_ticks).run()
    finally:
        if parts is not None:
            parts.stop()  # releases the lease so a standby takes over at once
    return EXIT_OK if controller.stats.failed == 0 or controller.stats.ticks > 0 else EXIT_FAILURE


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpuscaler", description="Predictive GPU autoscaler for Kubernetes.")
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("validate-config", help="check a config file and exit")
    p.add_argument("path")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("simulate", help="replay a load trace against a simulated cluster")
    p.add_argument("--trace", help="CSV: time column, then requests per bin (default: bundled)")
    p.add_argument(
        "--hours", type=float, default=None, help="hours of the trace to replay (default 24)"
    )
    p.add_argument("--start", type=float, default=0.0, help="hours into the trace to start at")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--config", help="config YAML (default: built-in defaults)")
    p.add_argument("--report", metavar="DIR", help="write decisions.jsonl, summary.json and a PNG")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve the replay's metrics on 127.0.0.1:PORT, and keep serving until interrupted",
    )
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("backtest", help="rolling-origin forecast evaluation on a CSV")
    p.add_argument("--series", required=True, help="CSV: timestamp,value[,series]")
    p.add_argument("--horizon", default="5m")
    p.add_argument("--resample", help="bin width, e.g. 1m (irregular or fine series)")
    p.add_argument("--agg", default="mean", choices=["mean", "sum", "max", "count"])
    p.add_argument("--window", help="history per origin (default: metrics.window)")
    p.add_argument("--max-origins", type=int, default=400, help="origins per series at most")
    p.add_argument("--config", help="config YAML (forecast section)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_backtest)

    for name, func, help_text in (
        ("once", cmd_once, "run one control cycle and print the plan as JSON lines"),
        ("run", cmd_run, "run the control loop until SIGTERM/SIGINT"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--config", required=True)
        p.add_argument("--dry-run", action="store_true", help="plan only, change nothing")
        p.add_argument(
            "--state", help="plan without a cluster: YAML of current fragments and floors"
        )
        p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube)")
        if name == "once":
            p.add_argument(
                "--cluster-snapshot",
                metavar="FILE",
                help="plan (with --dry-run) against `kubectl get nodes,pods,"
                "scaledobjects.keda.sh,horizontalpodautoscalers -A -o yaml` output",
            )
        if name == "run":
            p.add_argument("--max-ticks", type=int, default=None, help=argparse.SUPPRESS)
            p.add_argument(
                "--no-leader-election",
                action="store_true",
                help="act without a Lease (one replica only)",
            )
            p.add_argument(
                "--metrics-port",
                type=int,
                default=8080,
                help="/metrics, /healthz, /readyz (0: off)",
            )
            p.add_argument(
                "--metrics-host",
                default="0.0.0.0",
                help="address to serve /metrics, /healthz, /readyz on (default: all, for probes)",
            )
        p.set_defaults(func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from gpuscaler.logs import setup_logging

    setup_logging(args.log_level)
    logging.captureWarnings(True)
    if getattr(args, "command", None) == "simulate" and args.hours is None and args.trace is None:
        args.hours = 24.0
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
