"""Structured logs: one JSON object per line (or readable text on a terminal)."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from gpuscaler.core.decisions import Decision
from gpuscaler.core.model import Plan

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

decisions_log = logging.getLogger("gpuscaler.decisions")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str = "INFO", json_lines: bool | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    text = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(JsonFormatter() if json_lines else text)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def decision_outcome(d: Decision, applied: tuple[Decision, ...], mode: str) -> str:
    """applied | not_applied when acting; else the mode (dry_run, standby)."""
    if mode != "acting":
        return mode
    return "applied" if any(a is d for a in applied) else "not_applied"


def log_plan(plan: Plan, applied: tuple[Decision, ...], mode: str) -> None:
    for d in plan.decisions:
        outcome = decision_outcome(d, applied, mode)
        decisions_log.info(
            "%s %s: %s -> %s (%s)",
            d.kind,
            d.target,
            d.from_value,
            d.to_value,
            d.reason,
            extra={"event": "decision", "outcome": outcome, **d.as_record()},
        )
    for s in plan.skips:  # bad input is a warning every tick; a target held is detail
        decisions_log.log(
            logging.WARNING if s.invalid_input else logging.DEBUG,
            "%s %s: %s",
            s.kind,
            s.target,
            s.reason,
            extra={"event": "skip", **s.as_record()},
        )
    counts = {"decisions": len(plan.decisions), "applied": len(applied), "skipped": len(plan.skips)}
    decisions_log.info(
        "tick: %d decisions, %d applied, %d skipped",
        *counts.values(),
        extra={
            "event": "tick",
            "mode": mode,
            "tick_time": plan.time,
            **counts,
            "invalid_inputs": sum(s.invalid_input for s in plan.skips),
        },
    )
