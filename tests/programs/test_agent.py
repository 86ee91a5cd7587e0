"""The node agent end to end in the test process, with no GPU: real processes under a fake
/proc, a fake NVML file, a fake `nvidia-smi` on PATH, an in-test pod-resources server and
the Kubernetes API (tests/kubefake.py; `api_server` below)."""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agentkit import (
    BUS0,
    BUS1,
    GPU0,
    GPU1,
    HOST_CGROUP,
    MPS_CGROUP,
    SELF,
    Node,
    agent_pod,
    calls,
    cgroupfs_v1,
    fake_node,
    fake_nvidia_smi,
    pod_resources_server,
    systemd_v2,
)
from kubefake import FakeCluster, fake_apiserver
from kubernetes import client

from gpuscaler.adapters.host import HostFs
from gpuscaler.adapters.kube.preemption_records import QUARANTINE_TAINT
from gpuscaler.adapters.node import CLEANUP_LABEL, GPU_TOPOLOGY, TIME_SLICE_APPLIED, NodeApi
from gpuscaler.adapters.nvml import FakeNvml
from gpuscaler.adapters.podresources import list_pods
from gpuscaler.agent.metrics import AgentMetrics
from gpuscaler.agent.runner import NodeAgent
from gpuscaler.config import Config, parse_config

NODE = "gpu-node-1"
LIVE = "aaaaaaaa-1111-2222-3333-444444444444"
GONE = "bbbbbbbb-1111-2222-3333-444444444444"
OTHER_TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


def node_object(labels: dict[str, str], quarantined: bool = False) -> dict[str, Any]:
    taints = [OTHER_TAINT]
    if quarantined:
        taints.append({"key": QUARANTINE_TAINT, "value": "true", "effect": "NoSchedule"})
        labels = {**labels, CLEANUP_LABEL: "required"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": labels},
        "spec": {"taints": taints},
    }


def pod(name: str, uid: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": uid},
        "spec": {"nodeName": node},
    }


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Node, FakeCluster, client.ApiClient]]:
    with (
        fake_node() as node,
        fake_apiserver() as (url, cluster),
        client.ApiClient(client.Configuration(host=url)) as api,
    ):
        node.add_gpu(GPU0, 0, BUS0, numa=0)
        node.add_gpu(GPU1, 1, BUS1, numa=None)
        cluster.add("v1", "pods", agent_pod(NODE))
        monkeypatch.setenv("PATH", f"{node.root / 'bin'}:{Path('/usr/bin')}:{Path('/bin')}")
        yield node, cluster, api


def make_agent(
    node: Node,
    api: client.ApiClient,
    extra: str = "",
    socket: str | None = None,
    name: str = NODE,
    own_uid: str | None = SELF,
) -> tuple[NodeAgent, AgentMetrics]:
    config: Config = parse_config(
        f"agent:\n  proc_root: {node.proc}\n  sys_root: {node.sys}\n  orphan_grace: 60s\n"
        f"  kill_timeout: 10s\n{extra}"
    )
    metrics = AgentMetrics()
    agent = NodeAgent(
        config,
        NodeApi(api, config, name, "agent-test"),
        FakeNvml(node.nvml_file),
        HostFs(node.proc, node.sys),
        metrics,
        kubelet_pods=lambda: list_pods(socket or node.socket, 5),
        own_uid=own_uid,
    )
    return agent, metrics


def events(cluster: FakeCluster) -> list[dict[str, Any]]:
    return [o for (_, plural, _, _), o in cluster.objects.items() if plural == "events"]


def stored_node(cluster: FakeCluster) -> dict[str, Any]:
    found = cluster.get("v1", "nodes", None, NODE)
    assert found is not None
    return found


def wait_exit(node: Node, pid: int) -> None:
    child = next(c for c in node.children if c.pid == pid)
    child.wait(timeout=10)


# --------------------------------------------------------------------------- time slice


