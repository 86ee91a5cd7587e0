"""The controller's actuator on a real cluster: each decision to the adapter of its kind."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kubernetes import client

from gpuscaler.adapters.kube.api import KubeError
from gpuscaler.adapters.kube.drapools import KubeDraPools
from gpuscaler.adapters.kube.eviction import KubePreemption
from gpuscaler.adapters.kube.nodepools import KubeNodePools
from gpuscaler.adapters.kube.reader import ClusterReader
from gpuscaler.adapters.kube.workloads import KubeWorkloads
from gpuscaler.adapters.kube.writer import WriteBudget, Writer
from gpuscaler.config import Config
from gpuscaler.core.decisions import (
    Decision,
    FragmentsDecision,
    PreemptionStep,
    ReplicaFloorDecision,
    TimeSliceDecision,
)

log = logging.getLogger("gpuscaler.kubernetes")


@dataclass(eq=False)
class KubeActuator:
    """A failure is logged with its reason and leaves that decision unapplied."""

    workloads: KubeWorkloads
    pools: KubeNodePools
    preemption: KubePreemption | None = None
    dra: KubeDraPools | None = None
    """A pool some DRA object opted in to is shared under DRA: its decisions go there."""

    def reconfigure(self, config: Config) -> None:
        self.workloads.config = config
        self.workloads.writer.config = config
        self.pools.config = config
        self.pools.reader.config = config
        if self.preemption is not None:
            self.preemption.config = config
        if self.dra is not None:
            self.dra.config = config

    def apply_one(self, d: Decision) -> bool:
        match d:
            case ReplicaFloorDecision():
                return self.workloads.set_floor(d)
            case FragmentsDecision() | TimeSliceDecision():
                if self.dra is not None and self.dra.manages(d.target):
                    return self.dra.apply_one(d)
                return self.pools.apply_one(d)
            case PreemptionStep():
                if self.preemption is None:
                    log.warning("%s of %s not applied: no adapter", d.kind, d.target)
                    return False
                return self.preemption.apply_one(d)

    def apply(self, decisions: Sequence[Decision]) -> tuple[Decision, ...]:
        skip = {f"{d.kind}:{d.target}" for d in decisions}
        self.pools.continue_rollouts(skip)
        if self.dra is not None:
            self.dra.continue_rollouts(skip)
        done = []
        for d in decisions:
            try:
                if self.apply_one(d):
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
    """The actuator for `config`, all writes behind one gate; preemption records live in
    `namespace` (gpuscaler's own)."""
    writer = Writer(api, config, identity, budget, may_act)
    pools = KubeNodePools(api, config, writer, reader)
    return KubeActuator(
        KubeWorkloads(api, config, identity, writer),
        pools,
        KubePreemption(api, config, writer, namespace),
        KubeDraPools(api, config, writer, pools.reader, namespace)
        if config.kubernetes.dra.enabled
        else None,
    )
