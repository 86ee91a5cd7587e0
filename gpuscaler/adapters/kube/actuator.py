"""The controller's actuator on a real cluster: each decision to the adapter of its kind
(workloads, node pools, preemption), all writes behind one gate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client

from gpuscaler.adapters.kube.api import KubeError
from gpuscaler.adapters.kube.nodepools import KubeNodePools
from gpuscaler.adapters.kube.reader import ClusterReader
from gpuscaler.adapters.kube.workloads import KubeWorkloads
from gpuscaler.adapters.kube.writer import WriteBudget, Writer
from gpuscaler.config import Config
from gpuscaler.core.decisions import Decision

log = logging.getLogger("gpuscaler.kubernetes")


class KubeActuator:
    """The controller's actuator on a real cluster: each decision to its adapter; a
    failure is logged with its reason and leaves that decision unapplied."""

    def __init__(self, workloads: KubeWorkloads, pools: KubeNodePools, preemption: Any = None):
        self.workloads = workloads
        self.pools = pools
        self.preemption = preemption
        """`gpuscaler.adapters.preemption.KubePreemption`, when preemption may act."""

    def reconfigure(self, config: Config) -> None:
        parts: list[Any] = [self.workloads, self.pools, self.pools.reader, self.workloads.writer]
        if self.preemption is not None:
            parts.append(self.preemption)
        for part in parts:
            part.config = config

    def apply(self, decisions: Sequence[Decision]) -> tuple[Decision, ...]:
        self.pools.continue_rollouts({f"{d.kind}:{d.target}" for d in decisions})
        done = []
        for d in decisions:
            adapter: Any = {"replica_floor": self.workloads, "preemption": self.preemption}.get(
                d.kind, self.pools
            )
            if adapter is None:
                log.warning("%s of %s not applied: no adapter", d.kind, d.target)
                continue
            try:
                if adapter.apply_one(d):
                    done.append(d)
            except KubeError as e:
                log.warning(
                    "%s of %s not applied: %s",
                    d.kind,
                    d.target,
                    e,
                    extra={"event": "not_applied", "kind": d.kind, "target": d.target},
                )
        return tuple(done)


def kube_actuator(
    api: client.ApiClient,
    config: Config,
    identity: str,
    may_act: Callable[[], bool] = lambda: True,
    budget: WriteBudget | None = None,
    namespace: str = "gpuscaler",
    reader: ClusterReader | None = None,
) -> KubeActuator:
    """The actuator for `config`, all writes behind one gate (leadership and budget);
    preemption records live in `namespace` (gpuscaler's own)."""
    from gpuscaler.adapters.kube.eviction import KubePreemption

    writer = Writer(api, config, identity, budget, may_act)
    return KubeActuator(
        KubeWorkloads(api, config, identity, writer),
        KubeNodePools(api, config, writer, reader),
        KubePreemption(api, config, writer, namespace),
    )