def test_a_time_slice_label_change_is_applied_once_and_mig_gpus_are_skipped(world: Any) -> None:
    node, cluster, api = world
    node.gpus[1]["mig"] = True
    node._write()
    log = fake_nvidia_smi(node.root / "bin")
    labels = {"gpuscaler.io/enabled": "true", "gpuscaler.io/time-slice": "medium"}
    cluster.add("v1", "nodes", node_object(labels))
    agent, metrics = make_agent(node, api)
    for now in (0, 10, 20):
        agent.poll(now)
    assert calls(log) == [f"compute-policy -i {GPU0} --set-timeslice 2"]
    assert stored_node(cluster)["metadata"]["annotations"][TIME_SLICE_APPLIED] == "medium"
    labels = cluster.objects[("v1", "nodes", None, NODE)]["metadata"]["labels"]
    labels["gpuscaler.io/time-slice"] = "long"
    agent.poll(30)
    agent.poll(40)
    assert calls(log)[1:] == [f"compute-policy -i {GPU0} --set-timeslice 3"]
    assert stored_node(cluster)["metadata"]["annotations"][TIME_SLICE_APPLIED] == "long"
    notes = [e["note"] for e in events(cluster) if e["reason"] == "TimeSliceApplied"]
    assert notes == ["time slice medium applied", "time slice long applied"]
    text = metrics.exposition().decode()
    assert 'gpuscaler_agent_time_slice_level{gpu="0"} 3.0' in text
    assert 'gpuscaler_agent_time_slice_sets_total{outcome="skipped"} 1.0' in text


def test_a_failing_nvidia_smi_leaves_the_label_unapplied_with_a_warning_event(world: Any) -> None:
    node, cluster, api = world
    log = fake_nvidia_smi(node.root / "bin", exit_code=4)
    labels = {"gpuscaler.io/enabled": "true", "gpuscaler.io/time-slice": "short"}
    cluster.add("v1", "nodes", node_object(labels))
    agent, metrics = make_agent(node, api)
    agent.poll(0)
    agent.poll(10)
    assert len(calls(log)) == 4  # both GPUs, tried again next poll
    assert TIME_SLICE_APPLIED not in (stored_node(cluster)["metadata"].get("annotations") or {})
    (warning,) = [e for e in events(cluster) if e["reason"] == "TimeSliceNotApplied"]
    assert warning["type"] == "Warning" and "Insufficient Permissions" in warning["note"]
    assert "exit 4" in warning["note"] and warning["regarding"]["name"] == NODE
    text = metrics.exposition().decode()
    assert 'gpuscaler_agent_time_slice_sets_total{outcome="failed"} 4.0' in text


def test_a_node_that_did_not_opt_in_gets_no_time_slice(world: Any) -> None:
    node, cluster, api = world
    log = fake_nvidia_smi(node.root / "bin")
    cluster.add("v1", "nodes", node_object({"gpuscaler.io/time-slice": "long"}))
    agent, _ = make_agent(node, api)
    agent.poll(0)
    assert calls(log) == []


# --------------------------------------------------------------------------- topology


def test_the_topology_annotation_has_every_gpu_with_its_numa_node(world: Any) -> None:
    node, cluster, api = world
    cluster.add("v1", "nodes", node_object({}))
    agent, _ = make_agent(node, api, extra="  dry_run: true\n")
    agent.poll(0)
    agent.poll(10)
    value = json.loads(stored_node(cluster)["metadata"]["annotations"][GPU_TOPOLOGY])
    assert value == [
        {"uuid": GPU0, "index": 0, "pci_bus_id": BUS0, "memory_mib": 81920, "numa_node": 0},
        {"uuid": GPU1, "index": 1, "pci_bus_id": BUS1, "memory_mib": 81920, "numa_node": -1},
    ]
    assert cluster.answered("PATCH", f"/nodes/{NODE}$", 200) == 1  # unchanged: not rewritten


# --------------------------------------------------------------------------- orphans


def start_workloads(node: Node, cluster: FakeCluster) -> dict[str, int]:
    """A live pod's process, an orphan of a gone pod, persistenced and the MPS daemon."""
    cluster.add("v1", "pods", pod("serving", LIVE, NODE))
    cluster.add("v1", "pods", pod("elsewhere", GONE, "gpu-node-2"))  # same UID, other node
    return {
        "live": node.start(systemd_v2(LIVE), GPU1, 30000),
        "orphan": node.start(cgroupfs_v1(GONE), GPU0, 4096),
        "host": node.start(HOST_CGROUP, GPU0, 200, name="nvidia-persiste"),
        "mps": node.start(MPS_CGROUP, GPU1, 300, name="nvidia-cuda-mps"),
    }


