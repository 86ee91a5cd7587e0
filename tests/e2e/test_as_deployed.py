"""gpuscaler as deployed, against the real control plane and a real Prometheus.

- Two real `gpuscaler run --kubeconfig ...` processes elect a leader on the real Lease;
  the leader is killed (SIGKILL, no release) and the other takes over after the lease
  expires, then acts.
- The program started exactly as deploy/deployment.yaml starts it: the same args, the
  config rendered from deploy/config.yaml (prometheus.url pointed at the test Prometheus,
  dry_run off as the README's last install step says), the ServiceAccount token and CA
  mounted at the paths the in-cluster config reads (a private mount namespace), the
  KUBERNETES_SERVICE_HOST/PORT and POD_* variables set, as user 10001. Probes, a floor
  on the ScaledObject with its Event, /metrics, and SIGTERM releasing the Lease.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import ROOT, Kube, free_port, unavailable, wait_until
from kubemeta import annotations_of, labels_of, meta
from kubeobjects import deployment, plugin_configmap
from test_cluster_cli import SNAPSHOT, _config, planted_prometheus
from test_deploy import render

from gpuscaler.adapters.kube.nodepools import sharing_config

HOME = "gpuscaler"
GPUSCALER = str(Path(sys.executable).parent / "gpuscaler")
SO = "/apis/keda.sh/v1alpha1/namespaces/ml/scaledobjects/chat"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{HOME}/leases/gpuscaler-leader"


@pytest.fixture
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The planted real Prometheus, fresh for each test: its samples end just before the
    test, so gpuscaler finds them fresh (stale ones never cause an action)."""
    with planted_prometheus(tmp_path_factory.mktemp("prom")) as url:
        yield url


@pytest.fixture
def cluster(kube: Kube) -> Kube:
    """The realistic dump (tests/data/cluster-snapshot.yaml) on the real server, with the
    device-plugin ConfigMap, the scale targets, and deploy/rbac.yaml applied."""
    kube.namespace(HOME)
    kube.seed(yaml.safe_load(SNAPSHOT.read_text())["items"])
    kube.create(plugin_configmap({"ts-2": sharing_config("time-slicing", 2)}))
    for name, replicas in (("chat", 2), ("embedder", 1)):  # scale targets; no GPU needed
        kube.create(deployment(name, "ml", replicas, app=f"{name}-target"))
    kube.plane.kubectl("apply", "-f", str(ROOT / "deploy" / "rbac.yaml"))
    return kube


def _lease_holder(kube: Kube) -> str | None:
    try:
        holder = kube.get(LEASE)["spec"].get("holderIdentity")
        return None if holder is None else str(holder)
    except Exception:
        return None


def _events(kube: Kube, ns: str, reason: str) -> list[dict[str, Any]]:
    items = kube.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e.get("reason") == reason]


