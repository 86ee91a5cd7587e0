"""Leader election on a Lease, on a shared fake clock: against the real kube-apiserver,
and against the fake API server only where API failures must be injected (a real server
cannot be made to fail renewals on demand). Two real `gpuscaler run` processes electing
over a real Lease: tests/e2e/test_as_deployed.py."""

from __future__ import annotations

import random
from typing import Any

import pytest
from controlplane import Kube
from kubefake import FakeCluster
from kubemeta import labels_of
from kubeobjects import node, plugin_configmap
from kubernetes import client

from gpuscaler.adapters.kube.actuator import kube_actuator
from gpuscaler.adapters.kube.nodepools import sharing_config
from gpuscaler.config import LeaseConfig, parse_config
from gpuscaler.core.decisions import FragmentsDecision
from gpuscaler.leader import LeaderElector

LEASE = LeaseConfig(duration="15s", renew_deadline="10s", retry_period="2s")
KEY = ("coordination.k8s.io/v1", "leases", "gpuscaler", "gpuscaler-leader")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


Pair = tuple[LeaderElector, LeaderElector, Clock, FakeCluster]
Real = tuple[LeaderElector, LeaderElector, Clock, Kube, str]


@pytest.fixture
def pair(api: tuple[client.ApiClient, FakeCluster]) -> Pair:
    """Two replicas on one fake clock, electing over one fake API server."""
    clock = Clock()
    return (
        LeaderElector(api[0], "gpuscaler", "replica-a", LEASE, clock=clock),
        LeaderElector(api[0], "gpuscaler", "replica-b", LEASE, clock=clock),
        clock,
        api[1],
    )


@pytest.fixture
def real(kube: Kube) -> Real:
    """Two replicas on one fake clock, electing over the real API server."""
    clock, ns = Clock(), kube.namespace()
    return (
        LeaderElector(kube.api, ns, "replica-a", LEASE, clock=clock),
        LeaderElector(kube.api, ns, "replica-b", LEASE, clock=clock),
        clock,
        kube,
        ns,
    )


def _holder(fake: FakeCluster) -> str | None:
    lease = fake.get(*KEY)
    assert lease is not None
    holder: str | None = lease["spec"].get("holderIdentity")
    return holder


def _real_lease(kube: Kube, ns: str) -> dict[str, Any]:
    return kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/gpuscaler-leader")


def test_of_two_replicas_exactly_one_leads(real: Real) -> None:
    a, b, clock, kube, ns = real
    assert a.step() is True
    assert b.step() is False
    for _ in range(20):  # renewals keep the lease with a
        clock.t += LEASE.retry_period
        assert a.step() is True
        assert b.step() is False
    lease = _real_lease(kube, ns)
    assert lease["spec"]["holderIdentity"] == "replica-a"
    assert lease["spec"]["leaseDurationSeconds"] == 15
    assert lease["spec"]["renewTime"] > lease["spec"]["acquireTime"]  # renewed, same holder


def test_a_leader_that_cannot_renew_stops_acting_before_the_lease_expires_then_a_standby_takes_over(
    pair: Pair,
) -> None:
    a, b, clock, fake = pair
    assert a.step()
    b.step()  # b first sees a's record now
    stopped_acting = took_over = None
    for _ in range(100):
        clock.t += 0.5
        fake.fail_next("PUT", "/leases/", 500)  # a's renewals fail from now on
        a.step()
        if not a.is_leader() and stopped_acting is None:
            stopped_acting = clock.t
        if b.step() and took_over is None:
            took_over = clock.t
        assert not (a.is_leader() and b.is_leader())
        if took_over:
            break
    assert stopped_acting is not None and took_over is not None
    assert stopped_acting - 1000.0 <= LEASE.renew_deadline
    assert took_over - 1000.0 >= LEASE.duration
    assert stopped_acting < took_over
    lease = fake.get(*KEY)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "replica-b"
    assert lease["spec"]["leaseTransitions"] == 1


def test_a_released_lease_is_taken_over_at_once(real: Real) -> None:
    a, b, clock, kube, ns = real
    a.step()
    b.step()
    a.release()
    assert not a.is_leader()
    assert _real_lease(kube, ns)["spec"].get("holderIdentity") is None
    clock.t += LEASE.retry_period
    assert b.step() is True
    lease = _real_lease(kube, ns)
    assert lease["spec"]["holderIdentity"] == "replica-b"
    assert lease["spec"]["leaseTransitions"] == 1


def test_under_random_api_failures_two_replicas_never_lead_at_once(pair: Pair) -> None:
    a, b, clock, fake = pair
    replicas = (a, b)
    rng = random.Random(7)
    leaders_seen = set()
    for i in range(600):
        clock.t += rng.uniform(0.2, 3.0)
        sick = replicas[(i // 100) % 2]  # its API calls mostly fail, for 100 rounds at a time
        for r in replicas:
            if rng.random() < (0.95 if r is sick else 0.2):
                fake.fail_next(rng.choice(["GET", "PUT"]), "/leases/", rng.choice([500, 503]))
            r.step()
            fake.faults.clear()
        acting = [r.identity for r in replicas if r.is_leader()]
        assert len(acting) <= 1, acting
        leaders_seen.update(acting)
    assert leaders_seen == {"replica-a", "replica-b"}  # leadership did move


def test_only_the_leader_writes_to_the_cluster(real: Real) -> None:
    a, b, _, kube, ns = real
    config = parse_config(
        "node_pools: [{name: a100, gpu_memory_gib: 80, selector: {label: nvidia.com/gpu.product, value: NVIDIA-A100-SXM4-80GB}}]\n"
        f"kubernetes: {{device_plugin_config_map: {{namespace: {ns}, name: gpuscaler-sharing-configs}}}}"
    )
    kube.create(plugin_configmap({"ts-4": sharing_config("time-slicing", 4)}, namespace=ns))
    kube.seed([node("gpu-0")])
    a.step()
    b.step()
    decision = FragmentsDecision(1.0, "a100", 2, 4, "forecast upper 30% < 40%")
    standby = kube_actuator(kube.api, config, "replica-b", may_act=b.is_leader)
    assert standby.apply([decision]) == ()
    labels = labels_of(kube.core.read_node("gpu-0"))
    assert labels["nvidia.com/device-plugin.config"] == "ts-2"
    leader = kube_actuator(kube.api, config, "replica-a", may_act=a.is_leader)
    assert leader.apply([decision]) == (decision,)
    labels = labels_of(kube.core.read_node("gpu-0"))
    assert labels["nvidia.com/device-plugin.config"] == "ts-4"
