"""`gpuscaler extender`: the extender assembled against Prometheus and the Kubernetes API,
refreshed every cache TTL in a background thread, leader-elected, served by uvicorn."""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
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
from gpuscaler.setup import SetupError, identity

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


CONNECTIONS = 32
"""Connections at once (more get 503): kube-scheduler sends one verb at a time plus the
binds in flight; with max_body_bytes this bounds the memory held by bodies."""


def listen(host: str, port: int) -> socket.socket:
    """A listening socket, or SetupError naming the address (exit 2, nothing served)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        raise SetupError(f"extender: cannot listen on {host}:{port}: {e.strerror or e}") from None


class Probes:
    """/healthz and /readyz of the metrics port (observability.serve)."""

    def __init__(self, ready: Callable[[], str | None]):
        self._ready = ready

    def healthy(self) -> tuple[bool, str]:
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        problem = self._ready()
        return problem is None, problem or "ok"


def serve(
    config: Config,
    api: client.ApiClient,
    host: str,
    port: int,
    leader_election: bool,
    metrics_port: int | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (uvicorn handles them); release the Lease after. An
    address that cannot be listened on or TLS files that cannot be read: SetupError
    before anything is served."""
    from gpuscaler.observability import serve as serve_metrics

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
    tls: dict[str, Any] = {}
    if cfg.tls_cert_file is not None:  # mutual TLS: the client must present a certificate
        tls = {"ssl_certfile": cfg.tls_cert_file, "ssl_keyfile": cfg.tls_key_file}
        tls |= {"ssl_ca_certs": cfg.client_ca_file, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    sock = listen(host, port)
    uv = uvicorn.Config(
        app.build(), log_level="warning", access_log=False, lifespan="off",
        limit_concurrency=CONNECTIONS, **tls,
    )  # fmt: skip
    try:
        uv.load()
        side = serve_metrics(metrics, Probes(ready), metrics_port, host) if metrics_port else None
    except OSError as e:  # ssl.SSLError is one: a TLS file unreadable or not PEM
        sock.close()
        raise SetupError(f"extender: {e}") from None
    scheme = "https" if tls else "http"
    paths = "/filter, /prioritize, /bind, /healthz, /readyz, /metrics"
    print(f"serving {paths} on {scheme}://{host}:{port}", file=sys.stderr)
    state.refresh()  # the ledger rebuilt from pod annotations before the first verb
    refresher = Refresher(state, app, cfg.cache_ttl)
    refresher.start()
    if elector is not None:
        elector.step()
        elector.start()
    server = uvicorn.Server(uv)
    log.info("extender serving on %s:%d", host, port, extra={"event": "extender_started"})
    # uvicorn stops on SIGTERM/SIGINT, then re-raises the signal to the handler it found:
    # a no-op one here, so the Lease is released and the exit code is 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        server.run(sockets=[sock])
    finally:
        refresher.stop()
        if side is not None:
            side.shutdown()
        if elector is not None:
            elector.stop()
