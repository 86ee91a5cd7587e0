"""Command line: validate-config, simulate, whatif, backtest, once, run, agent, extender.

Exit codes: 0 success, 2 bad input (config, trace, arguments), 1 a failure at run time.
Bad input never prints a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from gpuscaler.commands.common import EXIT_BAD_INPUT, EXIT_FAILURE
from gpuscaler.commands.control import add_controller_parsers
from gpuscaler.commands.offline import (
    add_backtest_parser,
    add_simulate_parser,
    add_whatif_parser,
    cmd_validate,
)
from gpuscaler.commands.programs import add_agent_parser, add_extender_parser
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

    add_simulate_parser(sub)
    add_whatif_parser(sub)
    add_backtest_parser(sub)
    add_controller_parsers(sub)
    add_agent_parser(sub)
    add_extender_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from gpuscaler.logs import setup_logging
    from gpuscaler.setup import one_blas_thread

    setup_logging(args.log_level)
    one_blas_thread()
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