def test_an_orphan_is_killed_after_its_grace_and_the_taint_is_lifted(world: Any) -> None:
    node, cluster, api = world
    cluster.add("v1", "nodes", node_object({"gpuscaler.io/enabled": "true"}, quarantined=True))
    pids = start_workloads(node, cluster)
    agent, metrics = make_agent(node, api)
    for now in (0, 30, 59):
        report = agent.poll(now)
        assert all(node.alive(p) for p in pids.values())
        assert not report.lifted
    assert QUARANTINE_TAINT in json.dumps(stored_node(cluster)["spec"])
    agent.poll(60)
    wait_exit(node, pids["orphan"])
    (killed,) = [e for e in events(cluster) if e["reason"] == "OrphanGPUProcessKilled"]
    for part in (f"PID {pids['orphan']}", GONE, GPU0, "4096 MiB", "SIGTERM"):
        assert part in killed["note"]
    report = agent.poll(61)
    assert report.lifted
    (freed,) = [e for e in events(cluster) if e["reason"] == "OrphanGPUMemoryFreed"]
    assert f"PID {pids['orphan']}" in freed["note"] and "4096 MiB freed" in freed["note"]
    stored = stored_node(cluster)
    assert stored["spec"]["taints"] == [OTHER_TAINT]
    assert CLEANUP_LABEL not in stored["metadata"]["labels"]
    assert any(e["reason"] == "GPUMemoryReleased" for e in events(cluster))
    for name in ("live", "host", "mps"):
        assert node.alive(pids[name]), name
    text = metrics.exposition().decode()
    assert 'gpuscaler_agent_orphan_signals_total{outcome="sent",signal="SIGTERM"} 1.0' in text
    assert "gpuscaler_agent_orphan_memory_freed_mib_total 4096.0" in text
    assert "gpuscaler_agent_node_quarantined 0.0" in text


def test_an_orphan_that_ignores_sigterm_gets_sigkill_after_the_timeout(world: Any) -> None:
    node, cluster, api = world
    cluster.add("v1", "nodes", node_object({"gpuscaler.io/enabled": "true"}))
    pid = node.start(systemd_v2(GONE), GPU0, 1000, ignore_sigterm=True)
    agent, _ = make_agent(node, api)
    agent.poll(0)
    agent.poll(60)
    agent.poll(65)
    assert node.alive(pid)
    agent.poll(70)
    wait_exit(node, pid)
    notes = [e["note"] for e in events(cluster) if e["reason"] == "OrphanGPUProcessKilled"]
    assert [n.split(" sent")[0] for n in notes] == ["SIGTERM", "SIGKILL"]


def test_a_live_pods_process_and_host_processes_are_never_touched(world: Any) -> None:
    node, cluster, api = world
    cluster.add("v1", "nodes", node_object({"gpuscaler.io/enabled": "true"}, quarantined=True))
    cluster.add("v1", "pods", pod("serving", LIVE, NODE))
    pids = [
        node.start(systemd_v2(LIVE), GPU0, 30000),
        node.start(HOST_CGROUP, GPU0, 200),
        node.start(MPS_CGROUP, GPU1, 2000),
    ]
    agent, _ = make_agent(node, api)
    for now in range(0, 1000, 100):
        report = agent.poll(now)
    assert all(node.alive(p) for p in pids)
    assert not [e for e in events(cluster) if e["reason"].startswith("Orphan")]
    # GPU 1 holds 2.3 GiB with only the MPS daemon on it: the quarantine stays, and says why.
    assert not report.lifted
    assert any("GPU 1" in p and "host processes" in p for p in report.problems)


def test_an_unknown_cgroup_format_is_reported_not_guessed(
    world: Any, caplog: pytest.LogCaptureFixture
) -> None:
    node, cluster, api = world
    cluster.add("v1", "nodes", node_object({"gpuscaler.io/enabled": "true"}, quarantined=True))
    pid = node.start("0::/kubepods/burstable/not-a-pod-segment/abc\n", GPU0, 3000)
    agent, metrics = make_agent(node, api)
    with caplog.at_level(logging.WARNING, logger="gpuscaler.agent"):
        for now in (0, 100, 200):
            report = agent.poll(now)
    assert node.alive(pid)
    reported = [r.getMessage() for r in caplog.records if "cgroup not understood" in r.getMessage()]
    assert len(reported) == 1 and str(pid) in reported[0]
    text = metrics.exposition().decode()
    assert 'gpuscaler_agent_gpu_processes{gpu="0",owner="unknown"} 1.0' in text
    assert not report.lifted


