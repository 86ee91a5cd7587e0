"""The periodic control loop: APScheduler runs `Controller.safe_tick` every interval. No
overlapping ticks (a tick still running skips the next), missed ticks coalesced into one,
SIGTERM / SIGINT wait for a running tick; a failed tick is logged and counted."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import FrameType

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobEvent
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from gpuscaler.controller.tick import Controller

log = logging.getLogger("gpuscaler.loop")


class ControlLoop:
    def __init__(
        self,
        controller: Controller,
        interval: float,
        clock: Callable[[], float] = time.time,
        max_ticks: int | None = None,
    ):
        self.controller = controller
        self.interval = interval
        self.clock = clock
        self.max_ticks = max_ticks
        self.skipped_overlaps = 0
        self._done = threading.Event()
        self._scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=1)},
            job_defaults={
                "coalesce": True,
                "max_instances": 1,
                # A tick later than one interval is stale: run the next one instead.
                "misfire_grace_time": max(1, int(interval)),
            },
            timezone=UTC,
        )

    def _tick(self) -> None:
        if self._done.is_set():  # stopping: no tick starts between the stop and the shutdown
            return
        now = self.clock()
        if not self.controller.due(now):  # a standby between its own, rarer ticks
            return
        self.controller.safe_tick(now)
        stats = self.controller.stats
        if self.max_ticks is not None and stats.ticks + stats.failed >= self.max_ticks:
            self._done.set()

    def _on_overlap(self, event: JobEvent) -> None:
        self.skipped_overlaps += 1
        log.warning("tick still running, next one skipped", extra={"event": "tick_overlap"})

    def stop(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        if signum is not None:
            log.info("received signal %d, stopping", signum, extra={"event": "stopping"})
        self._done.set()

    def run(self, install_signal_handlers: bool = True) -> None:
        """Tick until stopped (signal, `stop()`, or `max_ticks`); then shut down cleanly."""
        if install_signal_handlers:
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        self._scheduler.add_listener(self._on_overlap, EVENT_JOB_MAX_INSTANCES)
        first = datetime.now(UTC)
        self._scheduler.add_job(
            self._tick, "interval", seconds=self.interval, next_run_time=first, id="tick"
        )
        self._scheduler.start()
        log.info("control loop started", extra={"event": "started", "interval_s": self.interval})
        try:
            while not self._done.wait(timeout=0.2):
                pass
        finally:
            self._scheduler.shutdown(wait=True)  # lets a running tick finish
            stats = self.controller.stats
            said = {"event": "stopped", "ticks": stats.ticks, "failed_ticks": stats.failed}
            log.info("control loop stopped", extra=said)
