"""The watch cache on the real kube-apiserver: it answers what listing answers, ticks read
it without a request, and watches the server ends, resets or forgets (410) recover (the
wire cut by a TCP proxy in front of the real server)."""

from __future__ import annotations

import copy
import json
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from builders import NOW
from controlplane import ControlPlane, Kube, Recorder, wait_until
from kubeobjects import A100, gpu_pod, hpa, node, scaled_object
from kubernetes import client
from tcpproxy import TcpProxy

from gpuscaler.adapters.kube.api import BoundedApiClient, KubeError
from gpuscaler.adapters.kube.cache import (
    CachedClusterReader,
    CachedPreemptionReader,
    ClusterCache,
)
from gpuscaler.adapters.kube.informer import Informer, Resource
from gpuscaler.adapters.kube.preemption_reader import PreemptionReader
from gpuscaler.adapters.kube.preemption_records import STATE_CONFIGMAP
from gpuscaler.adapters.kube.reader import ClusterReader
from gpuscaler.config import Config, parse_config

SEEN = 30.0
"""Seconds a change may take to show in the cache: milliseconds idle, generous under CI."""


def _config(ns: str, **kube: Any) -> Config:
    extra = "".join(f"\n  {k}: {v}" for k, v in kube.items())
    return parse_config(
        f"""
node_pools:
  - name: a100
    selector: {{label: nvidia.com/gpu.product, value: {A100}}}
    gpu_memory_gib: 80
workloads:
  - {{namespace: {ns}, kind: ScaledObject, name: chat}}
  - {{namespace: {ns}, kind: HorizontalPodAutoscaler, name: embed}}
preemption: {{enabled: true}}
kubernetes:
  read_timeout: 30s{extra}
"""
    )


def _configmap(name: str, ns: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns},
        "data": data,
    }


class Cached:
    """One test's cache on the real server (optionally behind a proxy), and its readers."""

    def __init__(self, kube: Kube, api: client.ApiClient | None = None, **limits: Any):
        self.kube = kube
        self.ns = kube.namespace()
        self.config = _config(self.ns, **limits)
        self.api = api or kube.plane.api()
        self.cache = ClusterCache(self.api, self.ns, self.config.kubernetes).start()
        self.reader = CachedClusterReader(self.api, self.config, self.cache)
        self.prefix = f"wc-{uuid.uuid4().hex[:6]}"

    def node_name(self, i: int) -> str:
        return f"{self.prefix}-{i}"

    def nodes(self) -> dict[str, Any]:
        return {n.name: n for n in self.reader.objects().nodes if n.name.startswith(self.prefix)}

    def pods(self) -> dict[str, Any]:
        return {p.name: p for p in self.reader.objects().pods if p.namespace == self.ns}


@pytest.fixture
def cached(kube: Kube) -> Iterator[Cached]:
    c = Cached(kube)
    yield c
    c.cache.stop()


def _seen(what: str, check: Callable[[], bool]) -> None:
    wait_until(what, check, SEEN, 0.05)


def _equal_when_settled(a: Callable[[], Any], b: Callable[[], Any]) -> None:
    """The two readings agree (the controller-manager keeps writing HPA statuses, so a
    single pair of reads may straddle one of its writes)."""
    last: list[Any] = []

    def same() -> bool:
        last[:] = [a(), b()]
        return bool(last[0] == last[1])

    try:
        _seen("cache and list agree", same)
    except TimeoutError:
        assert last[0] == last[1]  # shows the difference
        raise


def test_the_cache_answers_what_listing_answers(cached: Cached) -> None:
    kube, ns = cached.kube, cached.ns
    kube.seed([node(cached.node_name(i)) for i in range(2)])
    kube.seed(
        [
            gpu_pod("chat-0", cached.node_name(0), gpus=2, namespace=ns),
            gpu_pod("train-0", None, namespace=ns),
            scaled_object("chat", 2, namespace=ns),
            hpa("embed", 1, namespace=ns),
        ]
    )
    cpu_only = gpu_pod("web-0", cached.node_name(1), namespace=ns)
    cpu_only["spec"]["containers"][0]["resources"] = {}
    kube.seed([cpu_only])
    kube.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "chat", "namespace": ns},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "chat"}}},
        }
    )
    kube.create(_configmap(STATE_CONFIGMAP, ns, {}))
    listing = ClusterReader(cached.api, cached.config)
    _equal_when_settled(cached.reader.objects, listing.objects)
    objects = cached.reader.objects()
    assert {p.name for p in objects.pods if p.namespace == ns} == {"chat-0", "train-0"}
    assert objects.scale_objects[f"{ns}/ScaledObject/chat"].floor == 2
    assert cached.reader.state() == listing.state()

    plain = PreemptionReader(cached.api, cached.config, listing, ns)
    from_cache = CachedPreemptionReader(
        cached.api, cached.config, cached.reader, ns, cache=cached.cache
    )
    _equal_when_settled(lambda: from_cache.observe(NOW), lambda: plain.observe(NOW))
    assert from_cache.listed("PodDisruptionBudget")  # the PDB made above, among others


