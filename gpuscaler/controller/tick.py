"""The imperative shell around the core: one tick = observe, forecast, plan, act, record;
the same against a real cluster (`loop`) and a simulated one."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuscaler.config import Config
from gpuscaler.core.decisions import Decision
from gpuscaler.core.forecast import EMPTY
from gpuscaler.core.model import History, Plan, Snapshot, record_applied
from gpuscaler.core.plan import plan as make_plan
from gpuscaler.core.snapshot import Observations, build_snapshot
from gpuscaler.logs import log_plan

log = logging.getLogger("gpuscaler.controller")


class ObservationSource(Protocol):
    """Reads metrics and cluster state as of `now`."""

    name: str

    def observe(self, now: float) -> Observations: ...


class Actuator(Protocol):
    """Carries decisions out; returns those that took effect."""

    def apply(self, decisions: Sequence[Decision]) -> tuple[Decision, ...]: ...


@dataclass(frozen=True)
class TickResult:
    snapshot: Snapshot
    plan: Plan
    applied: tuple[Decision, ...]
    seconds: float
    mode: str = "acting"
    """acting (the plan was carried out), dry_run, or standby (another replica leads)."""


@dataclass
class TickStats:
    ticks: int = 0
    failed: int = 0
    last_success: float | None = None
    """Tick time (`now`) of the last tick that completed."""
    last_success_wall: float | None = None
    last_skipped_wall: float | None = None
    """When a standby last skipped a tick (`Controller.due`): alive too."""
    listeners: list[Callable[[TickResult], None]] = field(default_factory=list)
    failure_listeners: list[Callable[[], None]] = field(default_factory=list)


class Controller:
    def __init__(
        self,
        config: Config,
        source: ObservationSource,
        actuator: Actuator,
        dry_run: bool | None = None,
        log_decisions: bool = True,
        is_leader: Callable[[], bool] | None = None,
    ):
        self.config, self.source, self.actuator = config, source, actuator
        self.dry_run = config.control.dry_run if dry_run is None else dry_run
        self.is_leader: Callable[[], bool] = is_leader or (lambda: True)
        """Standbys observe and plan (their forecasts stay warm) but never act."""
        self.serves_floors = False
        """KEDA's external scaler answers from this replica's plan: tick every interval."""
        self.before_tick: list[Callable[[], object]] = []
        """Run first in every tick: config reload, workload discovery."""
        self.history = History()
        self.stats = TickStats()
        self.log_decisions = log_decisions
        self.forecast_state = EMPTY
        """Every series' forecasting state, carried to the next tick."""

    def reconfigure(self, config: Config) -> None:
        """Use `config` from the next tick on; history and model state are kept."""
        self.config = config
        for part in (self.source, self.actuator):
            reconfigure = getattr(part, "reconfigure", None)
            if reconfigure is not None:
                reconfigure(config)

    def mode(self) -> str:
        if self.dry_run or self.config.control.dry_run:
            return "dry_run"
        return "acting" if self.is_leader() else "standby"

    def due(self, now: float) -> bool:
        """Whether a tick is due at `now`: always for a leader (or a dry run); for a standby
        once per `kubernetes.lease.standby_interval`, unless it serves floors to KEDA."""
        last = self.stats.last_success
        if self.mode() != "standby" or last is None or self.serves_floors:
            return True
        if now - last >= self.config.kubernetes.lease.standby_interval:
            return True
        self.stats.last_skipped_wall = time.time()
        return False

    def tick(self, now: float) -> TickResult:
        started = time.perf_counter()
        for hook in self.before_tick:
            hook()
        raw = self.source.observe(now)
        snapshot, self.forecast_state = build_snapshot(raw, self.config, now, self.forecast_state)
        plan = make_plan(snapshot, self.config, self.history, now)
        mode = self.mode()
        applied = self.actuator.apply(plan.decisions) if mode == "acting" else ()
        self.history = record_applied(plan.history, applied)
        result = TickResult(snapshot, plan, applied, time.perf_counter() - started, mode)
        self.stats.ticks += 1
        self.stats.last_success = now
        self.stats.last_success_wall = time.time()
        if self.log_decisions:
            log_plan(plan, applied, mode)
        for listener in self.stats.listeners:
            listener(result)
        after_tick = getattr(self.source, "after_tick", None)
        if after_tick is not None:
            after_tick()  # work for the time between ticks (a background backfill)
        return result

    def safe_tick(self, now: float) -> TickResult | None:
        """A tick whose failure is logged and counted; the loop goes on."""
        try:
            return self.tick(now)
        except Exception:
            self.stats.failed += 1
            log.exception("tick failed", extra={"event": "tick_failed", "tick_time": now})
            for listener in self.stats.failure_listeners:
                listener()
            return None
