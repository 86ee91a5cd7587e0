"""The shipped manifests: rendered with kubectl kustomize, validated offline against the
Kubernetes schemas, and checked against what the code expects of them."""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from controlplane import Kube, kubectl_path, unavailable, wait_until

from gpuscaler.adapters.kube.nodepools import sharing_config
from gpuscaler.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES_VERSION = "1.31.0"
"""The oldest Kubernetes the manifests must fit (autoscaling/v2, events.k8s.io/v1)."""
CRDS = {"ScaledObject", "ServiceMonitor", "PrometheusRule"}
"""Custom resources: no schema ships with Kubernetes; checked field by field below."""


@functools.cache
def render(directory: str) -> tuple[dict[str, Any], ...]:
    kubectl = kubectl_path()  # the one tests/controlplane/build.sh built, else PATH's
    if kubectl is None:
        unavailable("kubectl is not built (tests/controlplane/build.sh) nor installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(ROOT / directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def _one(docs: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


@pytest.mark.parametrize(
    "directory", ["deploy", "deploy/examples", "deploy/grafana", "deploy/agent", "deploy/scheduler"]
)
def test_every_rendered_manifest_is_valid_against_the_kubernetes_schemas(directory: str) -> None:
    docs = render(directory)
    assert docs
    for doc in docs:
        if doc["kind"] in CRDS:
            continue
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_manifest_with_a_wrong_field_is_caught_by_the_validation() -> None:
    deployment = dict(_one(render("deploy"), "Deployment"))
    deployment["spec"] = {**deployment["spec"], "replica": 2}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_the_custom_resources_have_the_fields_their_operators_need() -> None:
    docs = render("deploy")
    rule = _one(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    records = [r.get("record") for g in rule["spec"]["groups"] for r in g["rules"]]
    assert "nvidia_gpu_stall_percentage" in records
    monitor = _one(docs, "ServiceMonitor")
    service = _one(docs, "Service", "gpuscaler-metrics")
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    so = _one(render("deploy/examples"), "ScaledObject")
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert so["metadata"]["labels"]["gpuscaler.io/enabled"] == "true"
    assert {"scaleTargetRef", "minReplicaCount", "maxReplicaCount", "triggers"} <= set(so["spec"])


def test_the_deployment_runs_two_restricted_replicas_with_meaningful_probes() -> None:
    docs = render("deploy")
    deployment = _one(docs, "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    assert spec["serviceAccountName"] == _one(docs, "ServiceAccount")["metadata"]["name"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    port = container["ports"][0]["containerPort"]
    assert container["args"][container["args"].index("--metrics-port") + 1] == str(port)
    assert {e["name"] for e in container["env"]} >= {"POD_NAME", "POD_NAMESPACE"}
    assert "limits" in container["resources"] and "requests" in container["resources"]
    # The config file the container reads is the ConfigMap's key, mounted read-only.
    config_path = Path(container["args"][container["args"].index("--config") + 1])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    configmap = _one(docs, "ConfigMap", volume["configMap"]["name"])
    parse_config(configmap["data"][config_path.name], "deploy ConfigMap")


def test_the_dockerfile_runs_as_a_non_root_user_and_writes_nothing() -> None:
    text = (ROOT / "Dockerfile").read_text()
    final = text.split("\nFROM ")[-1]
    user = re.search(r"^USER (\d+)(?::(\d+))?$", final, re.M)
    assert user is not None and int(user.group(1)) != 0
    deployment = _one(render("deploy"), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(user.group(1))
    assert "PYTHONDONTWRITEBYTECODE=1" in final
    assert "MPLCONFIGDIR=/tmp" in final


def test_the_example_sharing_configs_are_the_ones_gpuscaler_writes() -> None:
    cm = _one(render("deploy/examples"), "ConfigMap", "gpuscaler-sharing-configs")
    text = (ROOT / "deploy" / "config.yaml").read_text()
    config = parse_config(text, "deploy/config.yaml").kubernetes
    assert cm["metadata"]["namespace"] == config.device_plugin_config_map.namespace
    for name, text in cm["data"].items():
        strategy, n = name.rsplit("-", 1)
        expected = sharing_config("mps" if strategy == "mps" else "time-slicing", int(n))
        assert yaml.safe_load(text) == yaml.safe_load(expected), name


def test_the_second_scheduler_calls_the_extender_the_way_it_serves() -> None:
    """deploy/scheduler: the KubeSchedulerConfiguration's extender entry matches the
    extender's Service, port, routes and config (gpuscaler/extender/server.py)."""
    from gpuscaler.extender.metrics import ExtenderMetrics
    from gpuscaler.extender.server import ExtenderApp

    docs = render("deploy/scheduler")
    scheduler_cm = next(d for d in docs if d["metadata"]["name"].startswith("gpu-scheduler-config"))
    ksc = yaml.safe_load(scheduler_cm["data"]["config.yaml"])
    assert ksc["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert ksc["kind"] == "KubeSchedulerConfiguration"
    extender_cm = _one(docs, "ConfigMap", "gpuscaler-extender-config")
    config = parse_config(extender_cm["data"]["gpuscaler.yaml"], "extender ConfigMap")
    (profile,) = ksc["profiles"]
    assert profile["schedulerName"] == config.scheduler.scheduler_name == "gpu-scheduler"
    election = ksc["leaderElection"]
    assert election["leaderElect"] is True
    assert election["resourceName"] not in ("kube-scheduler", config.scheduler.lease.name)
    (ext,) = ksc["extenders"]
    assert ext["nodeCacheCapable"] is True
    app = ExtenderApp(None, ExtenderMetrics(), lambda: None).build()  # type: ignore[arg-type]
    routes = {r.path for r in app.routes}  # type: ignore[attr-defined]
    for verb in ("filterVerb", "prioritizeVerb", "bindVerb"):
        assert f"/{ext[verb]}" in routes, verb
    assert ext["weight"] > 0 and ext["ignorable"] is False
    service = _one(docs, "Service", "gpuscaler-extender")
    port = service["spec"]["ports"][0]
    assert ext["urlPrefix"] == (
        f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{port['port']}"
    )
    deployment = _one(docs, "Deployment", "gpuscaler-extender")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][:1] == ["extender"]
    assert container["args"][container["args"].index("--port") + 1] == str(
        container["ports"][0]["containerPort"]
    )
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    selector = service["spec"]["selector"].items()
    assert selector <= deployment["spec"]["template"]["metadata"]["labels"].items()
    # the controller's Service and ServiceMonitor (deploy/) never select extender pods
    assert deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] != (
        "gpuscaler"
    )


def test_the_extender_rbac_grants_bind_patch_and_its_own_lease() -> None:
    docs = render("deploy/scheduler")
    role = _one(docs, "ClusterRole", "gpuscaler-extender")
    grants = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    pods = {("pods/binding", "create"), ("pods", "patch"), ("pods", "get"), ("pods", "list")}
    assert pods | {("nodes", "list")} <= grants
    lease = _one(docs, "Role", "gpuscaler-extender-lease")
    named = next(r for r in lease["rules"] if r.get("resourceNames"))
    assert named["resourceNames"] == ["gpuscaler-extender"]
    pod = _one(docs, "Deployment", "gpuscaler-extender")["spec"]["template"]["spec"]
    account = _one(docs, "ServiceAccount", "gpuscaler-extender")["metadata"]["name"]
    assert pod["serviceAccountName"] == account
    scheduler_lease = _one(docs, "Role", "gpu-scheduler-lease")
    assert any(r.get("resourceNames") == ["gpu-scheduler"] for r in scheduler_lease["rules"])


def test_the_manifests_apply_to_a_real_server_and_its_pods_are_admitted(kube: Kube) -> None:
    """kubectl apply -k, as the README says, on the real kube-apiserver with the real CRDs
    (ServiceMonitor, PrometheusRule, ScaledObject schemas); the Deployment's pods pass the
    restricted Pod Security admission and the Priority plugin (the controller-manager's
    ReplicaSet controller creates them; nothing schedules them here)."""
    kube.namespace("nvidia-device-plugin")  # the device plugin's install made it
    # Other tests' PriorityClasses of these names (their values are immutable) go first.
    kube.plane.kubectl(
        "delete", "priorityclass", "gpu-critical", "gpu-standard", "gpu-batch", "--ignore-not-found"
    )
    kube.wait_gone("gpuscaler")  # deploy/ makes it; an earlier test's may be terminating
    for directory in ("deploy/examples", "deploy"):
        out = kube.plane.kubectl("apply", "-k", str(ROOT / directory))
        assert "created" in out, out
    kube.namespaces.append("gpuscaler")  # deleted after the test
    kube.plane.kubectl("apply", "-k", str(ROOT / "deploy"), "--dry-run=server")
    assert "Warning" not in kube.plane.kubectl_stderr, kube.plane.kubectl_stderr

    def pods() -> list[Any]:
        return list(
            kube.core.list_namespaced_pod(
                "gpuscaler", label_selector="app.kubernetes.io/name=gpuscaler"
            ).items
        )

    wait_until("the ReplicaSet creates both pods", lambda: len(pods()) == 2, 60, 0.5)
    for pod in pods():
        assert pod.spec.priority == 2_000_000_000  # system-cluster-critical
        assert pod.spec.service_account_name == "gpuscaler"
    so = kube.get("/apis/keda.sh/v1alpha1/namespaces/default/scaledobjects/llm-chat")
    assert so["metadata"]["labels"]["gpuscaler.io/enabled"] == "true"
    kube.plane.kubectl("delete", "-k", str(ROOT / "deploy/examples"), "--wait=false")
