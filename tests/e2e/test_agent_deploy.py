"""deploy/agent: the DaemonSet has the privileges the agent needs and no more, and its
RBAC grants exactly the calls the agent makes lifting a quarantine preemption left."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agentkit import BUS0, GPU0, SELF, agent_pod, cgroupfs_v1, fake_node
from kubefake import FakeCluster
from kubeobjects import gpu_pod, node
from kubernetes import client
from test_deploy import ROOT, _one, render
from test_rbac import Call, _allows, _preemption, as_call

from gpuscaler.adapters.host import HostFs
from gpuscaler.adapters.kube.preemption_records import QUARANTINE_TAINT
from gpuscaler.adapters.node import NodeApi
from gpuscaler.adapters.nvidia_smi import SmiResult
from gpuscaler.adapters.nvml import FakeNvml
from gpuscaler.adapters.podresources import list_pods
from gpuscaler.agent.metrics import AgentMetrics
from gpuscaler.agent.runner import NodeAgent
from gpuscaler.config import Config, parse_config


def _agent_pod() -> tuple[dict[str, Any], dict[str, Any]]:
    ds = _one(render("deploy/agent"), "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return spec, container


def test_the_agent_has_its_own_privileged_namespace_and_the_controllers_stays_restricted() -> None:
    (namespace,) = [d for d in render("deploy/agent") if d["kind"] == "Namespace"]
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"  # hostPID, hostPath
    namespaced = [d for d in render("deploy/agent") if "namespace" in d["metadata"]]
    assert {d["kind"] for d in render("deploy/agent")} - {d["kind"] for d in namespaced} == {
        "Namespace",
        "PriorityClass",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    assert {d["metadata"]["namespace"] for d in namespaced} == {namespace["metadata"]["name"]}
    controller = _one(render("deploy"), "Namespace")
    assert controller["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_daemonset_runs_on_gpu_nodes_with_only_the_privileges_the_agent_needs() -> None:
    spec, container = _agent_pod()
    assert spec["hostPID"] is True
    assert "hostNetwork" not in spec and "hostIPC" not in spec
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["KILL", "SYS_ADMIN"]}
    assert security.get("privileged") is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["runAsUser"] == 0  # added capabilities need UID 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # It must stay on (and lift) a quarantined node.
    assert {"operator": "Exists"} in spec["tolerations"]  # the quarantine taint included


def test_the_daemonset_mounts_the_pod_resources_socket_read_only_where_the_config_looks() -> None:
    spec, container = _agent_pod()
    socket = Path(Config().agent.pod_resources_socket)
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(socket.parent))
    assert mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == str(socket.parent)
    host_paths = [v for v in spec["volumes"] if "hostPath" in v]
    assert host_paths == [volume]  # /proc comes from hostPID, /sys from the runtime's sysfs


def test_the_daemonset_reads_the_controllers_config_and_is_probed_and_scraped() -> None:
    spec, container = _agent_pod()
    args = container["args"]
    assert args[0] == "agent"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    port = container["ports"][0]["containerPort"]
    assert args[args.index("--metrics-port") + 1] == str(port)
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    config_path = Path(args[args.index("--config") + 1])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    docs = render("deploy/agent")
    configmap = _one(docs, "ConfigMap", volume["configMap"]["name"])
    agent = parse_config(configmap["data"][config_path.name], "deploy/agent ConfigMap")
    controller = parse_config((ROOT / "deploy" / "config.yaml").read_text(), "deploy/config.yaml")
    # What the agent shares with the controller must agree (two files, one meaning).
    assert agent.preemption.released_below_mib == controller.preemption.released_below_mib
    assert agent.kubernetes.time_slice_label == controller.kubernetes.time_slice_label
    assert agent.kubernetes.events_namespace == controller.kubernetes.events_namespace
    assert agent.control.dry_run == controller.control.dry_run
    assert configmap["metadata"]["namespace"] == _one(docs, "DaemonSet")["metadata"]["namespace"]
    assert spec["priorityClassName"] == _one(docs, "PriorityClass")["metadata"]["name"]
    assert spec["serviceAccountName"] == _one(docs, "ServiceAccount")["metadata"]["name"]
    service = _one(docs, "Service")
    labels = _one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    controller_service = _one(render("deploy"), "Service", "gpuscaler-metrics")  # skips agents
    assert not controller_service["spec"]["selector"].items() <= labels.items()
    monitor = _one(docs, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )


# --------------------------------------------------------------------------- RBAC


def _agent_rules() -> list[dict[str, Any]]:
    docs = render("deploy/agent")
    binding = _one(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpuscaler-agent", "namespace": "gpuscaler-agent"}
    ]
    rules: list[dict[str, Any]] = _one(docs, "ClusterRole", binding["roleRef"]["name"])["rules"]
    return rules


def _agent_for(node_dir: Any, api: client.ApiClient, node: str, extra: str = "") -> NodeAgent:
    config = parse_config(
        f"agent:\n  proc_root: {node_dir.proc}\n  sys_root: {node_dir.sys}\n"
        f"  orphan_grace: 60s\n{extra}"
    )
    return NodeAgent(
        config,
        NodeApi(api, config, node, "agent-test"),
        FakeNvml(node_dir.nvml_file),
        HostFs(node_dir.proc, node_dir.sys),
        AgentMetrics(),
        kubelet_pods=lambda: list_pods(node_dir.socket, 5),
        set_slice=lambda uuid, level: SmiResult(True, "set"),
        own_uid=SELF,
    )


def _tier3(fake: FakeCluster, api: client.ApiClient) -> tuple[str, str]:
    """Preemption's tiers, as the controller's adapter carries them out (tests/e2e/test_rbac.py's
    walk), end with a node quarantined and the victim gone: (node, victim UID)."""
    pods: dict[tuple[str, str], str] = {}
    add = fake.add

    def remember(gv: str, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        out = add(gv, plural, obj)
        if plural == "pods":
            meta = obj["metadata"]
            pods[(meta["namespace"], meta["name"])] = meta["uid"]
        return out

    fake.add = remember  # type: ignore[method-assign]
    for name in ("gpu-0", "gpu-1"):
        fake.add("v1", "nodes", node(name, config="ts-4"))  # as test_rbac leaves them
    fake.add("v1", "pods", gpu_pod("chat-1", "gpu-0"))
    _preemption(api, fake)
    fake.add = add  # type: ignore[method-assign]
    (tainted,) = [
        name
        for (_, plural, _, name), o in fake.objects.items()
        if plural == "nodes" and QUARANTINE_TAINT in json.dumps(o.get("spec"))
    ]
    (gone,) = [uid for (ns, name), uid in pods.items() if fake.get("v1", "pods", ns, name) is None]
    fake.add("v1", "pods", agent_pod(tainted))
    return tainted, gone


def test_every_agent_call_is_allowed_and_every_grant_is_used(
    api: tuple[client.ApiClient, FakeCluster],
) -> None:
    official, fake = api
    with fake_node() as node_dir:
        node_dir.add_gpu(GPU0, 0, BUS0, numa=0)
        tainted, victim_uid = _tier3(fake, official)
        fake.requests.clear()
        fake.codes.clear()
        node_dir.start(cgroupfs_v1(victim_uid), GPU0, 12000)
        labels = fake.objects[("v1", "nodes", None, tainted)]["metadata"]["labels"]
        labels["gpuscaler.io/time-slice"] = "long"
        agent = _agent_for(node_dir, official, tainted)
        fake.fail_next("PATCH", f"/nodes/{tainted}$", 409)  # a conflict: re-read
        for now in (0, 60, 61, 62):
            agent.poll(now)
        calls = {as_call(m, p) for m, p in fake.requests}
    rules = _agent_rules()
    denied = [c for c in calls if not any(_allows(r, None, c) for r in rules)]
    assert denied == []
    unused = [
        (r["resources"], verb)
        for r in rules
        for verb in r["verbs"]
        if not any(_allows({**r, "verbs": [verb]}, None, c) for c in calls)
    ]
    assert unused == []
    assert {c.name for c in calls if c.resource == "nodes"} == {tainted}  # its own only


@pytest.mark.parametrize(
    "call",
    [
        Call("delete", "", "pods", "ml", "x"),
        Call("create", "", "pods/eviction", "ml", None),
        Call("list", "", "nodes", None, None),
        Call("get", "", "secrets", "gpuscaler", "x"),
        Call("patch", "", "pods", "ml", "x"),
    ],
    ids=lambda c: f"{c.verb}-{c.resource}",
)
def test_the_agent_rules_refuse_what_the_agent_never_does(call: Call) -> None:
    assert not any(_allows(r, None, call) for r in _agent_rules())


def test_the_daemonset_arguments_are_accepted_by_the_parser() -> None:
    from gpuscaler.cli import build_parser

    _, container = _agent_pod()
    args = build_parser().parse_args(container["args"])
    assert args.command == "agent" and args.node is None  # from NODE_NAME
    assert args.metrics_port == container["ports"][0]["containerPort"]
    assert args.metrics_host == "0.0.0.0"  # the kubelet probes the pod IP


def test_the_shipped_config_lists_every_agent_field_at_its_default_with_a_comment() -> None:
    import yaml

    from gpuscaler.config import AgentConfig, load_config

    path = Path(__file__).resolve().parents[2] / "config" / "gpuscaler.yaml"
    assert load_config(path).agent == AgentConfig()
    section = yaml.safe_load(path.read_text())["agent"]
    assert set(section) == set(AgentConfig.model_fields)
    lines = path.read_text().split("\nagent:\n", 1)[1].splitlines()
    for name in AgentConfig.model_fields:
        line = next(line for line in lines if line.strip().startswith(f"{name}:"))
        assert "#" in line, f"agent.{name} has no comment"
