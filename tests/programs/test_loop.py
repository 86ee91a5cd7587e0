"""The control loop: no overlapping ticks, failures counted, a standby's rarer ticks (a clean
stop on SIGTERM: test_entrypoints.py and test_cli_errors.py, with the process as run)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from builders import config

from gpuscaler.controller import Controller
from gpuscaler.controller.loop import ControlLoop
from gpuscaler.core.decisions import Decision
from gpuscaler.core.snapshot import Observations


class SlowSource:
    """Each observation takes `delay` seconds; records how many ran at once."""

    name = "slow"

    def __init__(self, delay: float, fail_on: set[int] | None = None):
        self.delay = delay
        self.fail_on = fail_on or set()
        self.calls = 0
        self.running = 0
        self.max_running = 0
        self.lock = threading.Lock()

    def observe(self, now: float) -> Observations:
        with self.lock:
            self.calls += 1
            call = self.calls
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        try:
            time.sleep(self.delay)
            if call in self.fail_on:
                raise RuntimeError(f"source failed on call {call}")
            return Observations(now)
        finally:
            with self.lock:
                self.running -= 1


class NoActuator:
    def apply(self, decisions: Sequence[Decision]) -> tuple[Decision, ...]:
        return tuple(decisions)


def test_a_tick_slower_than_the_interval_never_overlaps_the_next() -> None:
    source = SlowSource(delay=0.35)
    controller = Controller(config(), source, NoActuator())
    loop = ControlLoop(controller, interval=0.1, max_ticks=4)
    started = time.monotonic()
    loop.run(install_signal_handlers=False)
    assert time.monotonic() - started < 10
    assert source.max_running == 1
    assert controller.stats.ticks == 4
    assert loop.skipped_overlaps >= 1  # runs that came due mid-tick were skipped, not queued


def test_a_failed_tick_is_counted_and_the_loop_goes_on() -> None:
    source = SlowSource(delay=0.0, fail_on={2})
    controller = Controller(config(), source, NoActuator())
    ControlLoop(controller, interval=0.05, max_ticks=4).run(install_signal_handlers=False)
    assert controller.stats.failed == 1
    assert controller.stats.ticks == 3


def test_a_standby_ticks_at_its_own_lower_rate_and_a_leader_every_interval() -> None:
    """A standby keeps its windows and fits warm by ticking once per
    kubernetes.lease.standby_interval (here 120 s against a 30 s interval); a skipped
    tick keeps /healthz alive; once it leads, it ticks every interval again."""
    leading = threading.Event()
    source = SlowSource(delay=0.0)
    cfg = config("control: {interval: 30s}\nkubernetes: {lease: {standby_interval: 120s}}\n")
    controller = Controller(cfg, source, NoActuator(), dry_run=False, is_leader=leading.is_set)
    clock = iter(range(0, 100_000, 30))  # each scheduled run is 30 s of tick time later
    loop = ControlLoop(controller, interval=0.02, clock=lambda: float(next(clock)), max_ticks=3)
    loop.run(install_signal_handlers=False)
    assert source.calls == 3 and controller.stats.last_success == 240.0  # at 0, 120, 240 s
    assert controller.stats.last_skipped_wall is not None
    leading.set()
    loop = ControlLoop(controller, interval=0.02, clock=lambda: float(next(clock)), max_ticks=5)
    loop.run(install_signal_handlers=False)
    assert source.calls == 5 and controller.stats.last_success == 300.0  # 270 and 300 s


def test_a_standby_that_serves_the_external_scalers_floors_ticks_every_interval() -> None:
    """KEDA may ask the standby (tests/e2e/test_extscaler_live.py): its floors must not go
    older than external_scaler.max_age (3 intervals), so it does not slow down."""
    source = SlowSource(delay=0.0)
    cfg = config("control: {interval: 30s}\nkubernetes: {lease: {standby_interval: 120s}}\n")
    controller = Controller(cfg, source, NoActuator(), dry_run=False, is_leader=lambda: False)
    controller.serves_floors = True
    clock = iter(range(0, 100_000, 30))
    loop = ControlLoop(controller, interval=0.02, clock=lambda: float(next(clock)), max_ticks=3)
    loop.run(install_signal_handlers=False)
    assert source.calls == 3 and controller.stats.last_success == 60.0  # at 0, 30, 60 s
