"""Command line: validate-config, simulate, backtest, once, run, agent, extender.

Exit codes: 0 success, 2 bad input (config, trace, arguments), 1 a failure at run time.
Bad input never prints a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from gpuscaler.commands.common import EXIT_BAD_INPUT, EXIT_FAILURE, positive_int, report_dir
from gpuscaler.commands.control import cmd_once, cmd_run
from gpuscaler.commands.offline import cmd_backtest, cmd_simulate, cmd_validate
from gpuscaler.commands.programs import add_agent_parser, cmd_extender
from gpuscaler.errors import InputError, OutsideError

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


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
        type=report_dir,
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

    p = sub.add_parser("backtest", help="rolling-origin forecast evaluation on a CSV")
    p.add_argument("--series", required=True, help="CSV: timestamp,value[,series]")
    p.add_argument("--horizon", default="5m")
    p.add_argument("--resample", help="bin width, e.g. 1m (irregular or fine series)")
    p.add_argument("--agg", default="mean", choices=["mean", "sum", "max", "count"])
    p.add_argument("--window", help="history per origin (default: metrics.window)")
    p.add_argument(
        "--max-origins", type=positive_int, default=400, help="origins per series at most"
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
        p.set_defaults(func=func)
    add_agent_parser(sub)
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