class Replica:
    """`gpuscaler run` in its own process group, output to a file, stopped by PID."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path):
        self.log = log
        with log.open("wb") as out:
            self.popen = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    @classmethod
    def run(cls, cfg: Path, kubeconfig: Path, pod: str, log: Path, *flags: str) -> Replica:
        """`gpuscaler run` as the Deployment starts it, as pod `pod` of HOME, plus `flags`."""
        argv = [GPUSCALER, "run", "--config", str(cfg), "--kubeconfig", str(kubeconfig), *flags]
        return cls(argv, _env(POD_NAME=pod, POD_NAMESPACE=HOME), log)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)

    def stop(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(10)


def run_two_ticks(
    cluster: Kube, cfg: Path, tmp_path: Path, pod: str
) -> subprocess.CompletedProcess[str]:
    """`gpuscaler run` for two ticks as pod `pod` of HOME, with its ServiceAccount's token."""
    kubeconfig = cluster.plane.token_kubeconfig(HOME, "gpuscaler", tmp_path / "sa.kubeconfig")
    argv = [GPUSCALER, "run", "--config", str(cfg), "--kubeconfig", str(kubeconfig)]
    return subprocess.run(
        [*argv, "--max-ticks", "2", "--metrics-port", "0"],
        env=_env(POD_NAME=pod, POD_NAMESPACE=HOME),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for r in started:
        r.stop()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    return env | {"PYTHONDONTWRITEBYTECODE": "1"} | extra


def test_two_real_replicas_elect_one_leader_and_the_other_takes_over_when_it_dies(
    cluster: Kube, prom_url: str, tmp_path: Path, replicas: list[Replica]
) -> None:
    lease = "kubernetes: {lease: {duration: 6s, renew_deadline: 4s, retry_period: 1s}}\n"
    cfg = _config(tmp_path, prom_url, lease)
    kubeconfig = cluster.plane.token_kubeconfig(HOME, "gpuscaler", tmp_path / "sa.kubeconfig")

    def start(name: str) -> Replica:
        port = str(free_port())
        flags = ("--metrics-port", port, "--metrics-host", "127.0.0.1")
        r = Replica.run(cfg, kubeconfig, name, tmp_path / f"{name}.log", *flags)
        replicas.append(r)
        return r

    a = start("gpuscaler-a")
    wait_until("replica a leads", lambda: _lease_holder(cluster) == "gpuscaler-a", 60)
    b = start("gpuscaler-b")
    wait_until("replica b runs", lambda: "standby" in b.output() or "tick" in b.output(), 60, 0.5)
    time.sleep(3)  # b's renewal attempts meet a live lease
    assert _lease_holder(cluster) == "gpuscaler-a", b.output()[-2000:]
    # a acted as leader: the floor is on the real ScaledObject.
    wait_until("a sets the floor", lambda: cluster.get(SO)["spec"]["minReplicaCount"] > 2, 60, 0.5)
    a.signal(signal.SIGKILL)  # dies without releasing the lease
    killed = time.monotonic()
    cluster.patch(SO, {"spec": {"minReplicaCount": 2}})  # lowered while there is no leader
    wait_until("b takes over", lambda: _lease_holder(cluster) == "gpuscaler-b", 40, 0.2)
    took = time.monotonic() - killed
    assert took >= 3, f"taken over after {took:.1f} s: before the lease could expire"
    wait_until("b acts", lambda: cluster.get(SO)["spec"]["minReplicaCount"] > 2, 60, 0.5)

    def recorded_by_b() -> bool:
        return any(
            e.get("reportingInstance") == "gpuscaler-b"
            for e in _events(cluster, "ml", "ReplicaFloorChanged")
        )

    # The Event is written just after the patch that set the floor: wait for it too.
    try:
        wait_until("b records an Event", recorded_by_b, 30, 0.5)
    except TimeoutError:
        pytest.fail(f"the new leader recorded no Event; its log:\n{b.output()[-3000:]}")
    b.signal(signal.SIGTERM)
    b.popen.wait(30)
    assert _lease_holder(cluster) is None  # released on a clean stop
    assert "Traceback" not in a.output() + b.output()


def test_run_acts_on_the_cluster_as_leader_with_its_service_account(
    cluster: Kube, prom_url: str, tmp_path: Path
) -> None:
    # The flow end to end in two ticks: a config gpuscaler adds is named on nodes at once
    # here; the propagation wait itself is tested in test_kube_nodes.py.
    cfg = _config(tmp_path, prom_url, "kubernetes: {config_propagation: 0s}\n")
    out = run_two_ticks(cluster, cfg, tmp_path, "gpuscaler-abc")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "HTTP 4" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]
    so = cluster.get(SO)
    assert so["spec"]["minReplicaCount"] > 2
    assert "gpuscaler.io/last-decision" in so["metadata"]["annotations"]
    keda_hpa = cluster.get(
        "/apis/autoscaling/v2/namespaces/ml/horizontalpodautoscalers/keda-hpa-chat"
    )
    assert keda_hpa["spec"]["minReplicas"] == 2  # never KEDA's HPA
    for name in ("gpu-a100-0", "gpu-a100-1"):
        labels = labels_of(cluster.core.read_node(name))
        assert labels["nvidia.com/device-plugin.config"] == "ts-4"
    cm = cluster.core.read_namespaced_config_map(
        "gpuscaler-sharing-configs", "nvidia-device-plugin"
    )
    assert "ts-4" in (cm.data or {})
    assert _lease_holder(cluster) is None  # released on a clean stop
    nodes = {meta(cluster.core.read_node(n)).uid for n in ("gpu-a100-0", "gpu-a100-1")}
    node_events = [  # `default` outlives the test: only the events about these nodes
        e for e in _events(cluster, "default", "FragmentsChanged") if e["regarding"]["uid"] in nodes
    ]
    assert len(node_events) == 2
    assert _events(cluster, "ml", "ReplicaFloorChanged")
    assert _events(cluster, "nvidia-device-plugin", "SharingConfigAdded")
    victim = cluster.core.read_namespaced_pod("sweep-a-0", "research")
    assert "gpuscaler.io/checkpoint-requested" in annotations_of(victim)
    web = cluster.get("/apis/autoscaling/v2/namespaces/frontend/horizontalpodautoscalers/web")
    assert not web["metadata"].get("annotations")  # not opted in


