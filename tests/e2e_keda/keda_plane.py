"""The real KEDA operator and metrics adapter (kedacore/keda v2, built by
tests/keda/build.sh) on the test control plane, for the end-to-end test of gpuscaler's
external scaler.

What a KEDA install does, on 127.0.0.1 and without a kubelet, each step read in KEDA's
source (github.com/kedacore/keda/v2 in the Go module cache, `go env GOMODCACHE`):
- the aggregation layer on the kube-apiserver: a front-proxy CA and the apiserver's proxy
  client certificate (`aggregation_flags`), so the metrics adapter can trust the
  X-Remote-User of the requests the apiserver proxies to it;
- KEDA's CRDs from `config/crd/bases` (ScaledObject, ScaledJob, TriggerAuthentication,
  ClusterTriggerAuthentication, CloudEventSource, ClusterCloudEventSource: the operator
  runs a controller for each and waits for their informers);
- one certificate directory (ca.crt, tls.crt, tls.key) for the operator<->adapter gRPC
  link, which is mutual TLS both ways (`pkg/metricsservice/utils/tls.go`
  LoadGrpcTLSCredentials), and for the adapter's serving certificate. KEDA's own
  rotation (`--enable-cert-rotation`) stays off, as does cmd/webhooks (its admission
  webhooks are a separate program, not started);
- the operator (`cmd/operator/main.go`): its metrics, probe and gRPC addresses on
  127.0.0.1; WATCH_NAMESPACE "" (all), POD_NAMESPACE and KEDA_CLUSTER_OBJECT_NAMESPACE
  `keda` (`pkg/util/env_resolver.go`), as config/manager/manager.yaml sets them;
- the adapter (`cmd/adapter/main.go`, on sigs.k8s.io/custom-metrics-apiserver): the
  arguments of config/metrics-server/deployment.yaml, plus the kubeconfigs a pod would
  not need. Its own /metrics server takes only a port (`":%v"`, all interfaces): no
  flag narrows it, nothing connects to it;
- the Service and APIService of config/metrics-server/ (v1beta1.external.metrics.k8s.io).
  The Service is `ExternalName: localhost`: the aggregator resolves that to
  https://localhost:<APIService port> (k8s.io/apiserver pkg/util/proxy/proxy.go,
  ResolveCluster), where a ClusterIP needs a network layer the tests lack and Endpoints
  refuse loopback addresses (k8s.io/kubernetes pkg/apis/core/validation, ValidateEndpointIP).
  The aggregator checks the adapter's certificate for <service>.<namespace>.svc.
"""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import urllib.request
from pathlib import Path

from controlplane import ControlPlane, Process, free_port, wait_until
from kubepki import make_front_proxy_pki, make_mutual_tls_dir

NAMESPACE = "keda"
ADAPTER_SERVICE = "keda-metrics-apiserver"
API_SERVICE = "v1beta1.external.metrics.k8s.io"
START_TIMEOUT = 120.0
"""Seconds for the operator and the adapter to answer ready (tens on a loaded machine)."""


def keda_version() -> str:
    return os.environ.get("GPUSCALER_KEDA_VERSION", "v2.21.0")


def keda_bin() -> Path:
    """Where tests/keda/build.sh puts the binaries."""
    cache = os.environ.get("GPUSCALER_KEDA_CACHE") or str(
        Path.home() / ".cache" / "gpuscaler" / "keda"
    )
    return Path(cache) / keda_version() / "bin"


