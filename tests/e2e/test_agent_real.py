"""The node agent against the real control plane (tests/controlplane.py): deploy/agent
applied with kubectl as the README says (its DaemonSet pod admitted in its privileged
namespace), then `gpuscaler agent` run as its own ServiceAccount (a TokenRequest token,
so the real RBAC authorizer judges every call) against a quarantined node: labels,
annotations, the taint and Events on the real kube-apiserver; and its admission policy:
its token changes its own node only."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from agentkit import (
    BUS0,
    BUS1,
    GPU0,
    GPU1,
    calls,
    cgroupfs_v1,
    fake_node,
    fake_nvidia_smi,
    systemd_v2,
    terminate,
)
from controlplane import Kube, wait_until
from kubeobjects import bare_pod
from kubernetes import config as kube_config

from gpuscaler.adapters.kube.api import KubeError
from gpuscaler.adapters.kube.eviction import KubePreemption
from gpuscaler.adapters.kube.preemption_records import QUARANTINE_TAINT
from gpuscaler.adapters.kube.writer import Writer
from gpuscaler.adapters.node import CLEANUP_LABEL, GPU_TOPOLOGY, TIME_SLICE_APPLIED, NodeApi
from gpuscaler.config import parse_config
from gpuscaler.core.preemption import VictimState

ROOT = Path(__file__).resolve().parents[2]
GPUSCALER = str(Path(sys.executable).parent / "gpuscaler")
OTHER_TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


def _quarantine(kube: Kube, node: str) -> None:
    """Tier 3's quarantine, by the controller's own adapter code, on a node that already
    carries another taint (which must survive the lift)."""
    kube.patch(f"/api/v1/nodes/{node}", {"spec": {"taints": [OTHER_TAINT]}})
    config = parse_config("")
    now = time.time()
    with kube.plane.api() as api:
        victim = VictimState(
            "batch/train", "serving/critical", node, 1, 10, "cleanup", now, now, gone_at=now
        )
        KubePreemption(api, config, Writer(api, config, "gpuscaler-test"), "gpuscaler")._quarantine(
            victim
        )
    taints = _node(kube, node)["spec"]["taints"]
    quarantine = {"key": QUARANTINE_TAINT, "value": "true", "effect": "NoSchedule"}
    assert quarantine in taints and OTHER_TAINT in taints


def _node(kube: Kube, name: str) -> dict[str, Any]:
    return kube.get(f"/api/v1/nodes/{name}")


def _apply_agent(kube: Kube) -> None:
    """deploy/agent applied with kubectl as the README says (once an earlier test's copy is
    gone: a namespace still terminating refuses new objects)."""
    wait_until("gpuscaler-agent gone", lambda: not kube._exists("gpuscaler-agent"), 60, 0.5)
    out = kube.plane.kubectl("apply", "-k", str(ROOT / "deploy" / "agent"))
    kube.namespaces.append("gpuscaler-agent")
    assert "created" in out or "configured" in out or "unchanged" in out, out


def _events(kube: Kube, node: str) -> list[dict[str, Any]]:
    items = kube.get("/apis/events.k8s.io/v1/namespaces/default/events")["items"]
    return [e for e in items if (e.get("regarding") or {}).get("name") == node]


def test_the_agent_as_its_service_account_cleans_up_a_quarantined_node(
    kube: Kube, tmp_path: Path
) -> None:
    plane = kube.plane
    runtime = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "nvidia"},
        "handler": "nvidia",
    }
    plane.kubectl("apply", "-f", "-", input=json.dumps(runtime))  # as the GPU Operator makes it
    _apply_agent(kube)
    name = f"gpu-{uuid.uuid4().hex[:6]}"
    kube.add_gpu_node(
        name,
        {
            "gpuscaler.io/enabled": "true",
            "gpuscaler.io/time-slice": "medium",
            "nvidia.com/gpu.present": "true",
        },
    )
    _quarantine(kube, name)

    # The DaemonSet controller makes the agent's pod for the node; admission lets it in.
    # (bound to the node by node affinity on metadata.name, for the scheduler to place)
    def agent_pods() -> list[Any]:
        pods = kube.get("/api/v1/namespaces/gpuscaler-agent/pods")["items"]
        return [p for p in pods if name in json.dumps(p["spec"].get("affinity"))]

    wait_until("the DaemonSet's pod for the GPU node", lambda: len(agent_pods()) == 1, 60, 0.5)
    (ds_pod,) = agent_pods()  # admitted under the namespace's Pod Security level
    assert ds_pod["spec"]["priority"] == 1_000_000_000 and ds_pod["spec"]["hostPID"] is True
    ds_name, ds_uid = ds_pod["metadata"]["name"], ds_pod["metadata"]["uid"]
    kube.bind("gpuscaler-agent", ds_name, name)

    ns = kube.namespace()
    live = kube.create(bare_pod("serving", ns, name))
    live_uid = live["metadata"]["uid"]
    gone_uid = str(uuid.uuid4())  # an evicted pod: no longer in the API
    with fake_node() as node:
        node.add_gpu(GPU0, 0, BUS0, numa=0)
        node.add_gpu(GPU1, 1, BUS1, numa=1)
        smi = fake_nvidia_smi(node.root / "bin")
        live_pid = node.start(systemd_v2(live_uid), GPU1, 20000)
        orphan = node.start(cgroupfs_v1(gone_uid), GPU0, 8000)
        node.kubelet.extend(
            [
                {"name": ds_name, "namespace": "gpuscaler-agent"},
                {"name": "serving", "namespace": ns},
            ]
        )
        config = tmp_path / "agent.yaml"
        text = (ROOT / "deploy" / "agent" / "config.yaml").read_text()  # agent: is last
        for old, new in (
            ("dry_run: true", "dry_run: false"),
            ("poll_interval: 10s", "poll_interval: 500ms"),
            ("orphan_grace: 60s", "orphan_grace: 2s"),
            ("kill_timeout: 10s", "kill_timeout: 2s"),
        ):
            assert old in text, old
            text = text.replace(old, new)
        text += f"  proc_root: {node.proc}\n  sys_root: {node.sys}\n"
        text += f"  pod_resources_socket: {node.socket}\n"
        config.write_text(text)
        kubeconfig = plane.token_kubeconfig(  # as the kubelet mounts it: bound to the pod
            "gpuscaler-agent", "gpuscaler-agent", tmp_path / "kc", pod=(ds_name, ds_uid)
        )
        env = {
            **os.environ,
            "NODE_NAME": name,
            "POD_UID": ds_uid,
            "PATH": f"{node.root / 'bin'}:{os.environ['PATH']}",
        }
        argv = [GPUSCALER, "agent", "--config", str(config), "--kubeconfig", str(kubeconfig)]
        agent = subprocess.Popen(
            [*argv, "--metrics-port", "0", "--fake-nvml", str(node.nvml_file)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "agent.log").open("w"),
        )
        try:
            wait_until("the orphan killed", lambda: not node.alive(orphan), 60, 0.2)
            wait_until(
                "the quarantine lifted",
                lambda: CLEANUP_LABEL not in _node(kube, name)["metadata"]["labels"],
                30,
                0.2,
            )
        finally:
            terminate(agent)
        log = (tmp_path / "agent.log").read_text()
        assert agent.returncode == 0, log
        # RBAC allowed every call: no status 403 (a timestamp's digits may hold "403").
        assert not re.search(r"(?<![\d.])403(?![\d.])", log) and "Forbidden" not in log, log
        assert node.alive(live_pid)
        assert calls(smi) == [
            f"compute-policy -i {GPU0} --set-timeslice 2",
            f"compute-policy -i {GPU1} --set-timeslice 2",
        ]
    stored = _node(kube, name)
    assert stored["spec"]["taints"] == [OTHER_TAINT]
    annotations = stored["metadata"]["annotations"]
    assert annotations[TIME_SLICE_APPLIED] == "medium"
    assert [g["numa_node"] for g in json.loads(annotations[GPU_TOPOLOGY])] == [0, 1]
    events = _events(kube, name)
    wanted = {
        "TimeSliceApplied",
        "OrphanGPUProcessKilled",
        "OrphanGPUMemoryFreed",
        "GPUMemoryReleased",
    }
    assert wanted <= {e["reason"] for e in events}
    (killed,) = [e for e in events if e["reason"] == "OrphanGPUProcessKilled"]
    for part in (f"PID {orphan}", gone_uid, "8000 MiB"):
        assert part in killed["note"]
    assert killed["reportingController"] == "gpuscaler.io/controller"
    plane.kubectl("delete", "-k", str(ROOT / "deploy" / "agent"), "--wait=false", check=False)


# --------------------------------------------------------------------------- in process


def _label(kube: Kube, node: str, labels: dict[str, str | None]) -> None:
    kube.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": labels}})


def test_on_the_real_server_a_label_change_is_applied_once_and_a_failure_is_a_warning(
    kube: Kube, monkeypatch: Any
) -> None:
    from test_agent import make_agent

    name = f"gpu-{uuid.uuid4().hex[:6]}"
    kube.add_gpu_node(name, {"gpuscaler.io/enabled": "true", "gpuscaler.io/time-slice": "short"})
    with fake_node() as node, kube.plane.api() as api:
        node.add_gpu(GPU0, 0, BUS0, numa=0)
        node.add_gpu(GPU1, 1, BUS1, numa=1)
        smi = fake_nvidia_smi(node.root / "bin")
        monkeypatch.setenv("PATH", f"{node.root / 'bin'}:{os.environ['PATH']}")
        agent, _ = make_agent(node, api, name=name)
        for now in (0, 10):
            agent.poll(now)
        _label(kube, name, {"gpuscaler.io/time-slice": "long"})
        agent.poll(20)
        agent.poll(30)
        assert calls(smi) == [
            f"compute-policy -i {GPU0} --set-timeslice 1",
            f"compute-policy -i {GPU1} --set-timeslice 1",
            f"compute-policy -i {GPU0} --set-timeslice 3",
            f"compute-policy -i {GPU1} --set-timeslice 3",
        ]
        assert _node(kube, name)["metadata"]["annotations"][TIME_SLICE_APPLIED] == "long"
        fake_nvidia_smi(node.root / "bin", exit_code=6)  # now it fails
        _label(kube, name, {"gpuscaler.io/time-slice": "medium"})
        agent.poll(40)
    assert _node(kube, name)["metadata"]["annotations"][TIME_SLICE_APPLIED] == "long"
    events = _events(kube, name)
    applied = sorted(e["note"] for e in events if e["reason"] == "TimeSliceApplied")
    assert applied == ["time slice long applied", "time slice short applied"]
    (warning,) = [e for e in events if e["reason"] == "TimeSliceNotApplied"]
    assert warning["type"] == "Warning" and "exit 6" in warning["note"]
    assert warning["regarding"]["uid"] == _node(kube, name)["metadata"]["uid"]


def test_on_the_real_server_live_and_host_processes_are_never_touched_and_dry_run_only_reports(
    kube: Kube,
) -> None:
    from test_agent import make_agent

    name = f"gpu-{uuid.uuid4().hex[:6]}"
    kube.add_gpu_node(name, {"gpuscaler.io/enabled": "true"})
    _quarantine(kube, name)
    ns = kube.namespace()
    live = kube.create(bare_pod("serving", ns, name))
    me = kube.create(bare_pod("agent", ns, name))  # the agent's own: the pod list must hold it
    with fake_node() as node, kube.plane.api() as api:
        node.add_gpu(GPU0, 0, BUS0, numa=0)
        pids = [
            node.start(systemd_v2(live["metadata"]["uid"]), GPU0, 20000),
            node.start("0::/system.slice/nvidia-persistenced.service\n", GPU0, 100),
            node.start("0::/system.slice/nvidia-mps.service\n", GPU0, 100),
            node.start(cgroupfs_v1(str(uuid.uuid4())), GPU0, 8000),  # an orphan, but dry run
        ]
        agent, _ = make_agent(
            node, api, extra="  dry_run: true\n", name=name, own_uid=me["metadata"]["uid"]
        )
        for now in (0, 100, 200):
            report = agent.poll(now)
        assert all(node.alive(p) for p in pids)
    assert report.actions is not None  # the lists were trusted: the orphan was judged
    kinds = {a.proc.pid: a.kind for a in report.actions}
    assert kinds[pids[3]] == "sigkill" and {kinds[p] for p in pids[:3]} == {"keep"}
    assert not report.lifted
    stored = _node(kube, name)
    assert QUARANTINE_TAINT in json.dumps(stored["spec"])
    assert CLEANUP_LABEL in stored["metadata"]["labels"]
    assert GPU_TOPOLOGY in stored["metadata"]["annotations"]  # published in dry run too
    assert not [e for e in _events(kube, name) if e["reason"].startswith("Orphan")]


# --------------------------------------------------------------------------- admission


def test_the_agents_token_changes_its_own_node_and_no_other(kube: Kube, tmp_path: Path) -> None:
    """RBAC grants patch on every node; deploy/agent's ValidatingAdmissionPolicy limits the
    agent to the node its pod-bound token names, on the real apiserver."""
    _apply_agent(kube)
    own, other, canary = (f"gpu-{uuid.uuid4().hex[:6]}" for _ in range(3))
    for name in (own, other, canary):
        kube.add_gpu_node(name, {})  # no GPU label: no DaemonSet pod
    me = kube.create(
        bare_pod("agent", "gpuscaler-agent", own, serviceAccountName="gpuscaler-agent")
    )
    plane, config = kube.plane, parse_config("")
    bound = plane.token_kubeconfig(
        "gpuscaler-agent",
        "gpuscaler-agent",
        tmp_path / "bound",
        pod=("agent", me["metadata"]["uid"]),
    )
    bare = plane.token_kubeconfig("gpuscaler-agent", "gpuscaler-agent", tmp_path / "bare")

    def refusal(kubeconfig: Path, node: str) -> str | None:
        with kube_config.new_client_from_config(config_file=str(kubeconfig)) as api:  # type: ignore[no-untyped-call]
            try:
                NodeApi(api, config, node, "agent-test").annotate({"gpuscaler.io/probe": "x"})
            except KubeError as e:
                return str(e)
        return None

    # The apiserver loads a new policy within seconds; until then RBAC alone lets it by.
    wait_until("the policy in force", lambda: refusal(bound, canary) is not None, 30, 0.5)
    said = refusal(bound, other)
    assert said is not None and "HTTP 403" in said
    assert f"may change only the node its pod runs on, not {other}" in said
    assert refusal(bound, own) is None
    assert "HTTP 403" in (refusal(bare, own) or "")  # a token bound to no pod: no node
    assert "gpuscaler.io/probe" in _node(kube, own)["metadata"]["annotations"]
    assert "gpuscaler.io/probe" not in (_node(kube, other)["metadata"].get("annotations") or {})
    plane.kubectl("delete", "-k", str(ROOT / "deploy" / "agent"), "--wait=false", check=False)