# --------------------------------------------------------------------------- as deployed


def _container() -> dict[str, Any]:
    deployment = next(d for d in render("deploy") if d["kind"] == "Deployment")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container | {"_pod": deployment["spec"]["template"]["spec"]}


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _can_mount_privately() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"):
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, timeout=10
    )
    return probe.returncode == 0


def _http(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_started_exactly_as_the_deployment_starts_it(
    cluster: Kube, prom_url: str, tmp_path: Path, replicas: list[Replica]
) -> None:
    if not _can_mount_privately():
        unavailable("needs root, unshare and setpriv to mount the in-cluster paths privately")
    container = _container()
    pod = container.pop("_pod")
    args: list[str] = list(container["args"])
    config_path = Path(args[args.index("--config") + 1])
    port = int(args[args.index("--metrics-port") + 1])
    # The probes ask the port and paths the program serves.
    probe_port = container["readinessProbe"]["httpGet"]["port"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]}[probe_port] == port
    assert container["livenessProbe"]["httpGet"]["port"] == probe_port
    if not _port_free(port):  # another program on this machine holds it
        port = free_port()
        args[args.index("--metrics-port") + 1] = str(port)

    # The ConfigMap's file, as deploy/config.yaml has it, pointed at the test Prometheus.
    config_dir, sa_dir = tmp_path / "config", tmp_path / "serviceaccount"
    config_dir.mkdir()
    sa_dir.mkdir()
    config = yaml.safe_load((ROOT / "deploy" / "config.yaml").read_text())
    config["prometheus"]["url"] = prom_url
    config["control"]["dry_run"] = False  # the README's last step: leave shadow mode
    # The replica floor earns its forecast after ~10 minutes of ticks (replicas.skill_check);
    # this test checks the deployment's mechanics within a minute, so it starts trusting.
    config.setdefault("replicas", {})["skill_check"] = False
    # KEDA's external scaler listens on the container port the Service targets.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert config["external_scaler"]["port"] == ports["extscaler"]
    if not _port_free(ports["extscaler"]):  # another program on this machine holds it
        config["external_scaler"]["port"] = free_port()
    (config_dir / config_path.name).write_text(yaml.safe_dump(config))
    (sa_dir / "token").write_text(cluster.plane.token(HOME, "gpuscaler"))
    shutil.copy(cluster.plane.ca_file, sa_dir / "ca.crt")
    (sa_dir / "namespace").write_text(HOME)
    for d in (tmp_path, config_dir, sa_dir):
        d.chmod(0o755)
    for f in (*config_dir.iterdir(), *sa_dir.iterdir()):
        f.chmod(0o644)

    token_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    user = str(pod["securityContext"]["runAsUser"])
    group = str(pod["securityContext"]["runAsGroup"])
    for mount_point in (str(config_path.parent), token_dir):
        os.makedirs(mount_point, exist_ok=True)  # empty mount points on the host
    script = (
        f'mount --bind "{config_dir}" "{config_path.parent}" && '
        f'mount --bind "{sa_dir}" "{token_dir}" && '
        f'exec setpriv --reuid {user} --regid {group} --clear-groups "$@"'
    )
    env = _env(
        KUBERNETES_SERVICE_HOST="127.0.0.1",
        KUBERNETES_SERVICE_PORT=str(cluster.plane.port),
        POD_NAME="gpuscaler-7c9d-x1",
        POD_NAMESPACE=HOME,
        HOME="/tmp",
    )
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", GPUSCALER]
    r = Replica([*argv, *args], env, tmp_path / "deployed.log")
    replicas.append(r)
    base = f"http://127.0.0.1:{port}"
    readiness = container["readinessProbe"]["httpGet"]["path"]
    liveness = container["livenessProbe"]["httpGet"]["path"]
    wait_until(f"{readiness} passes", lambda: _http(base + readiness)[0] == 200, 90, 0.5)
    assert _http(base + liveness)[0] == 200, r.output()[-3000:]

    # The decision reached the real ScaledObject, with the reason in an Event.
    wait_until("the floor is set", lambda: cluster.get(SO)["spec"]["minReplicaCount"] > 2, 60, 0.5)
    floor = cluster.get(SO)["spec"]["minReplicaCount"]
    (event,) = [
        e for e in _events(cluster, "ml", "ReplicaFloorChanged") if e["regarding"]["name"] == "chat"
    ]
    assert event["reportingInstance"] == "gpuscaler-7c9d-x1"
    assert f"floor 2 -> {floor}" in event["note"]
    status, metrics = _http(base + "/metrics")
    assert status == 200
    assert f'gpuscaler_replica_floor{{workload="ml/ScaledObject/chat"}} {floor:.1f}' in metrics
    assert "gpuscaler_leader 1.0" in metrics
    assert _lease_holder(cluster) == "gpuscaler-7c9d-x1"
    # KEDA's external scaler answers on the port the Service targets, from the same plan.
    assert _external_floor(config["external_scaler"]["port"]) == floor, r.output()[-3000:]
    # The process ran as the Deployment's user, not root.
    ps = subprocess.run(
        ["ps", "-o", "uid=", "-p", str(r.popen.pid)],  # unshare exec'd it: the same PID
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert ps.stdout.strip() == user

    grace = float(pod.get("terminationGracePeriodSeconds", 30))  # Kubernetes' default
    stopped = time.monotonic()
    r.signal(signal.SIGTERM)
    r.popen.wait(grace)
    assert time.monotonic() - stopped < grace
    assert _lease_holder(cluster) is None, r.output()[-3000:]
    assert "Traceback" not in r.output()


def _external_floor(port: int) -> float:
    """The floor KEDA's external scaler serves for ml/chat (GetMetrics, as KEDA asks)."""
    import grpc

    from gpuscaler.extscaler.pb import externalscaler_pb2 as pb
    from gpuscaler.extscaler.pb import externalscaler_pb2_grpc as pb_grpc

    ref = pb.ScaledObjectRef(name="chat", namespace="ml")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        got = pb_grpc.ExternalScalerStub(channel).GetMetrics(
            pb.GetMetricsRequest(scaledObjectRef=ref, metricName="gpuscaler-replica-floor"),
            timeout=10,
        )
    return float(got.metricValues[0].metricValueFloat)
