"""A real Kubernetes control plane for the tests: etcd, kube-apiserver, and on demand
kube-controller-manager and kube-scheduler, built by `tests/controlplane/build.sh`
(binaries cached outside the repository, keyed by version).

Everything listens on 127.0.0.1 on free ports, with self-signed certificates, RBAC and
ServiceAccount tokens; there is no kubelet, so nodes are plain API objects and pods are
made Running by a status patch. Every process is stopped by its PID, every wait bounded.

Fixtures (tests/conftest.py): `control_plane` (session; the vendored CRDs of tests/data/crds
installed, the controller-manager running; missing binaries skip, or fail under CI=true),
`kube` (one test's `Kube` handle, which deletes what it made) and `scheduler`
(kube-scheduler for one test). `Recorder(api)` logs every (method, path, status) a client
sends.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from kubeobjects import priority_class, unschedulable
from kubepki import make_pki, write_kubeconfig
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

Json = dict[str, Any]
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CRDS = HERE / "data" / "crds"
TOOLS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
START_TIMEOUT = 60.0
"""Seconds for a component to answer ready; the apiserver needs about 4 on an idle 2-core
machine, more when the suite shares it."""


# --------------------------------------------------------------------------- binaries


def unavailable(reason: str) -> NoReturn:
    """A real component a test needs is missing: skip on a developer's machine; fail under
    CI, which installs every one (a skipped real-server test proves nothing)."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI installs it and must run this test")
    pytest.skip(reason)


def k8s_version() -> str:
    for line in (HERE / "controlplane" / "go.mod").read_text().splitlines():
        parts = line.split()
        if "k8s.io/kubernetes" in parts:
            return parts[parts.index("k8s.io/kubernetes") + 1]
    raise RuntimeError("tests/controlplane/go.mod requires no k8s.io/kubernetes")


def bin_dir() -> Path:
    """Where build.sh puts the binaries ($GPUSCALER_CP_CACHE/<version>/bin)."""
    cache = os.environ.get("GPUSCALER_CP_CACHE") or str(
        Path.home() / ".cache" / "gpuscaler" / "controlplane"
    )
    return Path(cache) / k8s_version() / "bin"


def missing_binaries() -> list[str]:
    return [t for t in TOOLS if not os.access(bin_dir() / t, os.X_OK)]


def kubectl_path() -> str | None:
    """The built kubectl, else one on PATH."""
    built = bin_dir() / "kubectl"
    return str(built) if os.access(built, os.X_OK) else shutil.which("kubectl")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(what: str, check: Callable[[], bool], timeout: float, every: float = 0.1) -> None:
    """Poll `check` until it is true; TimeoutError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:  # not up yet: connection refused, 5xx, 404 ...
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


# --------------------------------------------------------------------------- processes


class Process:
    """A component started in its own process group, logging to a file, stopped by PID."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None):
        self.name = name
        self.log = log
        with log.open("wb") as out:
            self.popen = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        if not self.alive():
            return
        os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)


