"""The Helm chart (deploy/helm/gpuscaler), with helm built by tests/helm/build.sh: it lints;
with the values matching the kustomize base it renders exactly what `kubectl kustomize`
does (the config, dashboard and rules are the base's own files, the rest checked equal);
its values change what they say; it installs on the real control plane."""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import Kube, unavailable, wait_until
from test_deploy import render

from gpuscaler.cli import build_parser
from gpuscaler.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuscaler"
HELM_ONLY_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
}
"""Helm's standard labels: the kustomize base has no release to name."""
AS_KUSTOMIZE = ["--namespace", "gpuscaler", "--set", "createNamespace=true"]


def helm_path() -> str:
    """The helm tests/helm/build.sh built (cached by version), else skip (fail under CI)."""
    text = (ROOT / "tests" / "helm" / "go.mod").read_text()
    match = re.search(r"helm\.sh/helm/v3 (v[0-9.]+)", text)
    assert match, "tests/helm/go.mod pins no helm.sh/helm/v3 version"
    cache = os.environ.get("GPUSCALER_HELM_CACHE") or str(Path.home() / ".cache/gpuscaler/helm")
    helm = Path(cache) / match.group(1) / "bin" / "helm"
    if not helm.exists():
        unavailable("helm is not built: run tests/helm/build.sh")
    return str(helm)


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    homes = {
        f"HELM_{d.upper()}_HOME": f"/tmp/gpuscaler-helm/{d}" for d in ("cache", "config", "data")
    }
    env = os.environ | homes
    return subprocess.run(
        [helm_path(), *args], capture_output=True, text=True, timeout=120, env=env
    )


@functools.cache
def template(*args: str) -> tuple[dict[str, Any], ...]:
    out = helm("template", "gpuscaler", str(CHART), *args)
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def _key(doc: dict[str, Any]) -> tuple[str, str, str]:
    meta = doc["metadata"]
    return doc["kind"], meta.get("namespace", ""), meta["name"]


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """The object without Helm's own labels, the config file parsed (Helm writes it
    through toYaml: same content, no comments)."""
    doc = yaml.safe_load(yaml.safe_dump(doc))
    labels = doc["metadata"].get("labels") or {}
    for label in HELM_ONLY_LABELS:
        labels.pop(label, None)
    if doc["kind"] == "ConfigMap" and "gpuscaler.yaml" in doc.get("data", {}):
        doc["data"]["gpuscaler.yaml"] = yaml.safe_load(doc["data"]["gpuscaler.yaml"])
    return doc


