"""The extender as deployed: `gpuscaler extender --config PATH --port P` in a subprocess,
reading dcgm-exporter series from a real Prometheus (scraping an exporter in this process
every 500 ms) with ONE grouped query, and the API server fake (kubefake) for nodes, pods,
Leases and Bindings. Requests are shaped as kube-scheduler sends them."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from builders import CLI, http_get
from controlplane import wait_until
from extenderkit import MIB, DcgmExporter, args, pod
from kubefake import FakeCluster, fake_apiserver, kubeconfig_for
from promserver import free_port, prometheus

from gpuscaler.adapters.gpuinfo import PrometheusGpus, grouped_query
from gpuscaler.adapters.prometheus.transport import Transport
from gpuscaler.config import PrometheusConfig


@pytest.fixture(scope="module")
def dcgm() -> Iterator[tuple[DcgmExporter, str]]:
    exporter = DcgmExporter()
    for i in range(4):  # "even": 4 GPUs at 25 %; NUMA from the topology annotation
        exporter.gpu("even", i, 0.25 * MIB)
    exporter.gpu("uneven", 0, 0.0, lowercase=True)  # the newer lowercase label
    exporter.gpu("uneven", 1, 0.8 * MIB, lowercase=True)
    exporter.gpu("tiny", 0, 0.0)
    try:
        with prometheus(scrape_target=f"127.0.0.1:{exporter.port}") as url:
            wait_until("three nodes scraped", lambda: len(_fetch(url)) == 3, 30)
            yield exporter, url
    finally:
        exporter.close()


def _fetch(url: str) -> dict[str, Any]:
    return PrometheusGpus(Transport(PrometheusConfig(url=url)), 60.0, time.time).fetch()


def test_one_grouped_query_reads_every_gpu_of_every_node(dcgm: tuple[DcgmExporter, str]) -> None:
    _, url = dcgm
    transport = Transport(PrometheusConfig(url=url))
    sent: list[str] = []
    original = transport.query

    def recorded(query: str, time: float | None = None) -> list[Any]:
        sent.append(query)
        return original(query, time)

    transport.query = recorded  # type: ignore[method-assign]
    nodes = PrometheusGpus(transport, 60.0, time.time).fetch()
    assert sent == [grouped_query(60.0)]  # one request for all nodes
    assert sorted(nodes) == ["even", "tiny", "uneven"]
    even = nodes["even"]
    assert [g.uuid for g in even.gpus] == [f"GPU-even-{i}" for i in range(4)]
    # total = used + free + reserved; driver-reserved memory counts as used
    assert even.gpus[0].total_mib == pytest.approx(MIB)
    assert even.gpus[0].used_mib == pytest.approx(0.25 * MIB + 512)
    assert [g.used_mib for g in nodes["uneven"].gpus] == pytest.approx([512, 0.8 * MIB + 512])


def _seed(cluster: FakeCluster) -> None:
    topology = [{"uuid": f"GPU-even-{i}", "index": i, "numa_node": i // 2} for i in range(4)]
    nodes: dict[str, dict[str, Any]] = {
        "even": {"annotations": {"gpuscaler.io/gpu-topology": json.dumps(topology)}},
        "uneven": {"labels": {"gpuscaler.io/gpus-per-numa-node": "1"}},
        "tiny": {},
    }
    for name, meta in nodes.items():
        cluster.add("v1", "nodes", {"metadata": {"name": name, **meta}})
    for name, memory in (("a", "30000"), ("b", "30000"), ("c", "1000")):
        body = pod(name, memory=memory)
        body["metadata"]["uid"] = f"uid-{name}"
        cluster.add("v1", "pods", body)


def _post(base: str, verb: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"{base}/{verb}", data=data, method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@contextlib.contextmanager
def _extender(
    prom: str, tmp: Path, scheduler: str = "{cache_ttl: 1s}", *argv: str
) -> Iterator[tuple[str, FakeCluster]]:
    """`gpuscaler extender` in a subprocess on the API server fake; its base URL."""
    cfg = tmp / "gpuscaler.yaml"
    cfg.write_text(f"prometheus:\n  url: {prom}\nscheduler: {scheduler}\n")
    port = free_port()
    with fake_apiserver() as (url, cluster):
        _seed(cluster)
        env = os.environ | {"POD_NAME": "extender-0", "POD_NAMESPACE": "gpuscaler"}
        proc = subprocess.Popen(
            [*CLI, "extender", "--config", str(cfg), "--port", str(port), "--host", "127.0.0.1",
             "--kubeconfig", str(kubeconfig_for(url, tmp / "kubeconfig")), *argv],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        probe = base if "--metrics-port" not in argv else f"http://127.0.0.1:{argv[-1]}"
        try:
            ready = probe + "/readyz"
            wait_until("ready", lambda: proc.poll() is not None or http_get(ready)[0] == 200, 60)
            assert proc.poll() is None, proc.communicate()[1]
            yield base, cluster
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
            assert "Traceback" not in err, err
    lease = cluster.get("coordination.k8s.io/v1", "leases", "gpuscaler", "gpuscaler-extender")
    assert lease is not None  # it ran leader-elected on its own Lease


@pytest.fixture
def served(dcgm: tuple[DcgmExporter, str], tmp_path: Path) -> Iterator[tuple[str, FakeCluster]]:
    with _extender(dcgm[1], tmp_path) as served:
        yield served


def test_the_served_extender_filters_scores_and_binds_as_kube_scheduler_asks(
    served: tuple[str, FakeCluster],
) -> None:
    base, cluster = served
    names = ["even", "uneven", "tiny", "ghost"]
    status, body = _post(base, "filter", args(pod("a", memory="30000"), names))
    assert status == 200
    # even: 4 GPUs at 25 % + 512 reserved -> 26,112 MiB usable each, none holds 30,000
    assert body["NodeNames"] == ["uneven", "tiny"]
    assert body["FailedNodes"] == {"even": "too few GPUs with the memory per GPU the pod asks for"}
    assert body["FailedAndUnresolvableNodes"] == {"ghost": "node unknown to the GPU extender"}
    # a 2-GPU pod: "even" has 2 GPUs in each NUMA domain, "uneven" one per domain
    status, scores = _post(
        base, "prioritize", args(pod("m", memory="20000", count="2"), ["even", "uneven"])
    )
    by_host = {s["Host"]: s["Score"] for s in scores}
    assert by_host["even"] > by_host["uneven"]
    status, answer = _post(
        base, "bind", {"PodName": "c", "PodNamespace": "default", "PodUID": "uid-c", "Node": "even"}
    )
    assert (status, answer) == (200, {"Error": ""})
    bound = cluster.get("v1", "pods", "default", "c")
    assert bound is not None and bound["spec"]["nodeName"] == "even"
    assert bound["metadata"]["annotations"]["gpu-scheduler/reserved-mb"] == "1000"
    assert _post(base, "filter", b"{oops")[0] == 400
    text = http_get(base + "/metrics")[1]
    assert 'gpuscaler_extender_binds_total{outcome="bound"} 1.0' in text
    assert "gpuscaler_extender_leader 1.0" in text


def test_two_pods_racing_for_the_last_memory_are_never_both_bound(
    served: tuple[str, FakeCluster],
) -> None:
    base, cluster = served
    # "uneven" GPU 0 holds one 30,000 MiB pod (36,352 usable), GPU 1 none
    for name in ("a", "b"):
        answer = _post(base, "filter", args(pod(name, memory="30000"), ["uneven"]))[1]
        assert answer["NodeNames"] == ["uneven"]
    answers: dict[str, str] = {}

    def bind(name: str) -> None:
        body = {
            "PodName": name,
            "PodNamespace": "default",
            "PodUID": f"uid-{name}",
            "Node": "uneven",
        }
        answers[name] = _post(base, "bind", body)[1]["Error"]

    threads = [threading.Thread(target=bind, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    pods = [cluster.get("v1", "pods", "default", n) for n in ("a", "b")]
    nodes = [p["spec"].get("nodeName") for p in pods if p is not None]
    assert sorted(str(n) for n in nodes) == ["None", "uneven"]
    assert sorted(bool(e) for e in answers.values()) == [False, True]
    assert "no longer fits" in next(e for e in answers.values() if e)


@pytest.mark.parametrize(
    ("config", "argv", "message"),
    [
        (None, [], "file not found"),
        ("scheduler: {cache_ttl: soon}\n", [], "scheduler.cache_ttl"),
        ("scheduler: {}\n", [], "prometheus.url is not set"),
        ("prometheus: {url: 'http://127.0.0.1:9'}\n", ["--port", "70000"], "--port 70000: not a TCP port"),
        ("prometheus: {url: 'http://127.0.0.1:9'}\n", ["--port", "x"], "invalid int value"),
        ("prometheus: {url: 'http://127.0.0.1:9'}\n", ["--kubeconfig", "/nonexistent/kubeconfig"], "no Kubernetes API"),
    ],
)  # fmt: skip
def test_the_extender_refuses_bad_input_with_exit_2_and_no_traceback(
    tmp_path: Path, config: str | None, argv: list[str], message: str
) -> None:
    from builders import run_cli

    path = tmp_path / "gpuscaler.yaml"
    if config is not None:
        path.write_text(config)
    out = run_cli("extender", "--config", str(path), *argv, timeout=60)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr


def test_healthz_answers_at_once_while_a_large_body_is_parsed(
    dcgm: tuple[DcgmExporter, str], tmp_path: Path
) -> None:
    names = [f"ghost-{i:07d}" for i in range(600_000)]
    body = json.dumps(args(pod(), names)).encode()  # 9 MB, allowed by this config
    limits = "{cache_ttl: 1s, max_body_bytes: 16777216, max_nodes: 1000000}"
    with _extender(dcgm[1], tmp_path, limits) as (base, _):
        request = urllib.request.Request(f"{base}/filter", data=body, method="POST")
        answer: list[Any] = []
        took: list[float] = []

        def big() -> None:
            started = time.monotonic()
            with urllib.request.urlopen(request, timeout=120) as r:
                answer.append(json.loads(r.read()))
            took.append(time.monotonic() - started)

        thread = threading.Thread(target=big)
        thread.start()
        waits = []
        while thread.is_alive():
            started = time.monotonic()
            assert http_get(base + "/healthz")[0] == 200
            waits.append(time.monotonic() - started)
            time.sleep(0.05)
        thread.join()
    assert len(waits) >= 5, waits  # the large call took a while: probes ran meanwhile
    # Were the body parsed on the event loop, one probe would wait out most of the call.
    # Bounds relative to the call, so a slow or busy machine does not fail them.
    assert max(waits) < took[0] / 2, (took, waits)
    assert sorted(waits)[len(waits) // 2] < took[0] / 10, (took, waits)
    assert answer[0]["NodeNames"] == [] and len(answer[0]["FailedAndUnresolvableNodes"]) == 600_000


def test_with_tls_the_verbs_need_a_client_certificate_of_the_ca_and_metrics_stay_plain(
    dcgm: tuple[DcgmExporter, str], tmp_path: Path
) -> None:
    from kubepki import make_mutual_tls_dir

    good, other = tmp_path / "good", tmp_path / "other"
    for d in (good, other):
        d.mkdir()
        make_mutual_tls_dir(d, "gpu-scheduler", ["localhost"])
    files = f"tls_cert_file: {good}/tls.crt, tls_key_file: {good}/tls.key"
    tls = f"{{cache_ttl: 1s, {files}, client_ca_file: {good}/ca.crt}}"
    metrics = free_port()
    with _extender(dcgm[1], tmp_path, tls, "--metrics-port", str(metrics)) as (base, _):

        def call(client: Path | None) -> int:
            context = ssl.create_default_context(cafile=good / "ca.crt")
            if client is not None:
                context.load_cert_chain(client / "tls.crt", client / "tls.key")
            body = json.dumps(args(pod(), ["even"])).encode()
            request = urllib.request.Request(base.replace("http:", "https:") + "/filter", body)
            try:
                with urllib.request.urlopen(request, timeout=10, context=context) as r:
                    return int(r.status)
            except OSError:  # the handshake refused, or the connection closed after it
                return 0

        assert call(good) == 200
        assert call(None) == 0  # no client certificate
        assert call(other) == 0  # a certificate of another CA
        assert http_get(f"http://127.0.0.1:{metrics}/readyz")[0] == 200  # the kubelet's probes
        assert "gpuscaler_extender_leader 1.0" in http_get(f"http://127.0.0.1:{metrics}/metrics")[1]


@pytest.mark.parametrize(
    ("host", "busy", "scheduler", "message"),
    [
        ("127.0.0.1", True, "{}", "extender: cannot listen on 127.0.0.1:"),
        ("no-such-host.invalid", False, "{}", "extender: cannot listen on no-such-host.invalid:"),
        ("127.0.0.1", False, "{tls_cert_file: /none/c, tls_key_file: /none/k, client_ca_file: /none/ca}", "No such file or directory"),
    ],
    ids=["port in use", "host unresolvable", "TLS files missing"],
)  # fmt: skip
def test_an_extender_that_cannot_listen_exits_2_before_it_says_it_serves(
    tmp_path: Path, host: str, busy: bool, scheduler: str, message: str
) -> None:
    from builders import run_cli

    path = tmp_path / "gpuscaler.yaml"
    path.write_text(f"prometheus: {{url: 'http://127.0.0.1:9'}}\nscheduler: {scheduler}\n")
    kubeconfig = kubeconfig_for("http://127.0.0.1:9", tmp_path / "kubeconfig")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1] if busy else free_port()
        out = run_cli("extender", "--config", str(path), "--host", host, "--port", str(port),
                      "--kubeconfig", str(kubeconfig), timeout=60)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert message in out.stderr, out.stderr
    assert "serving" not in out.stderr and "Traceback" not in out.stderr


def test_a_garbage_dcgm_value_or_label_drops_its_gpu_never_the_refresh(
    dcgm: tuple[DcgmExporter, str],
) -> None:
    exporter, url = dcgm
    bad = {  # UUID: (gpu label, node, used, free)
        "GPU-huge": ("0", "huge", 0.0, 1e300),  # the controller's bound: no GPU has a TiB
        "GPU-negative": ("0", "negative", -5.0, MIB),
        "GPU-nan": ("0", "nan", math.nan, MIB),
        "GPU-tiny-9": ("²", "tiny", 0.0, MIB),  # str.isdigit() says yes, int() fails
    }
    labels = {u: (gpu, u, "0000:99:00.0", node, "", "A100") for u, (gpu, node, *_) in bad.items()}
    for uuid, (*_, used, free) in bad.items():
        exporter.gauges["used"].labels(*labels[uuid]).set(used)
        exporter.gauges["free"].labels(*labels[uuid]).set(free)
    transport = Transport(PrometheusConfig(url=url))
    scraped = 'count(DCGM_FI_DEV_FB_FREE{UUID=~"GPU-huge|GPU-negative|GPU-nan|GPU-tiny-9"})'
    try:
        wait_until("scraped", lambda: transport.query(scraped)[0]["value"][1] == "4", 30)
        nodes = _fetch(url)
    finally:
        for uuid in bad:
            for field in ("used", "free"):
                exporter.gauges[field].remove(*labels[uuid])
    assert sorted(nodes) == ["even", "tiny", "uneven"]
    assert [g.uuid for g in nodes["tiny"].gpus] == ["GPU-tiny-0"]
    assert len(nodes["even"].gpus) == 4
