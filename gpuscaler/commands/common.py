"""What every subcommand shares: the config file or exit 2 and argument types."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuscaler.config import Config, format_duration, load_config, parse_duration
from gpuscaler.core.parsing import parse_count

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2


def config_or_default(path: str | None, require_targets: bool = True) -> Config:
    """The config file (a ConfigError, exit 2, names every problem), or the defaults. `once`,
    `run` and validation need it to say what it manages; `simulate` and `backtest` bring
    their own targets."""
    return Config() if path is None else load_config(path, require_targets)


def cluster_parser(sub: Any, name: str, help_text: str, func: Callable[..., int]) -> Any:
    """The parser of a program against a cluster: its config file and kubeconfig."""
    p = sub.add_parser(name, help=help_text)
    p.add_argument("--config", required=True)
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube)")
    p.set_defaults(func=func)
    return p


def bounded(
    least: float, above: bool = False, parse: Callable[[str], float] = parse_duration
) -> Callable[[str], float]:
    """The argparse type of a finite value `parse` reads (a duration by default), at least
    `least`, or more when `above`."""
    shown = format_duration(least) if parse is parse_duration else f"{least:g}"

    def read(text: str) -> float:
        try:
            value = parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if value < least or (above and value == least):
            raise argparse.ArgumentTypeError(
                f"must be {'more than' if above else 'at least'} {shown}, got {text}"
            )
        return value

    return read


COUNT = bounded(1, parse=parse_count)
"""The argparse type of a whole number of at least 1."""
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