def _one(docs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def _config(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    text = _one(docs, "ConfigMap", "gpuscaler-config")["data"]["gpuscaler.yaml"]
    parse_config(text)  # what gpuscaler will load: valid
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


HASHED_CONFIGS = {
    "gpuscaler-agent-config": ("DaemonSet", None),
    "gpu-scheduler-config": ("Deployment", "config.yaml"),
}
"""ConfigMaps kustomize names with a hash of their content (so a change rolls the workload
mounting them), by name: that workload's kind and the key holding a YAML file. The chart
rolls those workloads by a checksum annotation instead, and writes the file through
toYaml (same content, no comments)."""
HASH = re.compile(r"^(.*)-[a-z0-9]{10}$")


def _without_hashes(doc: dict[str, Any]) -> dict[str, Any]:
    doc = _comparable(doc)
    meta = doc["metadata"]
    bare = HASH.sub(r"\1", meta["name"])
    if doc["kind"] == "ConfigMap" and bare in HASHED_CONFIGS:
        meta["name"] = bare
        key = HASHED_CONFIGS[bare][1]
        if key is not None:
            doc["data"][key] = yaml.safe_load(doc["data"][key])
    if doc["kind"] in {kind for kind, _ in HASHED_CONFIGS.values()}:
        pod = doc["spec"]["template"]
        for volume in pod["spec"].get("volumes", []):
            name = volume.get("configMap", {}).get("name", "")
            if HASH.sub(r"\1", name) in HASHED_CONFIGS:
                volume["configMap"]["name"] = HASH.sub(r"\1", name)
                (pod["metadata"].get("annotations") or {}).pop("checksum/config", None)
                if not pod["metadata"].get("annotations"):
                    pod["metadata"].pop("annotations", None)
    return doc


@pytest.mark.parametrize(
    ("values", "bases"),
    [
        ((), ("deploy",)),
        (("--set", "agent.enabled=true"), ("deploy", "deploy/agent")),
        (("--set", "scheduler.enabled=true"), ("deploy", "deploy/scheduler")),
    ],
    ids=["base", "agent", "scheduler"],
)
def test_the_chart_renders_exactly_what_kustomize_applies(
    values: tuple[str, ...], bases: tuple[str, ...]
) -> None:
    chart = {_key(d): d for d in map(_without_hashes, template(*AS_KUSTOMIZE, *values))}
    base = {_key(d): d for d in map(_without_hashes, (d for b in bases for d in render(b)))}
    assert sorted(chart) == sorted(base)
    for key, doc in base.items():
        assert chart[key] == doc, key


def test_the_agents_own_node_policy_names_its_service_account_in_its_namespace() -> None:
    docs = template("--set", "agent.enabled=true", "--set", "agent.namespace=ops-agent")
    policy = _one(docs, "ValidatingAdmissionPolicy", "gpuscaler-agent-own-node")
    (condition,) = policy["spec"]["matchConditions"]
    user = "system:serviceaccount:ops-agent:gpuscaler-agent"
    assert condition["expression"] == f'request.userInfo.username == "{user}"'
    binding = _one(docs, "ValidatingAdmissionPolicyBinding", "gpuscaler-agent-own-node")
    assert binding["spec"] == {
        "policyName": "gpuscaler-agent-own-node",
        "validationActions": ["Deny"],
    }
    (container,) = _one(docs, "DaemonSet", "gpuscaler-agent")["spec"]["template"]["spec"][
        "containers"
    ]
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}


def test_the_scheduler_follows_the_release_namespace_prometheus_and_its_values() -> None:
    docs = template(
        *("--namespace", "gpu-system", "--set", "scheduler.enabled=true"),
        *("--set", "prometheus.url=http://kps.monitoring:9090"),
        *("--set", "scheduler.kubeScheduler.image=registry.k8s.io/kube-scheduler:v1.33.1"),
    )
    profile = yaml.safe_load(_one(docs, "ConfigMap", "gpu-scheduler-config")["data"]["config.yaml"])
    assert profile["leaderElection"]["resourceNamespace"] == "gpu-system"
    (extender,) = profile["extenders"]
    assert extender["urlPrefix"] == "http://gpuscaler-extender.gpu-system.svc:8888"
    text = _one(docs, "ConfigMap", "gpuscaler-extender-config")["data"]["gpuscaler.yaml"]
    assert parse_config(text).prometheus.url == "http://kps.monitoring:9090"
    for kind, name in [
        ("ClusterRoleBinding", "gpuscaler-extender"),
        ("RoleBinding", "gpu-scheduler-authentication-reader"),
    ]:
        assert _one(docs, kind, name)["subjects"][0]["namespace"] == "gpu-system"
    scheduler = _one(docs, "Deployment", "gpu-scheduler")["spec"]["template"]
    assert scheduler["spec"]["containers"][0]["image"].endswith(":v1.33.1")
    assert "gpuscaler-extender" not in {d["metadata"]["name"] for d in template(*AS_KUSTOMIZE)}


SCHEDULER = ("--set", "scheduler.enabled=true")


def _pod_spec(docs: tuple[dict[str, Any], ...], deployment: str) -> dict[str, Any]:
    spec: dict[str, Any] = _one(docs, "Deployment", deployment)["spec"]["template"]["spec"]
    return spec


def _secret_mounts(docs: tuple[dict[str, Any], ...], deployment: str) -> dict[str, str]:
    """mountPath -> Secret name of the deployment's Secret volumes."""
    spec = _pod_spec(docs, deployment)
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    mounts = spec["containers"][0]["volumeMounts"]
    return {m["mountPath"]: secrets[m["name"]] for m in mounts if m["name"] in secrets}


def test_only_the_gpu_schedulers_pods_reach_the_verbs_and_prometheus_the_metrics_port() -> None:
    docs = template(*SCHEDULER)
    policy = _one(docs, "NetworkPolicy", "gpuscaler-extender")["spec"]
    name = "app.kubernetes.io/name"
    assert policy["podSelector"] == {"matchLabels": {name: "gpuscaler-extender"}}
    assert policy["policyTypes"] == ["Ingress"]
    verbs, metrics = policy["ingress"]  # nothing else is admitted
    assert verbs["from"] == [{"podSelector": {"matchLabels": {name: "gpu-scheduler"}}}]
    assert verbs["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert metrics["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {name: "prometheus"}},
        }
    ]
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    scheduler = _one(docs, "Deployment", "gpu-scheduler")["spec"]["template"]["metadata"]
    assert scheduler["labels"][name] == "gpu-scheduler"
    (extender,) = _pod_spec(docs, "gpuscaler-extender")["containers"]
    assert {p["name"]: p["containerPort"] for p in extender["ports"]} == {
        "http": 8888,
        "metrics": 8889,
    }
    parsed = build_parser().parse_args(extender["args"])  # the flags are the CLI's
    assert (parsed.port, parsed.metrics_port) == (8888, 8889)
    for probe in ("readinessProbe", "livenessProbe"):  # the kubelet's: node traffic, admitted
        assert extender[probe]["httpGet"]["port"] == "metrics"
    monitor = _one(docs, "ServiceMonitor", "gpuscaler-extender")
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    off = template(*SCHEDULER, "--set", "scheduler.networkPolicy.enabled=false")
    assert "NetworkPolicy" not in {d["kind"] for d in off}


