"""The extender through its ASGI app (Starlette's TestClient): the verbs, bad input,
staleness, reservations, metrics."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import orjson
import pytest
from extenderkit import A100, MemoryCluster, args, gpu_node, make_extender, pod
from hypothesis import given, settings
from hypothesis import strategies as st
from promserver import promtool_check
from starlette.testclient import TestClient

from gpuscaler.config import SchedulerConfig
from gpuscaler.core.gpufit import NodeMeta
from gpuscaler.extender.protocol import ExtenderArgs, ProtocolError, parse_args


def _cluster() -> MemoryCluster:
    return MemoryCluster(
        {
            # the design's example: 8 GPUs at 40 % each (2 allocated), fits a 1-GPU pod
            "busy": gpu_node("busy", [0.4 * A100] * 8),
            "full": gpu_node("full", [A100] * 8),
            "uneven": gpu_node("uneven", [0.0, A100, 0.0, A100]),
        }
    )


@pytest.fixture
def client() -> TestClient:
    app, _ = make_extender(_cluster())
    return TestClient(app.build())


def test_filter_keeps_nodes_with_usable_memory_and_explains_the_others(client: TestClient) -> None:
    r = client.post("/filter", json=args(pod(memory="8192"), ["busy", "full", "uneven"]))
    assert r.status_code == 200
    body = r.json()
    assert body["NodeNames"] == ["busy", "uneven"]
    assert body["Nodes"] is None
    assert body["FailedNodes"] == {"full": "not enough free GPU memory"}
    assert body["FailedAndUnresolvableNodes"] == {}
    assert body["Error"] == ""


def test_a_filter_reply_always_lists_node_names_even_when_it_keeps_none(client: TestClient) -> None:
    body = client.post("/filter", json=args(pod(memory="300000"), ["full"])).json()
    assert body["NodeNames"] == []  # [] keeps none on purpose; null would mean the same by accident
    body = client.post("/filter", json=args(pod(memory="8192"), ["full"])).json()
    assert body["NodeNames"] == [] and "full" in body["FailedNodes"]


NOT_OURS = [
    ({"spec": {"schedulerName": "default-scheduler"}}, "pod's schedulerName 'default-scheduler' is not 'gpu-scheduler'"),
    ({"spec": {"schedulerName": "gpu-scheduler", "nodeName": "full"}}, "pod is already bound to node full"),
    ({"metadata": {"annotations": {}}}, "pod has no annotation gpu-scheduler/memory-mb"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "reason"), NOT_OURS)
def test_a_pod_not_the_gpu_schedulers_to_place_passes_no_node_and_scores_zero(
    client: TestClient, change: dict[str, dict[str, Any]], reason: str
) -> None:
    p = pod()
    for part, values in change.items():
        p[part] |= values
    body = client.post("/filter", json=args(p, ["busy", "uneven"])).json()
    assert body["NodeNames"] == []
    assert body["FailedAndUnresolvableNodes"] == {"busy": reason, "uneven": reason}
    scores = client.post("/prioritize", json=args(p, ["busy", "uneven"])).json()
    assert scores == [{"Host": "busy", "Score": 0}, {"Host": "uneven", "Score": 0}]


def test_a_scheduler_without_node_cache_gets_node_objects_back(client: TestClient) -> None:
    nodes = {"items": [{"metadata": {"name": n, "labels": {"x": n}}} for n in ("busy", "full")]}
    body = client.post("/filter", json={"Pod": pod(), "Nodes": nodes, "NodeNames": None}).json()
    assert body["NodeNames"] is None
    assert body["Nodes"]["items"] == [{"metadata": {"name": "busy", "labels": {"x": "busy"}}}]


def test_prioritize_prefers_even_memory_use_on_the_0_to_10_scale(client: TestClient) -> None:
    r = client.post("/prioritize", json=args(pod(), ["busy", "uneven", "full"]))
    scores = {h["Host"]: h["Score"] for h in r.json()}
    # busy: stddev 0 -> 0.6 x 100 = 60 -> 6; uneven: stddev 0.5 -> 30 -> 3
    assert scores == {"busy": 6, "uneven": 3, "full": 6}
    assert set(r.json()[0]) == {"Host", "Score"}


BAD_BODIES = [
    (b"", "body is not JSON"),
    (b"{not json", "body is not JSON"),
    (b"[]", "body is not a JSON object (ExtenderArgs)"),
    (b'{"NodeNames": ["a"]}', "not ExtenderArgs: Pod: Field required"),
    (b'{"Pod": {"metadata": {}}}', "neither NodeNames nor Nodes is set"),
    (b'{"Pod": {"metadata": {}}, "NodeNames": "a"}', "not ExtenderArgs: NodeNames: Input should be a valid list"),
    (b'{"Pod": {"metadata": {"annotations": {"a": 1}}}, "NodeNames": []}', "Pod.metadata.annotations.a"),
    (b'{"Pod": {"metadata": {}}, "Nodes": {"items": [{}]}}', "a node without metadata.name"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "message"), BAD_BODIES)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_a_body_that_is_not_the_protocol_gets_400_saying_what_is_wrong(
    client: TestClient, verb: str, body: bytes, message: str
) -> None:
    r = client.post(f"/{verb}", content=body)
    assert r.status_code == 400
    assert message in r.text and r.text.startswith(f"{verb}: ")


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind"])
def test_a_body_over_the_limit_is_refused_with_413_before_it_is_parsed(
    verb: str, declared: bool
) -> None:
    app, _ = make_extender(_cluster(), SchedulerConfig(max_body_bytes=4096))
    c = TestClient(app.build())
    body = orjson.dumps(args(pod(), [f"node-{i}" for i in range(400)]))
    content = body if declared else iter([body[:1000], body[1000:]])
    r = c.post(f"/{verb}", content=content)
    assert r.status_code == 413
    assert r.text == f"{verb}: body over 4096 bytes (scheduler.max_body_bytes)\n"
    assert c.post("/filter", json=args(pod(), ["busy"])).json()["NodeNames"] == ["busy"]


def test_a_request_naming_more_nodes_than_allowed_gets_400() -> None:
    app, _ = make_extender(_cluster(), SchedulerConfig(max_nodes=2))
    r = TestClient(app.build()).post("/filter", json=args(pod(), ["busy", "full", "uneven"]))
    assert r.status_code == 400
    assert r.text == "filter: 3 nodes, more than the 2 allowed (max_nodes)\n"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{}", "PodName: Field required"),
        (b'{"PodName": "p", "PodNamespace": "default", "Node": "busy"}', "PodUID: Field required"),
        (b'{"PodName": "p", "PodUID": "u", "Node": ""}', "Node: String should have at least 1 character"),
        (b"null", "body is not a JSON object (ExtenderBindingArgs)"),
    ],
)  # fmt: skip
def test_a_bind_body_that_is_not_the_protocol_gets_400(
    client: TestClient, body: bytes, message: str
) -> None:
    r = client.post("/bind", content=body)
    assert r.status_code == 400 and message in r.text


@pytest.mark.parametrize(
    ("memory", "count", "message"),
    [
        ("lots", None, "annotation gpu-scheduler/memory-mb: 'lots' is not a whole number"),
        ("8_192", None, "annotation gpu-scheduler/memory-mb: '8_192' is not a whole number"),
        ("0", None, "annotation gpu-scheduler/memory-mb: 0 must be positive"),
        ("999999999", None, "annotation gpu-scheduler/memory-mb: 999999999 MiB is more than any node's GPU memory (327680 MiB)"),
        ("100", "two", "annotation gpu-scheduler/gpu-count: 'two' is not a whole number"),
    ],
)  # fmt: skip
def test_a_malformed_pod_annotation_fails_every_node_naming_the_annotation(
    client: TestClient, memory: str, count: str | None, message: str
) -> None:
    r = client.post("/filter", json=args(pod(memory=memory, count=count), ["busy", "full"]))
    assert r.status_code == 200
    body = r.json()
    assert body["NodeNames"] == []
    failed = body["FailedAndUnresolvableNodes"]
    assert {k: v.startswith(message) for k, v in failed.items()} == {"busy": True, "full": True}
    scores = client.post("/prioritize", json=args(pod(memory=memory, count=count), ["busy"]))
    assert scores.json() == [{"Host": "busy", "Score": 0}]


def test_unknown_nodes_and_nodes_without_gpu_data_get_one_short_reason_per_kind() -> None:
    cluster = _cluster()
    cpu = [f"cpu-{i}" for i in range(3)]
    cluster.meta |= {n: NodeMeta(n) for n in cpu}
    app, _ = make_extender(cluster)
    ghosts = [f"ip-10-0-{i // 250}-{i % 250}.ec2.internal" for i in range(5000)]
    request = orjson.dumps(args(pod(), ["busy", *cpu, *ghosts]))
    r = TestClient(app.build()).post("/filter", content=request)
    body = r.json()
    assert body["NodeNames"] == ["busy"]
    unresolvable = body["FailedAndUnresolvableNodes"]
    assert unresolvable == dict.fromkeys(cpu, "no GPU metrics (dcgm-exporter)") | dict.fromkeys(
        ghosts, "node unknown to the GPU extender"
    )
    assert len(r.content) < 3 * len(request)  # proportional: names and a short reason each


def test_a_malformed_topology_annotation_fails_the_node_naming_the_annotation() -> None:
    cluster = _cluster()
    cluster.meta["busy"] = NodeMeta("busy", topology="{broken")
    app, _ = make_extender(cluster)
    body = TestClient(app.build()).post("/filter", json=args(pod(), ["busy"])).json()
    why = "annotation gpuscaler.io/gpu-topology: not JSON"
    assert body["FailedAndUnresolvableNodes"] == {"busy": why}


def test_stale_nodes_are_scored_from_last_state_then_filtered_as_stale() -> None:
    now = time.time()
    cluster = MemoryCluster(
        {
            "fresh": gpu_node("fresh", [0.0] * 2, at=now),
            "late": gpu_node("late", [0.0] * 2, at=now - 12),  # within 3 TTLs of 5 s
            "gone": gpu_node("gone", [0.0] * 2, at=now - 16),
        }
    )
    app, _ = make_extender(cluster)
    c = TestClient(app.build())
    body = c.post("/filter", json=args(pod(), ["fresh", "late", "gone"])).json()
    assert body["NodeNames"] == ["fresh", "late"]
    assert body["FailedAndUnresolvableNodes"] == {"gone": "GPU state stale"}
    answer = c.post("/prioritize", json=args(pod(), ["late", "gone"])).json()
    assert {h["Host"]: h["Score"] for h in answer} == {"late": 6, "gone": 0}
    app.observe_state()
    exposition = app.metrics.exposition().decode()
    assert 'gpuscaler_extender_stale_nodes{state="stale"} 1.0' in exposition
    assert 'gpuscaler_extender_stale_nodes{state="stale_scored"} 1.0' in exposition


def _one_slot_cluster() -> MemoryCluster:
    # one GPU with room for exactly one 20,000 MiB pod (36,864 usable)
    return MemoryCluster({"n1": gpu_node("n1", [0.0])})


def test_bind_reserves_the_memory_on_the_pod_then_binds_it() -> None:
    cluster = _one_slot_cluster()
    cluster.add(pod("a", memory="20000"))
    app, _ = make_extender(cluster)
    c = TestClient(app.build())
    r = c.post(
        "/bind", json={"PodName": "a", "PodNamespace": "default", "PodUID": "uid-a", "Node": "n1"}
    )
    assert r.json() == {"Error": ""}
    assert cluster.bound == {"uid-a": "n1"}
    annotations = cluster.objects[("default", "a")]["metadata"]["annotations"]
    assert annotations["gpu-scheduler/reserved-mb"] == "20000"
    assert annotations["gpu-scheduler/assume-time"].endswith("Z")
    assert orjson.loads(annotations["gpu-scheduler/reservation"])["gpus"] == {"n1-gpu0": 20000.0}
    # the reservation counts as used before any measurement shows the pod
    body = c.post("/filter", json=args(pod("b", memory="20000"), ["n1"])).json()
    assert body["FailedNodes"] == {"n1": "not enough free GPU memory"}
    app.observe_state()
    assert "gpuscaler_extender_reservations_in_flight 1.0" in app.metrics.exposition().decode()


def test_two_pods_racing_for_one_slot_are_never_both_bound() -> None:
    cluster = _one_slot_cluster()
    cluster.bind_delay = 0.2  # both binds arrive while the first is still in flight
    for name in ("a", "b"):
        cluster.add(pod(name, memory="20000"))
    app, _ = make_extender(cluster)
    c = TestClient(app.build())
    # both passed the filter (neither was reserved yet)
    for name in ("a", "b"):
        answer = c.post("/filter", json=args(pod(name, memory="20000"), ["n1"])).json()
        assert answer["NodeNames"] == ["n1"]
    answers: dict[str, str] = {}

    def bind(name: str) -> None:
        body = {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}", "Node": "n1"}
        answers[name] = c.post("/bind", json=body).json()["Error"]

    threads = [threading.Thread(target=bind, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(cluster.bound) == 1
    (loser,) = [n for n, e in answers.items() if e]
    assert "no longer fits: node n1 has 16864 MiB usable, pod requests 20000 MiB" in answers[loser]


def test_bind_refuses_a_replaced_pod_and_a_pod_that_is_gone() -> None:
    cluster = _one_slot_cluster()
    cluster.add(pod("a", memory="100", uid="new-uid"))
    app, _ = make_extender(cluster)
    c = TestClient(app.build())
    e = c.post(
        "/bind", json={"PodName": "a", "PodNamespace": "default", "PodUID": "old", "Node": "n1"}
    ).json()
    assert e["Error"] == "pod default/a was replaced (UID new-uid, binding asked for old)"
    e = c.post(
        "/bind", json={"PodName": "zz", "PodNamespace": "default", "PodUID": "u", "Node": "n1"}
    ).json()
    assert e["Error"] == "pod default/zz: read pod default/zz: HTTP 404 Not Found"
    assert cluster.bound == {}


def test_reservations_are_rebuilt_from_pod_annotations_and_dropped_with_the_pod() -> None:
    cluster = _one_slot_cluster()
    cluster.add(pod("a", memory="20000"))
    app, _ = make_extender(cluster)
    TestClient(app.build()).post(
        "/bind", json={"PodName": "a", "PodNamespace": "default", "PodUID": "uid-a", "Node": "n1"}
    )
    # a new replica (restart, or a new leader) knows the reservation from the pod alone
    clock = [time.time()]
    app2, state2 = make_extender(cluster, clock=lambda: clock[0])
    assert set(state2.reservations) == {"uid-a"}
    c2 = TestClient(app2.build())
    assert c2.post("/filter", json=args(pod("b", memory="20000"), ["n1"])).json()["NodeNames"] == []
    del cluster.objects[("default", "a")]  # the pod is deleted
    state2.refresh()
    assert set(state2.reservations) == {"uid-a"}  # a bind may still be in flight: kept 30 s
    clock[0] += 31
    cluster.gpus["n1"] = gpu_node("n1", [0.0], at=clock[0])
    state2.refresh()
    assert state2.reservations == {}
    assert c2.post("/filter", json=args(pod("b", memory="20000"), ["n1"])).json()["NodeNames"] == [
        "n1"
    ]


def test_a_reservation_ends_when_measured_memory_shows_the_pod() -> None:
    cluster = _one_slot_cluster()
    cluster.add(pod("a", memory="20000"))
    app, state = make_extender(cluster)
    TestClient(app.build()).post(
        "/bind", json={"PodName": "a", "PodNamespace": "default", "PodUID": "uid-a", "Node": "n1"}
    )
    time.sleep(0.01)
    cluster.gpus["n1"] = gpu_node("n1", [19000.0])  # the pod's CUDA context is up
    state.refresh()
    assert state.reservations == {}
    assert state.snapshot.views["n1"].usable_sum == pytest.approx(A100 * 0.9 - 19000.0)


def test_the_metrics_pass_promtool_and_name_verbs_reasons_and_pools() -> None:
    cluster = _cluster()
    cluster.meta["busy"] = NodeMeta("busy", pool="a100")
    app, _ = make_extender(cluster)
    c = TestClient(app.build())
    c.post("/filter", json=args(pod(), ["busy", "full", "ghost"]))
    c.post("/prioritize", json=args(pod(), ["busy"]))
    c.post("/filter", content=b"nope")
    app.observe_state()
    text = c.get("/metrics").text
    for needle in (
        'gpuscaler_extender_request_duration_seconds_bucket{le="0.001",verb="filter"}',
        'gpuscaler_extender_request_duration_seconds_count{verb="prioritize"} 1.0',
        'gpuscaler_extender_filter_rejections_total{reason="insufficient_memory"} 1.0',
        'gpuscaler_extender_filter_rejections_total{reason="unknown_node"} 1.0',
        'gpuscaler_extender_node_fragmentation{node="uneven"} 0.5',
        'gpuscaler_extender_pool_fragmentation{pool="a100"} 0.0',
        "gpuscaler_extender_bad_requests_total 1.0",
        "gpuscaler_extender_oldest_unschedulable_seconds 0.0",
    ):
        assert needle in text, needle
    out = promtool_check(text)
    assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), out.stdout + out.stderr


def test_a_pod_no_node_fits_is_tracked_as_unschedulable_until_one_does() -> None:
    clock = [100.0]
    app, _ = make_extender(_cluster())
    app.clock = lambda: clock[0]
    c = TestClient(app.build())
    c.post("/filter", json=args(pod("big", memory="100000"), ["busy", "full"]))
    clock[0] = 700.0
    app.observe_state()
    text = app.metrics.exposition().decode()
    assert "gpuscaler_extender_oldest_unschedulable_seconds 600.0" in text
    c.post("/filter", json=args(pod("big", memory="100"), ["busy"]))
    app.observe_state()
    text = app.metrics.exposition().decode()
    assert "gpuscaler_extender_oldest_unschedulable_seconds 0.0" in text


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get("/filter").status_code == 405


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
near_protocol = st.fixed_dictionaries(
    {},
    optional={
        "Pod": st.fixed_dictionaries(
            {
                "metadata": st.dictionaries(
                    st.sampled_from(["name", "uid", "annotations"]), json_values
                )
            }
        )
        | json_values,
        "NodeNames": st.lists(st.text(max_size=5), max_size=5) | json_values,
        "Nodes": st.fixed_dictionaries({"items": st.lists(json_values, max_size=3)}) | json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(json_values, near_protocol).map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=40)
)
def test_the_parser_answers_any_body_with_args_or_a_protocol_error(body: bytes) -> None:
    try:
        parsed = parse_args(body, 10)
    except ProtocolError as e:
        assert str(e)
        return
    assert isinstance(parsed, ExtenderArgs)
    assert all(isinstance(n, str) for n in parsed.node_names())


def test_a_deleted_node_is_forgotten_once_long_silent() -> None:
    clock = [time.time()]
    cluster = MemoryCluster(
        {"n1": gpu_node("n1", [0.0], at=clock[0]), "n2": gpu_node("n2", [0.0], at=clock[0])}
    )
    _, state = make_extender(cluster, clock=lambda: clock[0])
    del cluster.gpus["n2"], cluster.meta["n2"]  # node deleted, its exporter gone
    clock[0] += 60
    state.refresh()
    assert "n2" in state.snapshot.gpus  # still its last state (stale)
    clock[0] += 600
    state.refresh()
    assert "n2" not in state.snapshot.gpus and "n1" in state.snapshot.gpus
