"""`gpuscaler extender`: the extender assembled against Prometheus and the Kubernetes API,
refreshed every cache TTL in a background thread, leader-elected, served by uvicorn."""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time
from typing import Any

import uvicorn
from kubernetes import client

from gpuscaler.adapters.gpuinfo import PrometheusGpus
from gpuscaler.adapters.prometheus.transport import Transport
from gpuscaler.adapters.scheduling import SchedulingKube
from gpuscaler.config import Config
from gpuscaler.core.gpufit import NodeMeta, PodRecord
from gpuscaler.extender.metrics import ExtenderMetrics
from gpuscaler.extender.server import ExtenderApp
from gpuscaler.extender.service import Extender
from gpuscaler.extender.state import GpuState
from gpuscaler.leader import LeaderElector

log = logging.getLogger("gpuscaler.extender")


class ResyncedNodes:
    """Node objects re-read every `period`; pods on every refresh."""

    def __init__(self, kube: SchedulingKube, period: float, clock: Any = time.monotonic):
        self.kube = kube
        self.period = period
        self.clock = clock
        self._nodes: dict[str, NodeMeta] | None = None
        self._read_at = 0.0

    def nodes(self) -> dict[str, NodeMeta]:
        if self._nodes is None or self.clock() - self._read_at >= self.period:
            self._nodes = self.kube.nodes()
            self._read_at = self.clock()
        return self._nodes

    def pods(self) -> list[PodRecord]:
        return self.kube.pods()


class Refresher:
    """Refreshes the state every TTL until stopped, then updates the state metrics."""

    def __init__(self, state: GpuState, app: ExtenderApp, every: float):
        self.state, self.app, self.every = state, app, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="gpu-state")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.state.refresh()
                self.app.observe_state(self.state.pod_uids)
                gc.freeze()  # the long-lived state leaves the GC's scans: no pauses in verbs
            except Exception:  # never let the thread die: the data would only go stale
                log.exception("extender refresh failed")
            self._stop.wait(self.every)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.every + 5)


def serve(
    config: Config, api: client.ApiClient, host: str, port: int, leader_election: bool
) -> None:
    """Serve until SIGTERM/SIGINT (uvicorn handles them); release the Lease after."""
    from gpuscaler.app import identity

    cfg = config.scheduler
    kube = SchedulingKube(api, config)
    gpus = PrometheusGpus(Transport(config.prometheus), cfg.sample_max_age, time.time)
    state = GpuState(
        gpus,
        ResyncedNodes(kube, cfg.node_resync),
        cfg.memory_margin,
        cfg.reservation_ttl,
        time.time,
    )
    elector = None
    if leader_election:
        home = os.environ.get("POD_NAMESPACE") or "gpuscaler"
        elector = LeaderElector(api, cfg.lease.namespace or home, identity(), cfg.lease)
    is_leader = elector.is_leader if elector is not None else (lambda: True)
    metrics = ExtenderMetrics()
    extender = Extender(state, kube, cfg, is_leader, time.time)

    def ready() -> str | None:
        metrics.leader.set(1 if is_leader() else 0)
        if not is_leader():
            return "standby: another replica holds the Lease"
        if state.refreshed_at is None:
            return f"GPU state not read yet: {state.last_error or 'starting'}"
        return None

    app = ExtenderApp(extender, metrics, ready)
    state.refresh()  # the ledger rebuilt from pod annotations before the first verb
    refresher = Refresher(state, app, cfg.cache_ttl)
    refresher.start()
    if elector is not None:
        elector.step()
        elector.start()
    server = uvicorn.Server(
        uvicorn.Config(
            app.build(), host=host, port=port, log_level="warning", access_log=False, lifespan="off"
        )
    )
    log.info("extender serving on %s:%d", host, port, extra={"event": "extender_started"})
    # uvicorn stops on SIGTERM/SIGINT, then re-raises the signal to the handler it found:
    # a no-op one here, so the Lease is released and the exit code is 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        server.run()
    finally:
        refresher.stop()
        if elector is not None:
            elector.stop()
