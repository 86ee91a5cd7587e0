"""Kubernetes API faults a real server cannot produce on demand (never answering, refused,
a conflict on every try): calls and a tick's API time are bounded, transport failures flag
targets, conflict retries are as docs/failure-behaviour.md states."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from builders import NOW, run_cli
from draobjects import API, claim_template, gpu_slice
from kubefake import FakeCluster, fake_apiserver, kubeconfig_for
from kubeobjects import node, scaled_object
from kubernetes import client

from gpuscaler.adapters.kube.actuator import kube_actuator
from gpuscaler.adapters.kube.api import NO_ANSWER, BoundedApiClient
from gpuscaler.adapters.kube.reader import ClusterReader
from gpuscaler.adapters.kube.writer import MAX_CONFLICT_RETRIES
from gpuscaler.config import parse_config
from gpuscaler.core.decisions import FragmentsDecision, ReplicaFloorDecision

ROOT = Path(__file__).resolve().parents[2]
CONFIG = parse_config(
    """
workloads:
  - {namespace: ml, kind: ScaledObject, name: chat}
  - {namespace: ml, kind: HorizontalPodAutoscaler, name: embed}
"""
)


def _decision(target: str, old: int, new: int) -> ReplicaFloorDecision:
    return ReplicaFloorDecision(NOW, target, old, new, "forecast upper 490% -> 7 replicas")


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers (until the test ends)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not done.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        done.set()
        thread.join(timeout=5)
        for s in held:
            s.close()
        listener.close()


@pytest.fixture
def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there any more


def _bounded(url: str, **kw: Any) -> BoundedApiClient:
    return BoundedApiClient(client.Configuration(host=url), **kw)


def test_a_server_that_never_answers_flags_every_target_within_the_read_timeout(
    silent_server: str,
) -> None:
    api = _bounded(silent_server, connect_timeout=1, read_timeout=0.5)
    reader = ClusterReader(api, CONFIG)
    started = time.monotonic()
    state = reader.state()
    assert time.monotonic() - started < 5
    assert set(state.problems) == {f"workload:{w.key}" for w in CONFIG.workloads}
    assert all("no answer from the API server in time" in p for p in state.problems.values())
    assert reader.healthy is False


def test_a_refused_connection_flags_every_target_instead_of_failing_the_tick(
    closed_port: str,
) -> None:
    reader = ClusterReader(_bounded(closed_port), CONFIG)
    state = reader.state()
    assert state.problems
    assert all("cannot connect to the API server" in p for p in state.problems.values())


def test_once_against_an_unreachable_api_server_plans_no_action_and_says_why(
    tmp_path: Path, closed_port: str
) -> None:
    kubeconfig = kubeconfig_for(closed_port, tmp_path / "kubeconfig")
    config = tmp_path / "gpuscaler.yaml"
    config.write_text(
        "prometheus: {url: 'http://127.0.0.1:1'}\n"
        "workloads:\n  - {namespace: ml, kind: ScaledObject, name: chat}\n"
    )
    out = run_cli("once", "--config", str(config), "--kubeconfig", str(kubeconfig), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert "cannot connect to the API server" in out.stdout
    assert '"kind": "replica_floor"' in out.stdout and '"outcome"' not in out.stdout


def test_a_spent_tick_budget_fails_further_calls_at_once_and_the_next_tick_starts_afresh(
    silent_server: str,
) -> None:
    api = _bounded(silent_server, connect_timeout=1, read_timeout=5, tick_budget=0.4)
    core = client.CoreV1Api(api)
    api.begin_tick()
    started = time.monotonic()
    for _ in range(3):
        with pytest.raises(client.ApiException) as info:
            core.list_node(_preload_content=False)
        assert info.value.status == NO_ANSWER
    assert time.monotonic() - started < 2.5  # one cut-short wait, then immediate refusals
    assert "budget" in str(info.value.reason)
    api.begin_tick()
    with pytest.raises(client.ApiException) as info:
        core.list_node(_preload_content=False)
    assert "no answer" in str(info.value.reason)


def test_the_budget_belongs_to_the_tick_thread_not_to_lease_renewals(silent_server: str) -> None:
    api = _bounded(silent_server, connect_timeout=1, read_timeout=0.3, tick_budget=0.01)
    api.begin_tick()
    time.sleep(0.05)
    reasons: list[str] = []

    def renew() -> None:
        try:
            client.CoordinationV1Api(api).list_namespaced_lease("x", _preload_content=False)
        except client.ApiException as e:
            reasons.append(str(e.reason))

    other = threading.Thread(target=renew)
    other.start()
    other.join(timeout=10)
    assert reasons and "budget" not in reasons[0] and "no answer" in reasons[0]


def test_a_conflict_on_every_try_stops_after_the_stated_retries_and_changes_nothing() -> None:
    with (
        fake_apiserver() as (url, cluster),
        client.ApiClient(client.Configuration(host=url)) as api,
    ):
        fake: FakeCluster = cluster
        fake.add("keda.sh/v1alpha1", "scaledobjects", scaled_object("chat", 2))
        for _ in range(MAX_CONFLICT_RETRIES + 2):
            fake.fail_next("PATCH", r"/scaledobjects/chat$", 409)
        actuator = kube_actuator(api, CONFIG, identity="t")
        assert actuator.apply([_decision("ml/ScaledObject/chat", 2, 7)]) == ()
        patches = [r for r in fake.requests if r[0] == "PATCH"]
        assert len(patches) == 1 + MAX_CONFLICT_RETRIES
        obj = fake.get("keda.sh/v1alpha1", "scaledobjects", "ml", "chat")
        assert obj is not None and obj["spec"]["minReplicaCount"] == 2
    documented = (ROOT / "docs" / "failure-behaviour.md").read_text()
    assert f"retried at most {MAX_CONFLICT_RETRIES} times" in documented


def test_a_template_deleted_but_not_created_again_is_created_on_the_next_tick(
    api: tuple[client.ApiClient, FakeCluster],
) -> None:
    """The replacement's second half failing (a fault the real server has no switch for)
    must not lose the template: its new body is stored before the delete and created by
    the next tick, even one of a restarted controller."""
    kube, fake = api
    config = parse_config(
        "node_pools: [{name: dra, gpu_memory_gib: 40, selector: {label: pool, value: dra}}]"
    )
    fake.add("v1", "nodes", node("dra-0", config=None, extra_labels={"pool": "dra"}))
    fake.add(API, "resourceslices", gpu_slice("dra-0", 1, sharing=True))
    template = claim_template("ml", "quarter", memory="10Gi")
    template["metadata"]["labels"] = {"gpuscaler.io/pool": "dra"}
    fake.add(API, "resourceclaimtemplates", template)
    path = f"/apis/{API}/namespaces/ml/resourceclaimtemplates"
    fake.fail_next("POST", f"{path}$", 500)
    actuator = kube_actuator(kube, config, "gpuscaler-abc")
    assert actuator.apply([FragmentsDecision(NOW, "dra", 4, 2, "r")]) == ()
    assert (API, "resourceclaimtemplates", "ml", "quarter") not in fake.objects
    pending = fake.objects[("v1", "configmaps", "gpuscaler", "gpuscaler-dra-templates")]
    assert list(pending["data"]) == ["ml.quarter"]
    kube_actuator(kube, config, "gpuscaler-abc").apply([])  # the next tick, after a restart
    assert not fake.objects[("v1", "configmaps", "gpuscaler", "gpuscaler-dra-templates")].get(
        "data"
    )
    made = fake.objects[(API, "resourceclaimtemplates", "ml", "quarter")]
    (request,) = made["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["capacity"]["requests"] == {"memory": "20480Mi"}
    assert made["metadata"]["labels"] == {"gpuscaler.io/pool": "dra"}