def test_with_tls_on_the_gpu_scheduler_calls_the_extender_over_mutual_tls() -> None:
    docs = template("--namespace", "gpu-system", *SCHEDULER, "--set", "scheduler.tls.enabled=true")
    text = _one(docs, "ConfigMap", "gpu-scheduler-config")["data"]["config.yaml"]
    (extender,) = yaml.safe_load(text)["extenders"]
    assert extender["urlPrefix"] == "https://gpuscaler-extender.gpu-system.svc:8888"
    assert extender["enableHTTPS"] is True
    client = "/etc/kubernetes/gpu-scheduler-tls"
    assert extender["tlsConfig"] == {
        "certFile": f"{client}/tls.crt",
        "keyFile": f"{client}/tls.key",
        "caFile": f"{client}/ca.crt",
    }
    assert _secret_mounts(docs, "gpu-scheduler") == {client: "gpu-scheduler-extender-client"}
    text = _one(docs, "ConfigMap", "gpuscaler-extender-config")["data"]["gpuscaler.yaml"]
    tls = parse_config(text).scheduler
    assert (tls.tls_cert_file, tls.tls_key_file, tls.client_ca_file) == tuple(
        f"/etc/gpuscaler-tls/{f}" for f in ("tls.crt", "tls.key", "ca.crt")
    )
    assert _secret_mounts(docs, "gpuscaler-extender") == {
        "/etc/gpuscaler-tls": "gpuscaler-extender-tls"
    }
    plain = template(*SCHEDULER)  # off by default: as kustomize, no Secret needed
    text = _one(plain, "ConfigMap", "gpu-scheduler-config")["data"]["config.yaml"]
    (extender,) = yaml.safe_load(text)["extenders"]
    assert extender["enableHTTPS"] is False and "tlsConfig" not in extender
    assert _secret_mounts(plain, "gpu-scheduler") == {}


@pytest.mark.parametrize(
    "values",
    [(), (*SCHEDULER, "--set", "agent.enabled=true", "--set", "scheduler.tls.enabled=true")],
    ids=["defaults", "scheduler-and-agent-on"],
)
def test_helm_lint_passes(values: tuple[str, ...]) -> None:
    # lint renders every template, NOTES.txt included (helm template leaves NOTES out).
    out = helm("lint", "--strict", str(CHART), *values)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