def keda_source() -> Path:
    """KEDA's module source, which build.sh's `go get` left in the Go module cache."""
    try:
        cache = subprocess.run(
            ["go", "env", "GOMODCACHE"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        cache = os.environ.get("GOMODCACHE") or str(Path.home() / "go" / "pkg" / "mod")
    return Path(cache) / "github.com" / "kedacore" / "keda" / f"v2@{keda_version()}"


def missing() -> list[str]:
    """What the test needs and does not find, each with where it should be."""
    needed = [
        *(str(keda_bin() / b) for b in ("keda-operator", "keda-adapter")),
        str(keda_source() / "config" / "crd" / "bases"),
    ]
    return [f for f in needed if not os.path.exists(f)]


def aggregation_flags(pki: Path) -> tuple[str, ...]:
    """kube-apiserver flags of the aggregation layer (kubeadm's set), with the
    front-proxy certificates made in `pki`."""
    make_front_proxy_pki(pki)
    return (
        f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
    )


class Keda:
    """KEDA's operator and metrics adapter on `plane`, stopped by PID."""

    def __init__(self, plane: ControlPlane, workdir: Path):
        self.plane = plane
        self.dir = workdir
        self.certs = workdir / "certs"
        self.certs.mkdir(parents=True, exist_ok=True)
        self.processes: list[Process] = []
        self.gpuscaler_port = 0
        """The port the test serves gpuscaler's external scaler on (its trigger names it)."""

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        return env | {
            "KUBECONFIG": str(self.plane.admin_kubeconfig),
            "WATCH_NAMESPACE": "",
            "POD_NAMESPACE": NAMESPACE,
            "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
        }

    def _start(self, name: str, argv: list[str]) -> Process:
        p = Process(name, [str(keda_bin() / name), *argv], self.dir / f"{name}.log", self._env())
        self.processes.append(p)
        return p

    def start(self) -> Keda:
        try:
            self._install()
            self._start_operator()
            self._start_adapter()
        except BaseException:
            self.stop()
            raise
        return self

    def _install(self) -> None:
        crds = keda_source() / "config" / "crd" / "bases"
        # Server-side, forced: the suite's vendored ScaledObject CRD is taken over.
        self.plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
        self.plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        namespace = f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}}}\n"
        self.plane.kubectl("apply", "-f", "-", input=namespace)  # (kept between tests)
        service = f"{ADAPTER_SERVICE}.{NAMESPACE}.svc"
        make_mutual_tls_dir(self.certs, "keda", ["localhost", service])

    def _start_operator(self) -> None:
        probe, self.grpc_port = free_port(), free_port()
        p = self._start(
            "keda-operator",
            [
                f"--metrics-bind-address=127.0.0.1:{free_port()}",
                f"--health-probe-bind-address=127.0.0.1:{probe}",
                f"--metrics-service-bind-address=127.0.0.1:{self.grpc_port}",
                f"--cert-dir={self.certs}",
                f"--ca-dir={self.certs}",
                "--enable-cert-rotation=false",
                "--leader-elect=false",
                "--zap-log-level=info",
                "--zap-encoder=console",
            ],
        )
        self._wait(p, f"http://127.0.0.1:{probe}/readyz", plain=True)

    def _start_adapter(self) -> None:
        port = free_port()
        kubeconfig = str(self.plane.admin_kubeconfig)
        p = self._start(
            "keda-adapter",
            [
                f"--secure-port={port}",
                "--bind-address=127.0.0.1",
                f"--client-ca-file={self.certs / 'ca.crt'}",
                f"--tls-cert-file={self.certs / 'tls.crt'}",
                f"--tls-private-key-file={self.certs / 'tls.key'}",
                f"--cert-dir={self.certs}",
                f"--lister-kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--metrics-service-address=localhost:{self.grpc_port}",
                f"--port={free_port()}",
                "--zap-log-level=info",
                "--zap-encoder=console",
            ],
        )
        self._wait(p, f"https://127.0.0.1:{port}/readyz", plain=False)
        self.plane.kubectl("apply", "-f", "-", input=_adapter_objects(port, self.certs))
        wait_until(
            f"{API_SERVICE} available",
            lambda: (
                self.plane.kubectl("get", "--raw", "/apis/external.metrics.k8s.io/v1beta1") != ""
            ),
            START_TIMEOUT,
            0.5,
        )

    def _wait(self, p: Process, url: str, plain: bool) -> None:
        def ready() -> bool:
            if not p.alive():
                raise RuntimeError(f"{p.name} exited:\n{p.tail()}")
            context = None if plain else _self_signed_ok()
            with urllib.request.urlopen(url, timeout=2, context=context) as r:
                return bool(r.status == 200)

        try:
            wait_until(f"{p.name} ready at {url}", ready, START_TIMEOUT, 0.5)
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n{p.tail()}") from None
        if not p.alive():
            raise RuntimeError(f"{p.name} exited:\n{p.tail()}")

    def logs(self, n: int = 40) -> str:
        return "\n".join(f"--- {p.name}\n{p.tail(n)}" for p in self.processes)

    def stop(self) -> None:
        """The APIService goes first: while it names an adapter that is not there, the
        namespace controller's discovery fails and no namespace finishes deleting
        (NamespaceDeletionDiscoveryFailure)."""
        if self.processes:
            self.plane.kubectl(
                "delete", "apiservice", API_SERVICE, "--ignore-not-found", "--wait=false"
            )
        for p in reversed(self.processes):
            p.stop()
        self.processes.clear()


def _self_signed_ok() -> ssl.SSLContext:
    """For the adapter's /readyz: its certificate is checked by the aggregator, later."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _adapter_objects(port: int, certs: Path) -> str:
    """config/metrics-server/service.yaml and api_service.yaml, the Service made an
    ExternalName (see the module's docstring) and the APIService given the port and CA."""
    ca = base64.b64encode((certs / "ca.crt").read_bytes()).decode()
    return f"""
apiVersion: v1
kind: Service
metadata: {{name: {ADAPTER_SERVICE}, namespace: {NAMESPACE}}}
spec:
  type: ExternalName
  externalName: localhost
  ports: [{{name: https, port: {port}}}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {{name: {API_SERVICE}}}
spec:
  service: {{name: {ADAPTER_SERVICE}, namespace: {NAMESPACE}, port: {port}}}
  group: external.metrics.k8s.io
  version: v1beta1
  caBundle: {ca}
  groupPriorityMinimum: 100
  versionPriority: 100
"""