@pytest.mark.parametrize(
    ("name", "labels", "extra"),
    [
        ("dry run", {"gpuscaler.io/enabled": "true"}, "  dry_run: true\n"),
        ("dry run inherited from control.dry_run", {"gpuscaler.io/enabled": "true"}, "control:\n  dry_run: true\n"),
        ("node not opted in", {}, ""),
    ],
)  # fmt: skip
def test_without_leave_to_act_the_agent_reports_what_it_would_kill(
    world: Any, caplog: pytest.LogCaptureFixture, name: str, labels: dict[str, str], extra: str
) -> None:
    node, cluster, api = world
    cluster.add("v1", "nodes", node_object(labels, quarantined=True))
    pid = node.start(systemd_v2(GONE), GPU0, 4096)
    agent, metrics = make_agent(node, api, extra=extra)
    with caplog.at_level(logging.WARNING, logger="gpuscaler.agent"):
        for now in (0, 60, 80, 200):
            agent.poll(now)
    assert node.alive(pid), name
    would = [r.getMessage() for r in caplog.records if r.getMessage().startswith("would SIGTERM")]
    assert len(would) == 1 and f"PID {pid}" in would[0] and GONE in would[0]
    assert QUARANTINE_TAINT in json.dumps(stored_node(cluster)["spec"])
    assert not [e for e in events(cluster) if e["reason"].startswith("Orphan")]
    assert 'outcome="dry_run",signal="SIGTERM"' in metrics.exposition().decode()


UNTRUSTED = {
    "the pod list fails": "pods unknown",
    "the pod list is answered 200 with no items": f"lacks the agent's own pod {SELF}",
    "POD_UID is unset": "POD_UID unset",
    "the kubelet's pod-resources cannot be read": "pod-resources unread",
}


