"""Command line: validate-config, simulate, whatif, backtest, once, run, agent, extender.

Exit codes: 0 success, 2 bad input (config, trace, arguments), 1 a failure at run time.
Bad input never prints a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuscaler.config import Config, ConfigError, load_config, parse_duration, redact_url
from gpuscaler.controller import Controller
from gpuscaler.errors import InputError, OutsideError
from gpuscaler.logs import decision_outcome

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
SAMPLE_SECONDS = 0.5
"""The simulator's slot: the finest bin a trace can be resampled to."""

NO_ADAPTER_NOTICE = (
    "source: simulator on the bundled trace (no prometheus.url in the config): `once` and "
    "`run` observe and act on an in-process simulated cluster, never a real one."
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _config_or_exit(path: str | None, require_targets: bool = True) -> Config:
    """The config file, or exit 2 naming every problem. `once`, `run` and validation need
    it to say what it manages; `simulate` and `backtest` bring their own targets."""
    if path is None:
        return Config()
    try:
        return load_config(path, require_targets)
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

    config = _config_or_exit(args.config, require_targets=False)
    if args.hours is not None and not (math.isfinite(args.hours) and args.hours > 0):
        print(f"--hours must be a finite number > 0, got {args.hours:g}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not (math.isfinite(args.start) and args.start >= 0):
        print(f"--start must be a finite number >= 0, got {args.start:g}", file=sys.stderr)
        return EXIT_BAD_INPUT
    resample = None
    if args.resample is not None:
        try:
            resample = parse_duration(args.resample)
        except ValueError as e:
            print(f"--resample: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if not (math.isfinite(resample) and resample >= SAMPLE_SECONDS):
            print(f"--resample must be at least 500ms, got {args.resample}", file=sys.stderr)
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


def cmd_whatif(args: argparse.Namespace) -> int:
    from gpuscaler.whatif import parse_when, run_whatif, select, text

    config = _config_or_exit(args.config)
    now = time.time()
    since = parse_when(args.since, now, "--since")
    until = parse_when(args.until, now, "--until")
    step = None
    if args.step is not None:
        try:
            step = parse_duration(args.step)
        except ValueError as e:
            print(f"--step: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if step < 1:
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
    )
    print(json.dumps(outcome.summary()) if args.json else text(outcome))
    for path in outcome.files:
        print(f"wrote {path}", file=sys.stderr)
    return EXIT_OK


def _stop_on_signal() -> threading.Event:
    """An event set by SIGTERM or SIGINT."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    return done


def cmd_backtest(args: argparse.Namespace) -> int:
    from gpuscaler.backtest import BacktestError, backtest
    from gpuscaler.config import ForecastConfig

    config = _config_or_exit(args.config, require_targets=False)
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
    cfg: ForecastConfig = config.forecast
    try:
        report = backtest(
            args.series,
            cfg,
            horizon,
            window,
            resample,
            args.agg,
            args.max_origins,
            demand_path=args.demand,
            demand_agg=args.demand_agg,
        )
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
        f"source: Prometheus at {redact_url(config.prometheus.url or '')}; {said}; no cluster: "
        "dry run.",
        file=sys.stderr,
    )
    return Controller(config, PrometheusSource(config, state), NoActuator(), dry_run=True)


def _reloading(
    controller: Controller,
    args: argparse.Namespace,
    adapt: Callable[[Config], Config] = lambda c: c,
) -> Controller:
    """`run` without a cluster reloads its config file too: a valid change applies from the
    next tick (`adapt`ed as the mode needs), an invalid one is logged and refused."""
    if args.command == "run":
        from gpuscaler.reload import ConfigReloader

        reloader = ConfigReloader(args.config, lambda c, _: controller.reconfigure(adapt(c)))
        controller.before_tick.insert(0, reloader.check)
    return controller


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
            from gpuscaler.sim.simulate import scenario_config

            live = _live_controller(config, args.dry_run)
            return _reloading(live, args, scenario_config), None
        if args.state is not None:
            return _reloading(_prometheus_controller(config, args.state), args), None
        api = kube_api(args.kubeconfig, config.kubernetes)
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
) -> Any:
    from gpuscaler.observability import ControllerMetrics, HealthState, serve

    metrics = ControllerMetrics()
    metrics.attach(controller)
    if parts is not None:
        metrics.attach_cluster(parts)
    serve(metrics, HealthState(controller, interval), port, host)
    print(f"serving /metrics, /healthz, /readyz on {host}:{port}", file=sys.stderr)
    return metrics.registry


def _serve_external_scaler(
    args: argparse.Namespace, config: Config, parts: Any, registry: Any
) -> Any:
    """KEDA's external scaler (gpuscaler.extscaler) when a port is set; None when off."""
    port = args.external_scaler_port
    port = config.external_scaler.port if port is None else port
    if not port:
        return None
    if parts is None:
        print("external scaler: serves a cluster's ScaledObjects; off here", file=sys.stderr)
        return None
    from gpuscaler.extscaler.server import ExternalScalerSetupError, attach

    try:
        server = attach(parts, port, registry=registry)
    except ExternalScalerSetupError as e:
        print(str(e), file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None
    print(f"serving KEDA's external scaler (gRPC) on port {server.port}", file=sys.stderr)
    return server


def cmd_run(args: argparse.Namespace) -> int:
    from gpuscaler.loop import ControlLoop

    config = _config_or_exit(args.config)
    controller, parts = _controller(args, config)
    registry = None
    if args.metrics_port:
        registry = _serve_metrics(
            controller, parts, config.control.interval, args.metrics_port, args.metrics_host
        )
    external = _serve_external_scaler(args, config, parts, registry)
    if parts is not None and parts.elector is not None:
        parts.elector.step()  # the first tick knows whether it leads
        parts.elector.start()
    try:
        ControlLoop(controller, config.control.interval, max_ticks=args.max_ticks).run()
    finally:
        if external is not None:
            external.stop()
        if parts is not None:
            parts.stop()  # releases the lease so a standby takes over at once
    return EXIT_OK if controller.stats.failed == 0 or controller.stats.ticks > 0 else EXIT_FAILURE


def cmd_agent(args: argparse.Namespace) -> int:
    """The node agent (issue 16): see gpuscaler.agent."""
    from gpuscaler.agent.app import AgentArgs, AgentSetupError, run_agent

    config = _config_or_exit(args.config, require_targets=False)  # the agent manages its node
    try:
        return run_agent(
            config,
            AgentArgs(
                node=args.node,
                kubeconfig=args.kubeconfig,
                metrics_port=args.metrics_port,
                metrics_host=args.metrics_host,
                fake_nvml=args.fake_nvml,
                max_polls=args.max_polls,
            ),
        )
    except AgentSetupError as e:
        print(str(e), file=sys.stderr)
        return EXIT_BAD_INPUT


def _agent_parser(sub: Any) -> None:
    p = sub.add_parser("agent", help="the node agent: time slices, GPU topology, orphan cleanup")
    p.add_argument("--config", required=True)
    p.add_argument("--node", help="this node's name (default: $NODE_NAME)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube)")
    p.add_argument("--metrics-port", type=int, default=8080, help="/metrics, /healthz, /readyz")
    p.add_argument("--metrics-host", default="0.0.0.0", help="address for the probes (all)")
    p.add_argument("--fake-nvml", help=argparse.SUPPRESS)  # tests: GPUs from a JSON file
    p.add_argument("--max-polls", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_agent)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _report_dir(text: str) -> str:
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    return text


def cmd_extender(args: argparse.Namespace) -> int:
    """The scheduler extender for a second kube-scheduler (issue 15)."""
    from gpuscaler.app import SetupError, kube_api

    config = _config_or_exit(args.config, require_targets=False)  # it places pods, not targets
    if not config.prometheus.url:
        print(
            "prometheus.url is not set: the extender reads GPU memory from dcgm-exporter "
            "through Prometheus",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if not 0 < args.port < 65536:
        print(f"--port {args.port}: not a TCP port", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        api = kube_api(args.kubeconfig, config.kubernetes)
    except SetupError as e:
        print(str(e), file=sys.stderr)
        return EXIT_BAD_INPUT
    from gpuscaler.extender.run import serve

    paths = "/filter, /prioritize, /bind, /healthz, /readyz, /metrics"
    print(f"serving {paths} on {args.host}:{args.port}", file=sys.stderr)
    serve(config, api, args.host, args.port, leader_election=not args.no_leader_election)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpuscaler", description="Predictive GPU autoscaler for Kubernetes.")
    parser.add_argument(
        "--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS, metavar="LEVEL"
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an unexpected error"
    )
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
    p.add_argument(
        "--resample",
        help="bin a per-request log or irregular series into counts per bin, e.g. 10s",
    )
    p.add_argument(
        "--column",
        help="column holding requests (default: the first numeric one; with --resample, "
        "rows are counted unless a column is named, whose values are then summed)",
    )
    p.add_argument(
        "--no-baselines",
        action="store_true",
        help="skip the baseline sweeps (no equal-cost figure; about 3x faster)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--config", help="config YAML (default: built-in defaults)")
    p.add_argument(
        "--report",
        metavar="DIR",
        type=_report_dir,
        help="write decisions.jsonl, summary.json and a PNG",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve the replay's metrics on 127.0.0.1:PORT, and keep serving until interrupted",
    )
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser(
        "whatif", help="replay your own Prometheus history: what gpuscaler would have done"
    )
    p.add_argument("--config", required=True, help="config YAML with prometheus.url")
    p.add_argument("--since", default="7d", help="start: '7d' ago, RFC 3339 or unix seconds")
    p.add_argument("--until", default="now", help="end: 'now', a duration ago, RFC 3339")
    p.add_argument(
        "--workload", action="extend", nargs="+", metavar="NS/NAME", help="only these workloads"
    )
    p.add_argument("--step", help="read step (default forecast.fit_step, 10s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--jobs", type=_positive_int, default=1, help="workloads replayed at once (processes)"
    )
    p.add_argument(
        "--no-baselines", action="store_true", help="skip the sweeps (no equal-cost verdict)"
    )
    p.add_argument(
        "--report",
        metavar="DIR",
        type=_report_dir,
        help="write decisions.jsonl, summary.json and one PNG per workload",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_whatif)

    p = sub.add_parser("backtest", help="rolling-origin forecast evaluation on a CSV")
    p.add_argument("--series", required=True, help="CSV: timestamp,value[,series]")
    p.add_argument("--horizon", default="5m")
    p.add_argument("--resample", help="bin width, e.g. 1m (irregular or fine series)")
    p.add_argument("--agg", default="mean", choices=["mean", "sum", "max", "count"])
    p.add_argument("--window", help="history per origin (default: metrics.window)")
    p.add_argument(
        "--demand",
        help="CSV of each series' demand (request rate, queue), the leading signal: "
        "same series names, or one series for all",
    )
    p.add_argument(
        "--demand-agg",
        choices=["mean", "sum", "max", "count"],
        help="--resample aggregation of the demand (default: --agg)",
    )
    p.add_argument(
        "--max-origins", type=_positive_int, default=400, help="origins per series at most"
    )
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
            p.add_argument(
                "--external-scaler-port",
                type=int,
                default=None,
                help="KEDA external scaler gRPC port (default: external_scaler.port; 0: off)",
            )
        p.set_defaults(func=func)
    _agent_parser(sub)
    p = sub.add_parser("extender", help="serve the memory-aware kube-scheduler extender")
    p.add_argument("--config", required=True)
    p.add_argument("--port", type=int, default=8888)
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube)")
    p.add_argument(
        "--no-leader-election", action="store_true", help="act without a Lease (one replica only)"
    )
    p.set_defaults(func=cmd_extender)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from gpuscaler.logs import setup_logging

    setup_logging(args.log_level)
    logging.captureWarnings(True)
    if getattr(args, "command", None) == "simulate" and args.hours is None and args.trace is None:
        args.hours = 24.0
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the one error path: see gpuscaler/errors.py
        if args.debug:
            raise
        code, message = explain(e)
        print(f"gpuscaler {args.command}: {message}", file=sys.stderr)
    return code


def explain(e: BaseException) -> tuple[int, str]:
    """Exit code and message for an exception no command handled itself."""
    if isinstance(e, InputError):
        return EXIT_BAD_INPUT, str(e)
    if isinstance(e, OutsideError | OSError):
        return EXIT_FAILURE, str(e) or type(e).__name__
    return EXIT_FAILURE, (
        f"internal error ({type(e).__name__}: {e}); this is a bug in gpuscaler, please report "
        "it. Run again with --debug for the traceback."
    )


if __name__ == "__main__":
    raise SystemExit(main())