class ControlPlane:
    """etcd + kube-apiserver (+ controller-manager, scheduler on demand) on 127.0.0.1."""

    def __init__(
        self,
        workdir: Path | None = None,
        bin: Path | None = None,
        apiserver_args: tuple[str, ...] = (),
    ):
        self.apiserver_args = apiserver_args
        """Extra kube-apiserver flags (e.g. --watch-cache=false for one test's own plane)."""
        self.bin = bin or bin_dir()
        self.dir = workdir or Path(tempfile.mkdtemp(prefix="gpuscaler-cp-"))
        self.pki = self.dir / "pki"
        self.pki.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, Process] = {}
        self.port = 0
        self.url = ""
        self.ca_file = self.pki / "ca.crt"
        self.admin_kubeconfig = self.dir / "admin.kubeconfig"
        self.kubectl_stderr = ""

    # ------------------------------------------------------------------ start / stop

    def _start(self, name: str, argv: list[str]) -> Process:
        p = Process(name, [str(self.bin / name), *argv], self.dir / f"{name}.log")
        self.processes[name] = p
        return p

    def _wait_http(self, p: Process, url: str, context: ssl.SSLContext | None) -> None:
        def ready() -> bool:
            if not p.alive():
                raise RuntimeError(f"{p.name} exited:\n{p.tail()}")
            with urllib.request.urlopen(url, timeout=2, context=context) as r:
                return bool(r.status == 200)

        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                if ready():
                    return
            except RuntimeError:
                raise
            except Exception:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{p.name} not ready at {url} within {START_TIMEOUT:.0f} s:\n{p.tail()}")

    def admin_ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
        return ctx

    def start(self) -> ControlPlane:
        try:
            self._start_core()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_core(self) -> None:
        make_pki(self.pki)
        client_port, peer_port, self.port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        etcd = self._start(
            "etcd",
            [
                "--name=default",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._wait_http(etcd, f"{etcd_url}/health", None)
        self.url = f"https://127.0.0.1:{self.port}"
        apiserver = self._start(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",  # 127.0.0.1 cannot be an Endpoint
                f"--secure-port={self.port}",
                f"--cert-dir={self.pki}",
                f"--tls-cert-file={self.pki / 'apiserver.crt'}",
                f"--tls-private-key-file={self.pki / 'apiserver.key'}",
                f"--client-ca-file={self.ca_file}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={self.pki / 'sa.pub'}",
                f"--service-account-signing-key-file={self.pki / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
                *self.apiserver_args,
            ],
        )
        write_kubeconfig(
            self.admin_kubeconfig,
            self.url,
            self.ca_file,
            {
                "client-certificate": str(self.pki / "admin.crt"),
                "client-key": str(self.pki / "admin.key"),
            },
        )
        self._wait_http(apiserver, f"{self.url}/readyz", self.admin_ssl())
        self.install_crds()

    def start_controller_manager(self) -> None:
        if "kube-controller-manager" in self.processes:
            return
        # No kubelet heartbeats here: the node lifecycle and taint eviction controllers
        # would taint every node unreachable and evict its pods, so they are off.
        p = self._start(
            "kube-controller-manager",
            [
                f"--kubeconfig={self.admin_kubeconfig}",
                f"--authentication-kubeconfig={self.admin_kubeconfig}",
                f"--authorization-kubeconfig={self.admin_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={(port := free_port())}",
                "--leader-elect=false",
                "--controllers=*,-node-lifecycle-controller,-taint-eviction-controller",
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.ca_file}",
                "--use-service-account-credentials=false",
                "--concurrent-namespace-syncs=2",
                "--horizontal-pod-autoscaler-sync-period=2s",  # 15 s by default
                "--v=1",
            ],
        )
        self._wait_http(p, f"https://127.0.0.1:{port}/healthz", _insecure())

    def start_scheduler(self) -> None:
        if "kube-scheduler" in self.processes:
            return
        p = self._start(
            "kube-scheduler",
            [
                f"--kubeconfig={self.admin_kubeconfig}",
                f"--authentication-kubeconfig={self.admin_kubeconfig}",
                f"--authorization-kubeconfig={self.admin_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={(port := free_port())}",
                "--leader-elect=false",
                "--v=1",
            ],
        )
        self._wait_http(p, f"https://127.0.0.1:{port}/healthz", _insecure())

    def stop_scheduler(self) -> None:
        p = self.processes.pop("kube-scheduler", None)
        if p is not None:
            p.stop()

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            self.processes[name].stop()
        self.processes.clear()

    # ------------------------------------------------------------------ using it

    def api(self) -> client.ApiClient:
        """An admin client (system:masters)."""
        api: client.ApiClient = kube_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.admin_kubeconfig)
        )
        return api

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        out = subprocess.run(
            [str(self.bin / "kubectl"), f"--kubeconfig={self.admin_kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
        self.kubectl_stderr = out.stderr  # warnings (Pod Security, deprecations) land here
        return out.stdout

    def install_crds(self) -> None:
        self.kubectl("apply", "--server-side", "-f", str(CRDS))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")

    def token(
        self,
        namespace: str,
        service_account: str,
        seconds: int = 3600,
        pod: tuple[str, str] | None = None,
    ) -> str:
        """A TokenRequest token of the ServiceAccount; bound to `pod` (name, UID) as the
        kubelet mounts one, it carries the pod's node (the claim the apiserver shows as
        user extra authentication.kubernetes.io/node-name)."""
        bound = None
        if pod is not None:
            bound = client.V1BoundObjectReference(
                api_version="v1", kind="Pod", name=pod[0], uid=pod[1]
            )
        spec = client.V1TokenRequestSpec(
            audiences=[], expiration_seconds=seconds, bound_object_ref=bound
        )
        with self.api() as api:
            answer = client.CoreV1Api(api).create_namespaced_service_account_token(
                service_account, namespace, client.AuthenticationV1TokenRequest(spec=spec)
            )
        assert answer.status is not None
        return str(answer.status.token)

    def token_kubeconfig(
        self, namespace: str, service_account: str, path: Path, pod: tuple[str, str] | None = None
    ) -> Path:
        token = self.token(namespace, service_account, pod=pod)
        return write_kubeconfig(path, self.url, self.ca_file, {"token": token})


@contextlib.contextmanager
def running(plane: ControlPlane) -> Iterator[ControlPlane]:
    """`plane` started with its controller-manager, and stopped by PID when done."""
    try:
        plane.start()
        plane.start_controller_manager()
        yield plane
    finally:
        plane.stop()


def _insecure() -> ssl.SSLContext:
    """For the components' own /healthz (self-signed serving certs of their own)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


# --------------------------------------------------------------------------- per test


class Recorder:
    """Records every (method, path, status) an `ApiClient` sends, refusals included: what
    the fake server's request log was, for the real server."""

    def __init__(self, api: client.ApiClient):
        self.api = api
        self.calls: list[tuple[str, str, int]] = []
        request = api.rest_client.request

        def recorded(method: str, url: str, *args: Any, **kw: Any) -> Any:
            path = "/" + url.split("://", 1)[-1].split("/", 1)[-1].split("?")[0]
            try:
                answer = request(method, url, *args, **kw)  # type: ignore[no-untyped-call]
            except ApiException as e:
                self.calls.append((method, path, int(e.status)))
                raise
            self.calls.append((method, path, int(answer.status)))
            return answer

        api.rest_client.request = recorded  # type: ignore[method-assign]

    def writes(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p, _ in self.calls if m in ("PATCH", "PUT", "POST", "DELETE")]


class Kube:
    """One test's view of the shared control plane; cleans up what it made."""

    def __init__(self, plane: ControlPlane):
        self.plane = plane
        self.api = plane.api()
        self.core = client.CoreV1Api(self.api)
        self.nodes: list[str] = []
        self.namespaces: list[str] = []
        self.strays: list[str] = []
        """Paths of seeded objects in namespaces this test did not make."""

    def namespace(self, name: str | None = None) -> str:
        """A fresh namespace (unique name unless given), with its default ServiceAccount
        (pods are refused until the controller-manager made it)."""
        name = name or f"t-{uuid.uuid4().hex[:8]}"
        # A fixed name an earlier test used may still be terminating: wait for it to go.
        wait_until(f"namespace {name} gone", lambda: not self._exists(name), 60, 0.5)
        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        self.namespaces.append(name)
        wait_until(
            f"ServiceAccount {name}/default",
            lambda: self.core.read_namespaced_service_account("default", name) is not None,
            30,
        )
        return name

    def create(self, doc: Json) -> Json:
        """Create any object from its JSON (namespaced by its metadata.namespace)."""
        return self.request("POST", self.path(doc).rsplit("/", 1)[0], doc)

    def ensure(self, doc: Json) -> Json:
        """Create, or leave as it is when it exists (cluster-wide objects tests share)."""
        try:
            return self.create(doc)
        except ApiException as e:
            if e.status != 409:
                raise
            return self.get(self.path(doc))

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Json:
        """A raw API call; ApiException on an error status."""
        method, url, headers, data, post = self.api.param_serialize(
            method=method,
            resource_path=path,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(
            method, url, header_params=headers, body=data, post_params=post, _request_timeout=30
        )
        response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status < 300:
            raise ApiException(http_resp=response)
        return json.loads(response.data) if response.data else {}

    def get(self, path: str) -> Json:
        return self.request("GET", path)

    def add_gpu_node(
        self, name: str, labels: dict[str, str], gpus: int = 8, annotations: Json | None = None
    ) -> Json:
        """A Node as GPU feature discovery and the device plugin leave it: the labels,
        `nvidia.com/gpu` capacity and allocatable, Ready, and no not-ready taint."""
        self.core.create_node(
            client.V1Node(
                metadata=client.V1ObjectMeta(name=name, labels=labels, annotations=annotations)
            )
        )
        self.nodes.append(name)
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        self.request(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}},
            "application/strategic-merge-patch+json",
        )
        # No kubelet will lift the taints a new node gets; remove them as it would.
        return self.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})

    def make_running(self, namespace: str, name: str, ready: bool = True) -> Json:
        """What a kubelet would report: phase Running, containers started, Ready."""
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = "True" if ready else "False"
        pod = self.core.read_namespaced_pod(name, namespace)
        containers = [
            {
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "ready": ready,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": now}},
            }
            for c in (pod.spec.containers if pod.spec else [])
        ]
        conditions = [
            {
                "type": t,
                "status": status if t in ("Ready", "ContainersReady") else "True",
                "lastTransitionTime": now,
            }
            for t in ("Initialized", "PodScheduled", "ContainersReady", "Ready")
        ]
        return self.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}/status",
            {
                "status": {
                    "phase": "Running",
                    "startTime": now,
                    "podIP": "10.1.0.10",
                    "conditions": conditions,
                    "containerStatuses": containers,
                }
            },
            "application/strategic-merge-patch+json",
        )

    def patch(self, path: str, body: Json) -> Json:
        """A JSON merge patch (RFC 7386) of the object at `path`."""
        return self.request("PATCH", path, body, "application/merge-patch+json")

    def bind(self, namespace: str, name: str, node: str) -> Json:
        """Bind a pod to `node`, as kube-scheduler does."""
        target = {"apiVersion": "v1", "kind": "Node", "name": node}
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name}, "target": target}
        return self.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body)

    def mark_unschedulable(self, namespace: str, name: str, since: str, message: str = "") -> Json:
        """What kube-scheduler leaves on a pod it cannot place: Pending, not scheduled."""
        status = {"phase": "Pending", "conditions": [unschedulable(since, message)]}
        return self.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}/status",
            {"status": status},
            "application/strategic-merge-patch+json",
        )

    def seed(self, items: list[Json]) -> dict[tuple[str, str | None, str], Json]:
        """Create objects as `kubectl get -o yaml` dumped them: server-set fields dropped,
        namespaces made, owner references pointed at the owners created here (others
        dropped, or the garbage collector would delete the orphan), then each status
        written through its subresource as a kubelet or controller would. Returns the
        created objects by (kind, namespace, name)."""
        made: dict[tuple[str, str | None, str], Json] = {}
        order = {k: i for i, k in enumerate(("PriorityClass", "Node", "ScaledObject"))}
        for item in sorted(items, key=lambda d: order.get(d["kind"], len(order))):
            doc = json.loads(json.dumps(item))
            meta = doc["metadata"]
            spec = doc.get("spec") or {}
            if doc["kind"] == "Pod" and not spec.get("priorityClassName", "system-").startswith(
                "system-"
            ):
                # A dump of pods without every PriorityClass they name: the Priority
                # admission plugin refuses a pod whose class is missing, so make it.
                self.ensure(priority_class(spec["priorityClassName"], spec.get("priority", 0)))
            if doc["kind"] == "PriorityClass":
                self.ensure(doc)
                continue
            for key in (
                "resourceVersion",
                "uid",
                "creationTimestamp",
                "managedFields",
                "generation",
                "selfLink",
            ):
                meta.pop(key, None)
            ns = meta.get("namespace")
            if ns and ns not in self.namespaces and ns not in _SYSTEM_NAMESPACES:
                self.namespace(ns)  # (waits for one of that name an earlier test deleted)
            owners = []
            for ref in meta.pop("ownerReferences", None) or []:
                owner = made.get((ref["kind"], ns, ref["name"]))
                if owner is not None:
                    owners.append({**ref, "uid": owner["metadata"]["uid"]})
            if owners:
                meta["ownerReferences"] = owners
            status = doc.pop("status", None)
            created = self.create(doc)
            if ns and ns not in self.namespaces:  # kube-system, default: not deleted whole
                self.strays.append(self.path(doc))
            if doc["kind"] == "Node":
                self.nodes.append(meta["name"])
                taints = doc.get("spec", {}).get("taints")
                self.patch(f"/api/v1/nodes/{meta['name']}", {"spec": {"taints": taints}})
            if status and doc["kind"] in _STATUS:
                created = self.patch(self.path(doc) + "/status", {"status": status})
            made[(doc["kind"], ns, meta["name"])] = created
        return made

    def wait_gone(self, ns: str) -> None:
        """Wait while a namespace `ns` is terminating (a fixed name an earlier test
        deleted): nothing can be created in it meanwhile."""

        def terminating() -> bool:
            try:
                status = self.core.read_namespace(ns).status
                return status is not None and status.phase == "Terminating"
            except ApiException:
                return False

        wait_until(f"namespace {ns} gone", lambda: not terminating(), 60, 0.5)

    def _exists(self, ns: str) -> bool:
        try:
            self.core.read_namespace(ns)
            return True
        except ApiException:
            return False

    def path(self, doc: Json) -> str:
        """The API path of the object `doc` names."""
        group, _, version = doc["apiVersion"].rpartition("/")
        plural = _PLURALS.get(doc["kind"]) or doc["kind"].lower() + "s"
        ns = doc["metadata"].get("namespace")
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        base = f"{prefix}/namespaces/{ns}/{plural}" if ns else f"{prefix}/{plural}"
        return f"{base}/{doc['metadata']['name']}"

    def cleanup(self) -> None:
        for path in self.strays:
            with contextlib.suppress(ApiException):
                self.request("DELETE", path + "?gracePeriodSeconds=0")
        for name in self.nodes:
            with contextlib.suppress(ApiException):
                self.core.delete_node(name)
        for ns in self.namespaces:
            try:  # no kubelet finishes a graceful deletion: pods go at once
                self.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
                self.core.delete_namespace(ns)
            except ApiException:
                pass
        self.api.close()  # type: ignore[no-untyped-call]


_SYSTEM_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease"}
_STATUS = {"Node", "Pod", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ScaledObject"}
"""Kinds whose status is a subresource, written after the object."""
_PLURALS = {
    "PriorityClass": "priorityclasses",
    "Ingress": "ingresses",
    "DeviceClass": "deviceclasses",
}