def test_the_agent_rolls_when_its_config_changes() -> None:
    def checksum(*args: str) -> str:
        daemonset = _one(
            template("--set", "agent.enabled=true", *args), "DaemonSet", "gpuscaler-agent"
        )
        return str(daemonset["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum() != checksum("--set", "dryRun=false")
    config = _one(
        template("--set", "agent.enabled=true", "--set", "dryRun=false"),
        "ConfigMap",
        "gpuscaler-agent-config",
    )
    assert yaml.safe_load(config["data"]["gpuscaler.yaml"])["control"]["dry_run"] is False


def test_every_object_carries_helms_labels_and_the_base_labels() -> None:
    for doc in template(*AS_KUSTOMIZE):
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "gpuscaler", _key(doc)
        assert labels["app.kubernetes.io/part-of"] == "gpuscaler", _key(doc)


@pytest.mark.parametrize("namespace", ["gpu-operator", "nvidia-device-plugin"])
def test_the_device_plugin_namespace_moves_its_rbac_and_the_config_together(namespace: str) -> None:
    docs = template("--namespace", "gpuscaler", "--set", f"devicePlugin.namespace={namespace}")
    for kind in ("Role", "RoleBinding"):
        assert _one(docs, kind, "gpuscaler-sharing-configs")["metadata"]["namespace"] == namespace
    plugin = _config(docs)["kubernetes"]["device_plugin_config_map"]
    assert plugin == {"namespace": namespace, "name": "gpuscaler-sharing-configs"}
    role = _one(docs, "Role", "gpuscaler-sharing-configs")
    assert role["rules"][0]["resourceNames"] == ["gpuscaler-sharing-configs"]


@pytest.mark.parametrize("enabled", [True, False], ids=["dra on", "dra off"])
def test_the_dra_value_turns_the_dra_reads_writes_and_their_grants_on_or_off(
    enabled: bool,
) -> None:
    docs = template("--set", f"dra.enabled={str(enabled).lower()}")
    assert _config(docs)["kubernetes"]["dra"] == {"enabled": enabled}
    rules = _one(docs, "ClusterRole", "gpuscaler")["rules"]
    granted = {
        r for rule in rules if "resource.k8s.io" in rule["apiGroups"] for r in rule["resources"]
    }
    expected = {"resourceslices", "resourceclaims", "deviceclasses", "resourceclaimtemplates"}
    assert granted == (expected if enabled else set())


@pytest.mark.parametrize(
    ("release", "expected"), [("prometheus", "prometheus"), ("", None)], ids=["set", "none"]
)
def test_the_release_label_is_what_kube_prometheus_stack_selects(
    release: str, expected: str | None
) -> None:
    docs = template("--set", f"monitoring.releaseLabel={release}")
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert _one(docs, kind, "gpuscaler")["metadata"]["labels"].get("release") == expected


def test_image_resources_replicas_dry_run_and_config_follow_the_values(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "image": {"repository": "registry.example/gpuscaler", "tag": "0.2.0"},
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                "replicas": 3,
                "dryRun": False,
                "prometheus": {"url": "http://kps-prometheus.monitoring:9090"},
                "config": {"metrics": {"step": "15s", "staleness": "2m"}, "workloads": []},
                "monitoring": {
                    "dashboard": {"enabled": False},
                    "prometheusRule": {"enabled": False},
                },
            }
        )
    )
    docs = template("-f", str(values))
    deployment = _one(docs, "Deployment", "gpuscaler")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example/gpuscaler:0.2.0"
    # Helm merges a map value over the chart's: the limit stays unless set to null.
    assert container["resources"] == {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"memory": "1Gi"},
    }
    assert deployment["spec"]["replicas"] == 3
    config = _config(docs)
    assert config["control"]["dry_run"] is False  # a false value wins over the shipped true
    assert config["prometheus"]["url"] == "http://kps-prometheus.monitoring:9090"
    assert config["metrics"]["step"] == "15s"
    assert config["node_pools"][0]["name"] == "a100-80gb"  # the shipped rest stays
    kinds = {d["kind"] for d in docs}
    assert "PrometheusRule" not in kinds and "Namespace" not in kinds
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"] == ["gpuscaler-config"]


