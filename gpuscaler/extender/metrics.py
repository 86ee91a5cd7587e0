"""The extender's Prometheus metrics (own registry, served on its /metrics).

Labels stay bounded: verb, reason, node and pool (nodes are the cluster's GPU nodes), never
pods. The oldest unschedulable pod is a single gauge, for the "unschedulable by the
extender for more than 10 minutes" alert.
"""

from __future__ import annotations

from collections import Counter
from functools import partial

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.exposition import generate_latest

from gpuscaler.extender.state import Snapshot

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
REASONS = (
    "insufficient_memory",
    "insufficient_gpus",
    "stale",
    "unknown_node",
    "no_gpu_data",
    "bad_annotation",
    "bad_node_annotation",
    "not_ours",
)


class ExtenderMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        gauge, counter = partial(Gauge, registry=r), partial(PromCounter, registry=r)
        self.latency = Histogram(
            "gpuscaler_extender_request_duration_seconds",
            "Time to answer kube-scheduler, per verb",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rejections = counter(
            "gpuscaler_extender_filter_rejections",
            "Nodes the filter refused, by reason",
            ["reason"],
        )
        self.binds = counter("gpuscaler_extender_binds", "Bind verbs, by outcome", ["outcome"])
        self.bad_requests = counter(
            "gpuscaler_extender_bad_requests", "Bodies that were not the protocol"
        )
        self.node_fragmentation = gauge(
            "gpuscaler_extender_node_fragmentation",
            "Stddev of the per-GPU memory-used ratio of a node (reservations included)",
            ["node"],
        )
        self.pool_fragmentation = gauge(
            "gpuscaler_extender_pool_fragmentation",
            "Mean node fragmentation of a node pool",
            ["pool"],
        )
        self.reservations = gauge(
            "gpuscaler_extender_reservations_in_flight",
            "Bound pods whose GPU memory is reserved until measured memory shows them",
        )
        self.stale_nodes = gauge(
            "gpuscaler_extender_stale_nodes",
            "GPU nodes whose data is older than the cache TTL",
            ["state"],
        )
        self.oldest_unschedulable = gauge(
            "gpuscaler_extender_oldest_unschedulable_seconds",
            "How long the longest-refused pod has found no node (0: none)",
        )
        self.leader = gauge("gpuscaler_extender_leader", "1 when this replica holds the Lease")
        for reason in REASONS:
            self.rejections.labels(reason)
        for outcome in ("bound", "refused"):
            self.binds.labels(outcome)
        for state in ("stale_scored", "stale"):
            self.stale_nodes.labels(state)

    def rejected(self, reasons: Counter[str]) -> None:
        for reason, n in reasons.items():
            self.rejections.labels(reason).inc(n)

    def observe_state(
        self, snap: Snapshot, ages: Counter[str], reservations: int, unschedulable_for: float
    ) -> None:
        self.node_fragmentation.clear()
        pools: dict[str, list[float]] = {}
        for name, view in snap.views.items():
            self.node_fragmentation.labels(name).set(view.fragmentation)
            meta = snap.meta.get(name)
            if meta is not None and meta.pool is not None:
                pools.setdefault(meta.pool, []).append(view.fragmentation)
        self.pool_fragmentation.clear()
        for pool, values in pools.items():
            self.pool_fragmentation.labels(pool).set(sum(values) / len(values))
        for state in ("stale_scored", "stale"):
            self.stale_nodes.labels(state).set(ages.get(state, 0))
        self.reservations.set(reservations)
        self.oldest_unschedulable.set(unschedulable_for)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
