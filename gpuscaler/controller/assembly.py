"""Assembly of the controller against a real cluster: Prometheus for metrics, the
Kubernetes API for state and actions, a Lease for leadership, the config file for reload.
Nothing here parses arguments or prints."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes import client

from gpuscaler.adapters.kube.actuator import kube_actuator
from gpuscaler.adapters.kube.api import BoundedApiClient
from gpuscaler.adapters.kube.cluster import current_state, load_cluster_snapshot, with_discovered
from gpuscaler.adapters.kube.preemption_reader import PreemptionReader, preemption_observation
from gpuscaler.adapters.kube.reader import ClusterReader
from gpuscaler.adapters.kube.writer import Writer
from gpuscaler.adapters.prometheus.memory import GpuMemoryProbe
from gpuscaler.config import Config, ConfigError
from gpuscaler.controller.tick import Controller
from gpuscaler.core.decisions import Decision
from gpuscaler.core.preemption import PreemptionObservation
from gpuscaler.core.snapshot import Observations
from gpuscaler.leader import LeaderElector
from gpuscaler.reload import ConfigReloader
from gpuscaler.setup import SetupError, identity
from gpuscaler.sources import PrometheusSource


class NoActuator:
    """For plans against a file or a state: nothing can be changed."""

    def apply(self, decisions: Any) -> tuple[Decision, ...]:
        return ()


def snapshot_controller(config: Config, path: str) -> Controller:
    """Shadow mode: cluster state from a `kubectl get -o yaml` dump, metrics from
    Prometheus, always dry."""
    if not config.prometheus.url:
        raise SetupError("--cluster-snapshot plans on metrics: set prometheus.url in the config")
    objects = load_cluster_snapshot(path, config)  # ClusterStateError: `once` exits 2
    config = with_discovered(config, objects)
    state = current_state(objects, config)
    preemption = preemption_observation(
        objects, config, list(objects.priority_classes), list(objects.disruption_budgets)
    )
    source = ClusterSource(PrometheusSource(config, state), _Fixed(preemption))
    return Controller(config, source, NoActuator(), dry_run=True)


class _Fixed:
    """A preemption observation read once (from a file)."""

    def __init__(self, seen: PreemptionObservation):
        self.seen = seen

    def observe(self, now: float) -> PreemptionObservation:
        return self.seen

    def reconfigure(self, config: Config) -> None:
        pass


class ClusterSource:
    """Prometheus metrics and cluster state, plus what preemption needs (pods, records,
    GPU memory of gone victims) when preemption is enabled."""

    name = "prometheus"

    def __init__(self, prometheus: PrometheusSource, preemption: PreemptionReader | _Fixed):
        self.prometheus = prometheus
        self.preemption = preemption
        self.health = prometheus.health
        self.sample_spacing = prometheus.spacing.measured

    def reconfigure(self, config: Config) -> None:
        self.prometheus.reconfigure(config)
        self.preemption.reconfigure(config)

    def after_tick(self) -> None:
        self.prometheus.after_tick()

    def close(self) -> None:
        self.prometheus.close()

    def observe(self, now: float) -> Observations:
        raw = self.prometheus.observe(now)  # reads the cluster first
        if not self.prometheus.config.preemption.enabled:
            return raw
        return replace(raw, preemption=self.preemption.observe(now))


def own_pod_event(writer: Writer, reason: str, action: str, note: str) -> None:
    """A Warning Event on gpuscaler's own pod (kubectl describe pod); none outside a pod."""
    pod, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    if pod and namespace:
        uid = os.environ.get("POD_UID")
        ref = client.V1ObjectReference(
            api_version="v1", kind="Pod", name=pod, namespace=namespace, uid=uid
        )
        writer.event(ref, namespace, reason, action, note, type_="Warning")


class Discovery:
    """Each tick's config: the file's plus the workloads this tick's objects opt in,
    swapped into the controller once, before anything observes."""

    def __init__(self, base: Config, reader: ClusterReader, controller: Controller):
        self.base, self.reader, self.controller = base, reader, controller  # base: the file's
        self.reloaded = False

    def reload(self, new_base: Config) -> None:
        self.base, self.reloaded = new_base, True

    def discover(self) -> None:
        objects = self.reader.prefetch()
        known = objects if objects is not None else self.reader.last_objects
        want = with_discovered(self.base, known)
        if self.reloaded or want.workloads != self.controller.config.workloads:
            self.controller.reconfigure(want)  # the source's and the actuator's parts follow
            if self.reloaded:
                self.reader.drop_prefetched()  # nodes are parsed with the config: read again
            self.reloaded = False