def test_changes_between_ticks_are_seen_and_a_tick_sends_no_request(kube: Kube) -> None:
    record = Recorder(kube.plane.api())
    cached = Cached(kube, record.api)
    try:
        ns, name = cached.ns, cached.node_name(0)
        cached.reader.objects()  # waits for the first lists
        before = len(record.calls)
        assert cached.nodes() == {} and cached.pods() == {}
        assert len(record.calls) == before, "a tick read the cache, not the API"

        kube.seed([node(name, config="ts-2")])
        _seen("node created", lambda: cached.nodes().get(name) is not None)
        kube.request(
            "PATCH",
            f"/api/v1/nodes/{name}",
            {"metadata": {"labels": {"nvidia.com/device-plugin.config": "ts-4"}}},
            "application/merge-patch+json",
        )
        _seen("node relabelled", lambda: cached.nodes()[name].fragments == 4)

        kube.seed([gpu_pod("chat-0", name, namespace=ns), hpa("embed", 1, namespace=ns)])
        _seen("pod created", lambda: "chat-0" in cached.pods())
        kube.request(
            "PATCH",
            f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/embed",
            {"spec": {"minReplicas": 3}},
            "application/merge-patch+json",
        )
        key = f"{ns}/HorizontalPodAutoscaler/embed"
        _seen("HPA floor", lambda: cached.reader.objects().scale_objects[key].floor == 3)

        kube.core.delete_namespaced_pod("chat-0", ns, grace_period_seconds=0)
        _seen("pod deleted", lambda: "chat-0" not in cached.pods())
        kube.core.delete_node(name)
        _seen("node deleted", lambda: name not in cached.nodes())
        assert all(i.lists == 1 for i in cached.cache.informers.values()), "never relisted"
    finally:
        cached.cache.stop()


def test_a_watch_the_server_ends_is_opened_again_from_its_resource_version(kube: Kube) -> None:
    cached = Cached(kube, watch_timeout="1s")  # timeoutSeconds=1: the server ends each watch
    try:
        nodes = cached.cache.informers["Node"]
        _seen("three watches ended by the server", lambda: nodes.watches >= 3)
        name = cached.node_name(0)
        kube.seed([node(name)])
        _seen("node seen after re-watches", lambda: name in cached.nodes())
        assert nodes.lists == 1, "a closed watch resumes from its resourceVersion"
    finally:
        cached.cache.stop()


def _compact_etcd(plane: ControlPlane) -> None:
    """Compact etcd's history up to now (as the API server does every 5 minutes), through
    etcd's gRPC gateway: older resourceVersions are gone for good."""
    argv = [str(a) for a in plane.processes["etcd"].popen.args]  # type: ignore[union-attr]
    url = next(a.split("=", 1)[1] for a in argv if a.startswith("--listen-client-urls="))

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return dict(json.load(answer))

    revision = int(post("/v3/kv/range", {"key": "Lw=="})["header"]["revision"])
    post("/v3/kv/compaction", {"revision": revision, "physical": True})


