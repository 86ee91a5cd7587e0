"""What every subcommand shares: the config file or exit 2, argument types, a stop signal."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from gpuscaler.config import Config, ConfigError, load_config
from gpuscaler.core.parsing import parse_count

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2


def config_or_exit(path: str | None, require_targets: bool = True) -> Config:
    """The config file, or exit 2 naming every problem. `once`, `run` and validation need
    it to say what it manages; `simulate` and `backtest` bring their own targets."""
    if path is None:
        return Config()
    try:
        return load_config(path, require_targets)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None


def stop_on_signal() -> threading.Event:
    """An event set by SIGTERM or SIGINT."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    return done


def positive_int(text: str) -> int:
    try:
        value = parse_count(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


MIN_MEMORY = 2**27
"""The least `--memory` taken (128 MiB): below it no process fits."""


def memory_size(text: str) -> int:
    """Bytes of a size such as 1GiB, 512MiB, 2G or 1.5GB (pydantic's ByteSize: GiB are
    2**30, GB and G 10**9), at least MIN_MEMORY."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    try:
        value = int(TypeAdapter(ByteSize).validate_python(text))
    except ValidationError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 1GiB or 512MiB") from None
    if value < MIN_MEMORY:
        raise argparse.ArgumentTypeError(f"{text!r} is less than 128MiB")
    return value


def report_dir(text: str) -> str:
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    return text