@dataclass
class ClusterController:
    """The controller and the parts around it that `run` starts and stops."""

    controller: Controller
    reader: ClusterReader
    elector: LeaderElector | None
    reloader: ConfigReloader | None
    refused: list[ConfigError] = field(default_factory=list)
    cache: Any = None
    """The watch cache (`adapters.kube.cache.ClusterCache`) when the reader uses one."""

    def stop(self) -> None:
        for part in (self.elector, self.cache):
            if part is not None:
                part.stop()
        close = getattr(self.controller.source, "close", None)
        if close is not None:
            close()  # the background backfill and the query pool


def cluster_controller(
    config: Config,
    api: client.ApiClient,
    dry_run: bool,
    config_path: str | None = None,
    leader_election: bool = True,
) -> ClusterController:
    """Prometheus + Kubernetes; leader-elected acting; the config file reloaded before
    each tick; opted-in ScaledObjects and HPAs the config does not list discovered."""
    me = identity()
    home = os.environ.get("POD_NAMESPACE") or "gpuscaler"  # where gpuscaler's own objects live
    reader, preemption_reader, cache = _readers(api, config, home)
    elector = None
    if leader_election:
        lease = config.kubernetes.lease
        elector = LeaderElector(api, lease.namespace or home, me, lease)
    may_act = elector.is_leader if elector is not None else (lambda: True)
    actuator = kube_actuator(api, config, me, may_act=may_act, namespace=home, reader=reader)
    prometheus = PrometheusSource(config, reader.state)
    preemption = preemption_reader(
        api, config, reader, home, GpuMemoryProbe(config, prometheus.transport)
    )
    source = ClusterSource(prometheus, preemption)
    controller = Controller(config, source, actuator, dry_run=dry_run, is_leader=may_act)
    own_events = Writer(api, config, me)
    # One Warning Event per tick that found series sampled more coarsely than metrics.step,
    # naming them (each series is found once: adapters/prometheus/spacing.py).
    coarse: list[str] = []
    prometheus.spacing.listeners.append(
        lambda key, spacing, step: coarse.append(f"{key} every {spacing:g}s")
    )

    def announce(_: object) -> None:
        if coarse:
            note = (
                f"{len(coarse)} series sampled more coarsely than metrics.step "
                f"{prometheus.spacing.step:g}s (a scrape interval?): each point is read from "
                "the newest sample within its spacing instead of seeing gaps: " + ", ".join(coarse)
            )
            own_pod_event(own_events, "CoarseSamples", "ReadMetrics", note)
            coarse.clear()

    controller.stats.listeners.append(announce)
    parts = ClusterController(controller, reader, elector, None, cache=cache)
    warm_file = config.prometheus.warm_state_file  # windows saved after ticks, read at start
    if warm_file:
        from gpuscaler.adapters.prometheus.warm import WarmStart

        warm = WarmStart(prometheus, warm_file, config.prometheus.warm_state_every)
        controller.stats.listeners.append(lambda result: warm.after_tick(result.snapshot.time))
    discovery = Discovery(config, reader, controller)
    controller.before_tick.append(discovery.discover)
    if isinstance(api, BoundedApiClient):
        controller.before_tick.insert(0, api.begin_tick)
    if config_path is not None:

        def refused(e: ConfigError) -> None:
            parts.refused.append(e)
            note = "new config refused, the running one stays: " + "; ".join(e.problems)
            own_pod_event(own_events, "ConfigRefused", "ReloadConfig", note)

        parts.reloader = ConfigReloader(config_path, lambda c, _: discovery.reload(c), refused)
        controller.before_tick.insert(0, parts.reloader.check)
    return parts


def _readers(api: client.ApiClient, config: Config, home: str) -> tuple[ClusterReader, Any, Any]:
    """The cluster reader, the preemption reader's class and the watch cache they share;
    listing readers when `kubernetes.watch_cache` is off."""
    if not config.kubernetes.watch_cache:
        return ClusterReader(api, config), PreemptionReader, None
    from functools import partial

    from gpuscaler.adapters.kube.cache import (
        CachedClusterReader,
        CachedPreemptionReader,
        ClusterCache,
    )

    cache = ClusterCache(api, home, config.kubernetes).start()
    return (
        CachedClusterReader(api, config, cache),
        partial(CachedPreemptionReader, cache=cache),
        cache,
    )
