"""What an operator sees: Prometheus metrics of every tick, and /healthz, /readyz. Label
sets are bounded: targets from the config, kinds and outcomes from fixed lists, reasons
reduced to their leading word; no per-pod labels."""

from __future__ import annotations

import threading
import time
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gpuscaler.config import TIME_SLICE_LEVELS, Config, ConfigError
from gpuscaler.controller import Controller, TickResult
from gpuscaler.core.decisions import FragmentsDecision, PreemptionStep, ReplicaFloorDecision, Skip
from gpuscaler.core.model import Forecast
from gpuscaler.core.preemption import IN_FLIGHT, TRANSITIONS
from gpuscaler.logs import decision_outcome
from gpuscaler.reload import ConfigReloader

_REASON_CLASSES = ("hold", "cooldown", "wait", "at bound", "blocked", "no action")


def reason_class(skip: Skip) -> str:
    found = next((c for c in _REASON_CLASSES if skip.reason.startswith(c)), "other")
    return found.replace(" ", "_")


class ControllerMetrics:
    """Metrics fed by the controller's tick listener; one registry per controller."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        gauge, counter = partial(Gauge, registry=r), partial(Counter, registry=r)
        # what was observed and forecast per target
        self.observed = gauge(
            "gpuscaler_observed_value",
            "Newest observed value of a forecast target "
            "(pool: mean GPU utilization in percent; workload: GPU load in percent of one GPU, "
            "or its serving demand in its demand preset's unit).",
            ["kind", "target"],
        )
        self.forecast = gauge(
            "gpuscaler_forecast_value",
            "Forecast of a target over the horizon: mean and "
            "interval bounds at the horizon's end, and the peaks over the horizon.",
            ["kind", "target", "series"],
        )
        self.forecast_error = gauge(
            "gpuscaler_forecast_recent_error",
            "Recent in-window mean absolute error at the "
            "horizon, per forecasting method (the forecaster's self-assessment).",
            ["kind", "target", "method"],
        )
        self.stall = gauge(
            "gpuscaler_stall_ratio", "Mean GPU stall over the stall window, as a ratio.", ["pool"]
        )
        # decisions and what they set
        self.decisions = counter(
            "gpuscaler_decisions",
            "Decisions and skips by kind, outcome and reason class.",
            ["kind", "outcome", "reason"],
        )
        self.fragments = gauge("gpuscaler_fragments", "Fragments per GPU of a node pool.", ["pool"])
        self.floor = gauge("gpuscaler_replica_floor", "Replica floor of a workload.", ["workload"])
        self.replicas = gauge("gpuscaler_replicas", "Current replicas of a workload.", ["workload"])
        self.time_slice = gauge(
            "gpuscaler_time_slice_level",
            "Time slice level of a node pool (0 default, 1 short, 2 medium, 3 long).",
            ["pool"],
        )
        # the tick, the source, leadership and the config in force
        self.tick_seconds = Histogram(
            "gpuscaler_tick_duration_seconds",
            "Duration of a control tick.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.sample_spacing = gauge(
            "gpuscaler_sample_spacing_seconds",
            "Measured sample spacing of a Prometheus series coarser than metrics.step (a "
            "scrape interval): its points are read from the newest sample within it.",
            ["series"],
        )
        self.ticks_failed = counter("gpuscaler_ticks_failed", "Ticks that raised and were skipped.")
        self.invalid_inputs = gauge(
            "gpuscaler_invalid_inputs",
            "Targets skipped in the last tick because their input "
            "was missing, stale or not finite.",
        )
        self.source_up = gauge(
            "gpuscaler_source_up", "1 when the source answered in the last tick.", ["source"]
        )
        self.leader = gauge("gpuscaler_leader", "1 while this replica is the acting leader.")
        self.config_generation = gauge(
            "gpuscaler_config_generation", "Generation of the config in force."
        )
        self.config_reload_failures = counter(
            "gpuscaler_config_reload_failures",
            "Changed config files refused (invalid, unreadable, not a file, too large).",
        )
        self.last_success = gauge(
            "gpuscaler_last_successful_tick_timestamp_seconds",
            "Unix time of the last tick that completed.",
        )
        # preemption steps and victims
        self.preemption_steps = counter(
            "gpuscaler_preemption_steps",
            "Preemption steps by the tier they lead to (soft, hard, cleanup, done, aborted, "
            "given_up, quarantined), the action and its outcome.",
            ["tier", "action", "outcome"],
        )
        self.preemptions_in_flight = gauge(
            "gpuscaler_preemptions_in_flight", "Victims in the soft, hard or cleanup tier."
        )
        self.preemption_victims = gauge(
            "gpuscaler_preemption_victims", "Victims on record (kept a day), by tier.", ["tier"]
        )
        self.config_generation.set(1)

    def _forecast(self, kind: str, target: str, f: Forecast | None) -> None:
        if f is None:
            return
        self.observed.labels(kind, target).set(f.last_value)
        ends = {"mean": f.mean[-1], "lower": f.lower[-1], "upper": f.upper[-1]}
        for name, value in {**ends, "peak": f.peak, "peak_upper": f.peak_upper}.items():
            self.forecast.labels(kind, target, name).set(float(value))
        for method, err in f.errors.items():
            self.forecast_error.labels(kind, target, method).set(err)

    def on_tick(self, result: TickResult, source: str, source_ok: bool) -> None:
        snap = result.snapshot
        for p in snap.pools:
            self._forecast("pool", p.name, p.utilization.forecast)
            if p.stall_mean_pct is not None:
                self.stall.labels(p.name).set(p.stall_mean_pct / 100)
            if p.fragments is not None:
                self.fragments.labels(p.name).set(p.fragments)
            level = p.time_slice_level or "default"
            if level in TIME_SLICE_LEVELS:
                self.time_slice.labels(p.name).set(TIME_SLICE_LEVELS.index(level))
        for w in snap.workloads:
            self._forecast("workload", w.key, w.load.forecast)
            if w.floor is not None:
                self.floor.labels(w.key).set(w.floor)
            if w.replicas is not None:
                self.replicas.labels(w.key).set(w.replicas)
        for d in result.plan.decisions:
            outcome = decision_outcome(d, result.applied, result.mode)
            self.decisions.labels(d.kind, outcome, "decision").inc()
            if outcome != "applied":
                continue
            match d:
                case FragmentsDecision():
                    self.fragments.labels(d.target).set(d.to_value)
                case ReplicaFloorDecision():
                    self.floor.labels(d.target).set(d.to_value)
        self._preemption(result)
        for s in result.plan.skips:
            outcome = "invalid_input" if s.invalid_input else "held"
            self.decisions.labels(s.kind, outcome, reason_class(s)).inc()
        self.invalid_inputs.set(sum(s.invalid_input for s in result.plan.skips))
        self.tick_seconds.observe(result.seconds)
        self.source_up.labels(source).set(1 if source_ok else 0)
        self.last_success.set(result.plan.time)

    def _preemption(self, result: TickResult) -> None:
        obs = result.snapshot.preemption
        if obs is None:
            return
        tiers = [s.tier for s in obs.states]
        for tier in TRANSITIONS:
            if tier != "none":
                self.preemption_victims.labels(tier).set(tiers.count(tier))
        self.preemptions_in_flight.set(sum(t in IN_FLIGHT for t in tiers))
        for d in result.plan.decisions:
            if isinstance(d, PreemptionStep):
                outcome = decision_outcome(d, result.applied, result.mode)
                self.preemption_steps.labels(d.to_value, d.action, outcome).inc()

    def attach(self, controller: Controller) -> None:
        """Feed these metrics from every tick of `controller`."""

        def listen(result: TickResult) -> None:
            health = getattr(controller.source, "health", None)
            ok = bool(getattr(health, "ok", True))
            self.on_tick(result, controller.source.name, ok)
            for series, spacing in dict(getattr(controller.source, "sample_spacing", {})).items():
                self.sample_spacing.labels(series).set(spacing)
            self.leader.set(1 if controller.is_leader() else 0)

        controller.stats.listeners.append(listen)
        controller.stats.failure_listeners.append(self.ticks_failed.inc)

    def attach_cluster(self, parts: Any) -> None:
        """Kubernetes health and config reloads of a cluster-backed controller
        (`gpuscaler.controller.assembly.ClusterController`)."""

        def listen(result: TickResult) -> None:
            self.source_up.labels("kubernetes").set(1 if parts.reader.healthy else 0)

        parts.controller.stats.listeners.append(listen)
        if parts.reloader is not None:
            self.attach_reloader(parts.reloader)

    def attach_reloader(self, reloader: ConfigReloader) -> None:
        """Count each refused reload and show the generation, as they happen (a refusal
        is counted even when the tick after it fails), in every mode that reloads."""
        refused, reloaded = reloader.on_refused, reloader.on_reload

        def on_refused(e: ConfigError) -> None:
            self.config_reload_failures.inc()
            refused(e)

        def on_reload(config: Config, generation: int) -> None:
            reloaded(config, generation)
            self.config_generation.set(generation)

        reloader.on_refused, reloader.on_reload = on_refused, on_reload
        self.config_generation.set(reloader.generation)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class HealthState:
    """Healthy while ticks complete; ready once the config is valid (always, once running)
    and the first tick has seen its sources."""

    def __init__(self, controller: Controller, interval: float, clock: Any = time.time) -> None:
        self.controller, self.interval, self.clock = controller, interval, clock
        self.started = clock()

    def healthy(self) -> tuple[bool, str]:
        stats = self.controller.stats
        last = max(
            (t for t in (stats.last_success_wall, stats.last_skipped_wall) if t), default=None
        )
        limit = 3 * self.interval + 30  # three missed ticks, plus a slow first one
        since = self.clock() - (last if last is not None else self.started)
        if since > limit:
            return False, f"no tick completed for {since:.0f}s (limit {limit:.0f}s)"
        return True, "ticks complete"

    def ready(self) -> tuple[bool, str]:
        if self.controller.stats.ticks == 0:
            return False, "no tick has completed yet"
        health = getattr(self.controller.source, "health", None)
        if health is not None and getattr(health, "last_success", None) is None:
            return False, f"source {self.controller.source.name} not seen yet"
        return True, "ready"


class Exposition(Protocol):
    """Anything with a text exposition: the controller's metrics, the node agent's."""

    def exposition(self) -> bytes: ...


def serve(
    metrics: Exposition, health: Any, port: int, host: str = "0.0.0.0"
) -> ThreadingHTTPServer:
    """/metrics, /healthz and /readyz on `port` in a daemon thread; returns the server."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                self._send(200, metrics.exposition(), CONTENT_TYPE_LATEST)
            elif self.path.startswith(("/healthz", "/readyz")):
                ok, why = health.healthy() if self.path.startswith("/healthz") else health.ready()
                self._send(200 if ok else 503, why.encode() + b"\n", "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="metrics").start()
    return server


class ReplayHealth:
    """Health for `simulate --metrics-port`: the replay has no live sources."""

    def healthy(self) -> tuple[bool, str]:
        return True, "simulation"

    ready = healthy