@pytest.mark.parametrize("case", list(UNTRUSTED))
def test_nothing_is_killed_unless_the_pod_lists_are_trustworthy(
    world: Any, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    node, cluster, api = world
    cluster.add("v1", "nodes", node_object({"gpuscaler.io/enabled": "true"}))
    cluster.add("v1", "pods", pod("vllm", LIVE, NODE))
    pids = [node.start(systemd_v2(LIVE), GPU0, 30000), node.start(systemd_v2(GONE), GPU1, 4096)]
    original = cluster.handle

    def empty(verb: str, path: str, query: dict[str, list[str]], ctype: str, body: Any) -> Any:
        if path.endswith("/pods"):  # a wrong answer: no pod at all, the agent's own missing
            query = {**query, "fieldSelector": ["spec.nodeName=no-such-node"]}
        return original(verb, path, query, ctype, body)

    if case == "the pod list is answered 200 with no items":
        cluster.handle = empty
    agent, metrics = make_agent(
        node,
        api,
        own_uid=None if case == "POD_UID is unset" else SELF,
        socket=str(node.root / "none.sock") if "pod-resources" in case else None,
    )
    with caplog.at_level(logging.WARNING, logger="gpuscaler.agent"):
        for now in (0, 60, 70, 200):
            if case == "the pod list fails":
                cluster.fail_next("GET", "/pods$", 500)
            report = agent.poll(now)
    assert all(node.alive(p) for p in pids), case
    assert report.actions is None
    assert "no orphan judged: " in "; ".join(report.problems)
    assert UNTRUSTED[case] in "; ".join(report.problems)
    said = [r.getMessage() for r in caplog.records if "judged an orphan" in r.getMessage()]
    assert len(said) == 1 and UNTRUSTED[case] in said[0]  # said once, not every poll
    assert not [e for e in events(cluster) if e["reason"].startswith("Orphan")]
    assert "gpuscaler_agent_orphan_signals_total{" not in metrics.exposition().decode()


STATIC = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"  # a static pod's UID: a hash of its manifest


def test_a_static_pods_process_lives_while_the_kubelet_runs_it_without_a_mirror(
    world: Any, caplog: pytest.LogCaptureFixture
) -> None:
    node, cluster, api = world
    cluster.add("v1", "nodes", node_object({"gpuscaler.io/enabled": "true"}))
    node.kubelet.append({"name": f"vllm-{NODE}", "namespace": "kube-system"})
    static = node.start(systemd_v2(STATIC), GPU0, 30000, name="vllm")
    orphan = node.start(cgroupfs_v1(GONE), GPU1, 4096)
    agent, _ = make_agent(node, api)
    with caplog.at_level(logging.WARNING, logger="gpuscaler.agent"):
        for now in (0, 60, 70, 200):
            agent.poll(now)
    assert node.alive(static) and node.alive(orphan)  # either may be the static pod's
    said = [r.getMessage() for r in caplog.records if "left alone" in r.getMessage()]
    assert len(said) == 2 and all(f"kube-system/vllm-{NODE}" in m for m in said)
    # Its mirror pod appears: the static pod's process is its own, the other an orphan.
    mirror = pod(f"vllm-{NODE}", "mirror-uid", NODE)
    mirror["metadata"] |= {"namespace": "kube-system"}
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": STATIC}
    cluster.add("v1", "pods", mirror)
    for now in (300, 360):
        agent.poll(now)
    wait_exit(node, orphan)
    assert node.alive(static)


def test_without_pidfd_open_an_orphan_is_still_killed_and_the_poll_succeeds(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, cluster, api = world
    cluster.add("v1", "nodes", node_object({"gpuscaler.io/enabled": "true"}))

    def no_pidfd(pid: int, flags: int = 0) -> int:  # a kernel before 5.3
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    live = node.start(systemd_v2(LIVE), GPU0, 30000)
    cluster.add("v1", "pods", pod("serving", LIVE, NODE))
    orphan = node.start(systemd_v2(GONE), GPU1, 4096)
    agent, metrics = make_agent(node, api)
    agent.poll(0)
    report = agent.poll(60)
    wait_exit(node, orphan)
    assert node.alive(live) and not report.problems
    (killed,) = [e for e in events(cluster) if e["reason"] == "OrphanGPUProcessKilled"]
    assert f"PID {orphan}" in killed["note"]
    text = metrics.exposition().decode()
    assert 'gpuscaler_agent_orphan_signals_total{outcome="sent",signal="SIGTERM"} 1.0' in text


def test_pods_are_listed_only_with_this_nodes_field_selector(world: Any) -> None:
    node, cluster, api = world
    cluster.add("v1", "nodes", node_object({"gpuscaler.io/enabled": "true"}))
    seen: list[str] = []
    original = cluster.handle

    def spy(verb: str, path: str, query: dict[str, list[str]], ctype: str, body: Any) -> Any:
        if path.endswith("/pods"):
            seen.extend(query.get("fieldSelector") or ["(none)"])
        return original(verb, path, query, ctype, body)

    cluster.handle = spy
    agent, _ = make_agent(node, api)
    agent.poll(0)
    assert seen == [f"spec.nodeName={NODE}"]


# --------------------------------------------------------------------------- pod-resources


def test_the_pod_to_gpu_mapping_from_pod_resources_is_a_metric(world: Any) -> None:
    node, cluster, api = world
    cluster.add("v1", "nodes", node_object({}))
    pods = [
        {"name": "serving-0", "namespace": "ml", "containers": {"main": {"nvidia.com/gpu": [f"{GPU0}::1"]}}},
        {"name": "trainer", "namespace": "ml", "containers": {"t": {"nvidia.com/gpu": [GPU1], "example.com/nic": ["eth1"]}}},
        {"name": "web", "namespace": "web", "containers": {"w": {}}},
    ]  # fmt: skip
    with pod_resources_server(pods) as socket:
        agent, metrics = make_agent(node, api, socket=socket)
        agent.poll(0)
    text = metrics.exposition().decode()
    assert f'gpuscaler_agent_pod_gpu_device{{container="main",device="{GPU0}::1",gpu="{GPU0}",namespace="ml",pod="serving-0"}} 1.0' in text  # fmt: skip
    assert f'device="{GPU1}",gpu="{GPU1}",namespace="ml",pod="trainer"' in text
    assert "eth1" not in text and 'pod="web"' not in text
    assert 'gpuscaler_agent_source_up{source="pod_resources"} 1.0' in text


def test_an_unreachable_pod_resources_socket_is_reported_and_the_poll_goes_on(world: Any) -> None:
    node, cluster, api = world
    log = fake_nvidia_smi(node.root / "bin")
    labels = {"gpuscaler.io/enabled": "true", "gpuscaler.io/time-slice": "short"}
    cluster.add("v1", "nodes", node_object(labels))
    agent, metrics = make_agent(node, api, socket=str(node.root / "missing.sock"))
    report = agent.poll(0)
    assert any("pod-resources List" in p for p in report.problems)
    assert len(calls(log)) == 2
    assert 'gpuscaler_agent_source_up{source="pod_resources"} 0.0' in metrics.exposition().decode()


def test_the_agent_metrics_pass_promtool_check_metrics(world: Any) -> None:
    from promserver import promtool_check

    node, cluster, api = world
    cluster.add("v1", "nodes", node_object({"gpuscaler.io/enabled": "true"}, quarantined=True))
    node.start(systemd_v2(GONE), GPU0, 4096)
    pods = [{"name": "p", "namespace": "ml", "containers": {"c": {"nvidia.com/gpu": [GPU0]}}}]
    with pod_resources_server(pods) as socket:
        agent, metrics = make_agent(node, api, socket=socket)
        for now in (0, 60):
            agent.poll(now)
    out = promtool_check(metrics.exposition().decode())
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_refused_lift_leaves_the_taint_and_says_why(world: Any) -> None:
    node, cluster, api = world
    cluster.add("v1", "nodes", node_object({"gpuscaler.io/enabled": "true"}, quarantined=True))
    agent, metrics = make_agent(node, api)
    cluster.fail_next("PATCH", f"/nodes/{NODE}$", 403, after=1)  # topology passes, lift refused
    report = agent.poll(0)
    assert not report.lifted
    assert QUARANTINE_TAINT in json.dumps(stored_node(cluster)["spec"])
    (kept,) = [e for e in events(cluster) if e["reason"] == "GPUQuarantineKept"]
    assert kept["type"] == "Warning" and "403" in kept["note"]
    text = metrics.exposition().decode()
    assert 'gpuscaler_agent_quarantine_lifts_total{outcome="failed"} 1.0' in text


def test_a_process_that_survives_sigkill_is_signalled_again_without_a_new_event(world: Any) -> None:
    node, cluster, api = world
    cluster.add("v1", "nodes", node_object({"gpuscaler.io/enabled": "true"}))
    pid = node.start(systemd_v2(GONE), GPU0, 1000, ignore_sigterm=True)
    agent, metrics = make_agent(node, api)
    signals: list[str] = []
    agent.host = type(agent.host)(node.proc, node.sys)
    real = agent.host.signal

    def refuse_kill(p: int, start: int, sig: Any) -> str:  # stuck in D state: it does not die
        signals.append(sig.name)
        return "sent" if sig.name == "SIGKILL" else real(p, start, sig)

    object.__setattr__(agent.host, "signal", refuse_kill)
    for now in (0, 60, 70, 80, 90):
        agent.poll(now)
    assert signals == ["SIGTERM", "SIGKILL", "SIGKILL", "SIGKILL"]
    notes = [e["note"] for e in events(cluster) if e["reason"] == "OrphanGPUProcessKilled"]
    assert len(notes) == 2 and node.alive(pid)
    text = metrics.exposition().decode()
    assert 'gpuscaler_agent_orphan_signals_total{outcome="sent",signal="SIGKILL"} 3.0' in text


def test_an_unreachable_api_server_fails_the_poll_counted_and_the_loop_goes_on(world: Any) -> None:
    from gpuscaler.adapters.kube.api import BoundedApiClient
    from gpuscaler.agent.app import poll_once
    from gpuscaler.agent.metrics import AgentHealth

    node, _, _ = world
    with BoundedApiClient(client.Configuration(host="http://127.0.0.1:1"), 1, 1, 5) as dead:
        agent, metrics = make_agent(node, dead)
        health = AgentHealth(10)
        assert poll_once(agent, metrics, health, dead.begin_tick) is False
        assert poll_once(agent, metrics, health, dead.begin_tick) is False
    text = metrics.exposition().decode()
    assert 'gpuscaler_agent_polls_total{outcome="failed"} 2.0' in text
    assert 'gpuscaler_agent_source_up{source="kubernetes"} 0.0' in text
    assert health.ready() == (False, "no poll has completed yet")