def _with_gpu_operator_component(tmp_path: Path) -> tuple[dict[str, Any], ...]:
    """The base plus deploy/components/gpu-operator, as a user's kustomization uses them."""
    deploy = os.path.relpath(ROOT / "deploy", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{deploy}]\ncomponents: [{deploy}/components/gpu-operator]\n"
    )
    return render(str(tmp_path))  # an absolute path: ROOT / it is itself


def test_the_gpu_operator_component_changes_only_the_device_plugin_namespace(
    tmp_path: Path,
) -> None:
    base = {_key(d): _comparable(d) for d in render("deploy")}
    for key in [k for k in base if k[2] == "gpuscaler-sharing-configs"]:
        doc = base.pop(key)
        doc["metadata"]["namespace"] = "gpu-operator"
        base[(key[0], "gpu-operator", key[2])] = doc
    config = base[("ConfigMap", "gpuscaler", "gpuscaler-config")]["data"]["gpuscaler.yaml"]
    config["kubernetes"]["device_plugin_config_map"]["namespace"] = "gpu-operator"
    component = {_key(d): _comparable(d) for d in _with_gpu_operator_component(tmp_path)}
    assert component == base


def test_the_gpu_operator_component_renders_what_the_chart_does_for_gpu_operator(
    tmp_path: Path,
) -> None:
    chart = template(*AS_KUSTOMIZE, "--set", "devicePlugin.namespace=gpu-operator")
    component = _with_gpu_operator_component(tmp_path)
    assert {_key(d): _comparable(d) for d in chart} == {_key(d): _comparable(d) for d in component}


def test_an_invalid_value_fails_the_render_with_its_name() -> None:
    out = helm("template", "gpuscaler", str(CHART), "--set", "replicas=two")
    assert out.returncode != 0
    assert "replicas" in out.stderr


@pytest.mark.controlplane
def test_helm_install_puts_the_chart_on_the_real_control_plane_and_its_pods_are_admitted(
    kube: Kube,
) -> None:
    """`helm install` (as the README says) into a namespace of the test's own, with the
    GPU Operator's device-plugin namespace: the release deploys, its notes name the
    assumptions, no object draws a Pod Security warning, the ReplicaSet's pods are
    admitted under the restricted standard, and `helm uninstall` removes it."""
    home, plugin = kube.namespace(), kube.namespace()
    kube.plane.kubectl("label", "namespace", home, "pod-security.kubernetes.io/enforce=restricted")
    # Cluster-scoped objects of the same names another test applied with kubectl (the
    # kustomize base) are not Helm's to adopt: one gpuscaler per cluster.
    kube.plane.kubectl(
        "delete", "clusterrole,clusterrolebinding", "gpuscaler", "--ignore-not-found"
    )
    kubeconfig = f"--kubeconfig={kube.plane.admin_kubeconfig}"
    args = ["--namespace", home, "--set", f"devicePlugin.namespace={plugin}"]
    installed = helm("install", "gpuscaler", str(CHART), kubeconfig, *args)
    try:
        assert installed.returncode == 0, installed.stderr
        assert "STATUS: deployed" in installed.stdout
        assert f"ConfigMap {plugin}/gpuscaler-sharing-configs" in installed.stdout  # NOTES
        assert "shadow mode" in installed.stdout
        assert "PodSecurity" not in installed.stderr, installed.stderr  # restricted holds
        role = kube.get(
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{plugin}/roles/gpuscaler-sharing-configs"
        )
        assert role["rules"][0]["resourceNames"] == ["gpuscaler-sharing-configs"]

        def pods() -> list[Any]:
            return list(
                kube.core.list_namespaced_pod(
                    home, label_selector="app.kubernetes.io/name=gpuscaler"
                ).items
            )

        wait_until("the ReplicaSet creates both pods", lambda: len(pods()) == 2, 90, 0.5)
        for pod in pods():
            assert pod.spec.service_account_name == "gpuscaler"
            assert pod.spec.priority == 2_000_000_000  # system-cluster-critical
    finally:
        removed = helm("uninstall", "gpuscaler", kubeconfig, "--namespace", home)
    assert removed.returncode == 0, removed.stderr
    assert kube.plane.kubectl("get", "clusterrole", "gpuscaler", "--ignore-not-found") == ""