@pytest.fixture(scope="module")
def uncached_plane(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A second API server without its watch cache, so that etcd itself serves watches
    (only etcd forgets compacted revisions on demand)."""
    plane = ControlPlane(
        tmp_path_factory.mktemp("uncached"), apiserver_args=("--watch-cache=false",)
    )
    try:
        yield plane.start()
    finally:
        plane.stop()


def test_a_resource_version_the_server_no_longer_has_makes_the_informer_relist(
    uncached_plane: ControlPlane,
) -> None:
    api = uncached_plane.api()
    name = f"wc-{uuid.uuid4().hex[:6]}"
    uncached_plane.kubectl("create", "configmap", name, "--from-literal=a=b")
    _compact_etcd(uncached_plane)
    informer = Informer(api, Resource("ConfigMap", "/api/v1/namespaces/default/configmaps"))
    informer.resource_version = "2"  # compacted away: etcd, through the server, says 410
    informer.start()
    try:
        _seen("relisted", lambda: informer.synced.is_set())
        assert (informer.gone, informer.lists) == (1, 1), informer.last_error
        assert name in {o["metadata"]["name"] for o in informer.items()}
        uncached_plane.kubectl("delete", "configmap", name)
        _seen("deleted", lambda: name not in {o["metadata"]["name"] for o in informer.items()})
    finally:
        informer.stop()


def _through(proxy: TcpProxy, api: client.ApiClient) -> BoundedApiClient:
    configuration = copy.deepcopy(api.configuration)
    configuration.host = proxy.url
    return BoundedApiClient(configuration, connect_timeout=2, read_timeout=10)


def test_a_dropped_watch_recovers_and_a_cache_cut_off_too_long_flags_every_target(
    kube: Kube,
) -> None:
    plane = kube.plane
    proxy = TcpProxy(("127.0.0.1", plane.port))
    cached = Cached(kube, _through(proxy, kube.api), watch_stale_after="2s")
    try:
        cached.reader.objects()
        nodes = cached.cache.informers["Node"]
        opened = nodes.watches
        proxy.drop()  # every watch reset mid-stream
        first, second = cached.node_name(0), cached.node_name(1)
        kube.seed([node(first)])
        _seen("node seen after the reset", lambda: first in cached.nodes())
        assert nodes.watches > opened

        proxy.down()  # the API server unreachable
        kube.seed([node(second)])

        def flagged() -> bool:
            try:
                cached.reader.objects()
            except KubeError as e:
                assert "watch cache" in str(e)
                return True
            return False

        _seen("cache refused once stale", flagged)
        state = cached.reader.state()
        assert "watch cache" in state.problems["pool:a100"]
        assert not cached.reader.healthy

        proxy.up()
        _seen("back, with what changed meanwhile", lambda: second in _nodes_or_empty(cached))
        assert cached.reader.state().problems.get("pool:a100") is None
    finally:
        cached.cache.stop()
        proxy.close()


def _nodes_or_empty(cached: Cached) -> dict[str, Any]:
    try:
        return cached.nodes()
    except KubeError:
        return {}


def test_an_unreachable_api_server_is_a_kube_error_naming_the_cache_not_a_hang(
    kube: Kube,
) -> None:
    proxy = TcpProxy(("127.0.0.1", kube.plane.port))
    proxy.down()
    cached = Cached(kube, _through(proxy, kube.api), read_timeout="2s")
    try:
        started = time.monotonic()
        with pytest.raises(KubeError, match="watch cache: Node: not listed yet"):
            cached.reader.objects()
        assert time.monotonic() - started < 20  # bounded by read_timeout, not forever
    finally:
        cached.cache.stop()
        proxy.close()


def test_stop_ends_every_watch_thread(cached: Cached) -> None:
    cached.reader.objects()
    cached.cache.stop()
    alive = [k for k, i in cached.cache.informers.items() if i._thread and i._thread.is_alive()]
    assert alive == []


def test_the_records_configmap_is_watched_by_name(cached: Cached) -> None:
    kube, ns = cached.kube, cached.ns
    reader = CachedPreemptionReader(
        cached.api, cached.config, cached.reader, ns, cache=cached.cache
    )
    assert reader.states() == ()
    kube.create(_configmap("other", ns, {"x": "1"}))
    record = (
        '{"victim": "ml/p", "beneficiary": "ml/q", "node": "n", "gpus": 1, "priority": 0,'
        ' "tier": "soft", "since": 1.0, "requested_at": 1.0}'
    )
    kube.create(_configmap(STATE_CONFIGMAP, ns, {"ml.p": record}))
    _seen("record seen", lambda: len(reader.states()) == 1)
    assert [o["metadata"]["name"] for o in cached.cache.items("records")] == [STATE_CONFIGMAP]


@pytest.mark.parametrize("setting", [True, False])
def test_cluster_controller_reads_through_the_cache_only_when_configured(
    kube: Kube, setting: bool
) -> None:
    from gpuscaler.controller.assembly import cluster_controller

    ns = kube.namespace()
    config = _config(ns, watch_cache=str(setting).lower())
    config = config.model_copy(
        update={"prometheus": config.prometheus.model_copy(update={"url": "http://127.0.0.1:9"})}
    )
    parts = cluster_controller(config, kube.plane.api(), dry_run=True, leader_election=False)
    try:
        assert (parts.cache is not None) is setting
        assert isinstance(parts.reader, CachedClusterReader) is setting
        assert isinstance(parts.reader.objects().nodes, tuple)
    finally:
        parts.stop()
