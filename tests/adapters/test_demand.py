"""A workload's demand from its serving stack's metrics: presets, a malformed demand
refused, the floor ceil(forecast upper / per_replica), and vLLM's series in a real
Prometheus giving the demand and, through a controller tick, the floor; the GPU load
under either pod label convention."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import numpy as np
import pytest
from builders import assert_outcome, floor_of, signal, workload_obs
from promserver import planted_window, prometheus, write_openmetrics

from gpuscaler.adapters.kube.cluster import discovered_workloads
from gpuscaler.adapters.kube.objects import ClusterObjects, CurrentState, ScaleObject
from gpuscaler.adapters.prometheus.promql import build_workload_query
from gpuscaler.config import ConfigError, ReplicasConfig, parse_config
from gpuscaler.controller import Controller
from gpuscaler.controller.assembly import NoActuator
from gpuscaler.core.model import TargetHistory
from gpuscaler.demand import DEMAND_ANNOTATION, PRESETS
from gpuscaler.sources import PrometheusSource

# The metric names as the servers define them (paths in gpuscaler/demand.py).
UPSTREAM = {
    "vllm": {"vllm:num_requests_running", "vllm:num_requests_waiting"},
    "tgi": {"tgi_queue_size", "tgi_batch_current_size"},
    "triton_queue": {"nv_inference_pending_request_count"},
    "triton_rate": {"nv_inference_count"},
}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_reads_the_servers_own_metrics_over_the_workloads_pods(preset: str) -> None:
    query = build_workload_query(PRESETS[preset][0], "ml", "chat", "1000ms")
    assert set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", query)) == UPSTREAM[preset]
    # Both label conventions, each metric restricted to the workload's pods.
    for labels in (
        'namespace="ml",pod=~"chat-.+"',
        'exported_namespace="ml",exported_pod=~"chat-.+"',
    ):
        assert query.count(labels) == len(UPSTREAM[preset])


WORKLOAD = "workloads:\n  - {namespace: ml, kind: ScaledObject, name: chat, demand: %s}\n"


@pytest.mark.parametrize(
    ("demand", "problem"),
    [
        ("{preset: vllm}", "per_replica"),
        ("{preset: vllm, per_replica: 0}", "greater than 0"),
        ("{preset: sglang, per_replica: 4}", "preset"),
        ("{preset: query, per_replica: 4}", "preset query needs `query`"),
        ("{preset: vllm, per_replica: 4, query: up}", "only for preset query"),
        ('{preset: query, per_replica: 4, query: "sum(x{a=1})"}', "double other braces"),
        ("{preset: vllm, per_replica: 4, target: 3}", "target"),
    ],
    ids=[
        "no per_replica",
        "per_replica zero",
        "an unknown preset",
        "query preset without a query",
        "a query beside a preset",
        "single braces in a query",
        "an unknown field",
    ],
)
def test_a_malformed_demand_is_refused_naming_the_workload_field(demand: str, problem: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(WORKLOAD % demand)
    text = "\n".join(e.value.problems)
    assert "workloads[0].demand" in text and problem in text, text


def test_a_query_of_the_configs_own_is_taken_as_written() -> None:
    config = parse_config(
        WORKLOAD
        % '{preset: query, per_replica: 50, unit: "req/s", query: "sum(rate(http_requests_total{{job=\\"chat\\"}}[1m]))"}'
    )
    (w,) = config.workloads
    assert w.demand is not None and w.demand.unit_name == "req/s"
    query = build_workload_query(w.demand.template, w.namespace, w.name, "1000ms")
    assert query == 'sum(rate(http_requests_total{job="chat"}[1m]))'


@pytest.mark.parametrize(
    ("upper", "per_replica", "floor", "expect"),
    [
        (100.0, 16.0, 2, ("set", 7)),  # ceil(100 / 16)
        (31.0, 16.0, 2, ("hold", "floor stays 2")),  # 31/32 inside the 10 % tolerance
        (8.0, 16.0, 3, ("set", 1)),  # down, within max_step_down 2
    ],
    ids=["up", "within tolerance", "down"],
)
def test_a_demand_floor_is_the_forecast_upper_bound_over_what_one_replica_serves(
    upper: float, per_replica: float, floor: int, expect: tuple[str, object]
) -> None:
    obs = workload_obs(signal(upper * 0.8, upper), floor=floor, share=0.25)
    obs = type(obs)(**{**obs.__dict__, "serving": (per_replica, "requests (running + waiting)")})
    # Any replica count (whole_gpus off): the formula alone; whole GPUs: test_replicas.py.
    cfg = ReplicasConfig(
        skill_check=False, cooldown="0s", scale_down_stabilization="0s", whole_gpus=False
    )
    out = floor_of(obs, cfg, 120.0, TargetHistory(), obs.load.last_sample_time or 0)
    assert_outcome(out, expect, f"requests (running + waiting) / {per_replica:g} per replica")


POINTS = 1500  # 12.5 min at 500 ms: more than forecast.min_history


def _vllm_series(
    running: float, waiting: float, labels: dict[str, str]
) -> dict[str, tuple[dict[str, str], float]]:
    base = {"model_name": "meta-llama/Llama-3.1-8B-Instruct", "engine": "0", **labels}
    return {
        "vllm:num_requests_running": (base, running),
        "vllm:num_requests_waiting": (base, waiting),
    }


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    """vLLM's scheduler gauges and dcgm-exporter's GPU utilization for four pods: two of
    `chat` scraped with honorLabels: false (stock scraping: the pod labels become
    exported_*), one of `embed` with honorLabels: true, and `chatty-0`, whose name only
    starts like chat's."""
    start, end = planted_window(POINTS, 20)
    scraper = {"namespace": "monitoring", "pod": "vllm-exporter-sidecar"}
    chat = {**scraper, "exported_namespace": "ml"}
    pods = [  # (labels, running, waiting, GPU utilization)
        ({**chat, "exported_pod": "chat-7c-a"}, 10, 6, 60.0),
        ({**chat, "exported_pod": "chat-7c-b"}, 12, 4, 40.0),
        ({**chat, "exported_pod": "chatty-0"}, 99, 99, 99.0),
        ({"namespace": "ml", "pod": "embed-5f-a"}, 3, 0, 30.0),
    ]
    metrics: dict[str, list[tuple[dict[str, str], object]]] = {}
    for i, (labels, running, waiting, util) in enumerate(pods):
        for name, (series, value) in _vllm_series(running, waiting, labels).items():
            metrics.setdefault(name, []).append((series, lambda i, v=value: v))
        gpu = {**labels, "UUID": f"GPU-{i}"}
        metrics.setdefault("DCGM_FI_DEV_GPU_UTIL", []).append((gpu, lambda i, v=util: v))
    # TGI's router gauges and Triton's per-model series (labels model, version), one pod each.
    tgi = {"namespace": "ml", "pod": "tgi-8d-a"}
    metrics["tgi_queue_size"] = [(tgi, lambda i: 7.0)]
    metrics["tgi_batch_current_size"] = [(tgi, lambda i: 5.0)]
    triton = {"namespace": "ml", "pod": "triton-9f-a", "model": "resnet", "version": "1"}
    metrics["nv_inference_pending_request_count"] = [(triton, lambda i: 9.0)]
    metrics["nv_inference_count"] = [(triton, lambda i: 40.0 * i * 0.5)]  # a counter: 40/s
    data = tmp_path_factory.mktemp("vllm") / "data.om"
    write_openmetrics(data, metrics, start, POINTS)  # type: ignore[arg-type]
    with prometheus(data) as url:
        yield url, end


def _config(url: str, name: str, preset: str = "vllm") -> str:
    return (
        f'prometheus: {{url: "{url}", retries: 0}}\n'
        "workloads:\n"
        f"  - namespace: ml\n    kind: ScaledObject\n    name: {name}\n"
        f"    demand: {{preset: {preset}, per_replica: 10}}\n"
        "    overrides: {replicas: {skill_check: false, cooldown: 0s}}\n"
    )


@pytest.mark.parametrize(
    ("workload", "demand"),
    [("chat", 32.0), ("embed", 3.0)],
    ids=["exported_* labels", "plain labels"],
)
def test_a_workloads_demand_is_read_from_vllm_metrics_in_a_real_prometheus(
    vllm: tuple[str, float], workload: str, demand: float
) -> None:
    url, end = vllm
    raw = PrometheusSource(parse_config(_config(url, workload)), CurrentState()).observe(end + 1)
    (w,) = raw.workloads
    assert w.problem is None, w.problem
    assert w.serving == (10.0, "requests (running + waiting)")
    assert w.load is not None
    values = w.load.values[np.isfinite(w.load.values)]
    assert values.size > 50 and np.allclose(values, demand)  # chatty-0 never counts


@pytest.mark.parametrize(
    ("workload", "load"),
    [("chat", 100.0), ("embed", 30.0), ("absent", None)],
    ids=["exported_* labels", "plain labels", "no such pods"],
)
def test_a_workloads_gpu_load_is_read_under_either_label_convention(
    vllm: tuple[str, float], workload: str, load: float | None
) -> None:
    url, end = vllm
    config = parse_config(
        f'prometheus: {{url: "{url}", retries: 0}}\n'
        f"workloads:\n  - {{namespace: ml, kind: ScaledObject, name: {workload}}}\n"
    )
    (w,) = PrometheusSource(config, CurrentState()).observe(end + 1).workloads
    if load is None:
        assert w.problem is not None and "empty result" in w.problem
        return
    assert w.problem is None, w.problem
    assert w.load is not None
    values = w.load.values[np.isfinite(w.load.values)]
    assert values.size > 50 and np.allclose(values, load)  # chatty-0 never counts for chat


@pytest.mark.parametrize(
    ("workload", "preset", "demand"),
    [("tgi", "tgi", 12.0), ("triton", "triton_queue", 9.0), ("triton", "triton_rate", 40.0)],
    ids=["TGI queue + batch", "Triton pending requests", "Triton inferences per second"],
)
def test_tgi_and_triton_demand_is_read_from_their_metrics_in_a_real_prometheus(
    vllm: tuple[str, float], workload: str, preset: str, demand: float
) -> None:
    url, end = vllm
    config = parse_config(_config(url, workload, preset))
    raw = PrometheusSource(config, CurrentState()).observe(end + 1)
    (w,) = raw.workloads
    assert w.problem is None, w.problem
    assert w.load is not None
    values = w.load.values[np.isfinite(w.load.values)]
    # A rate over [1m] needs a minute of samples; Prometheus extrapolates at the edges
    # (10 s buckets: 70 s at the start, the newest bucket at the end).
    steady = values[7:-1] if preset == "triton_rate" else values
    assert values.size > 50 and np.allclose(steady, demand, rtol=0.02)


def test_a_controller_tick_sets_the_floor_from_vllm_demand(vllm: tuple[str, float]) -> None:
    url, end = vllm
    config = parse_config(_config(url, "chat"))
    key = config.workloads[0].key
    state = CurrentState(floors={key: 1}, replicas={key: 1}, max_replicas={key: 20})
    controller = Controller(config, PrometheusSource(config, state), NoActuator(), dry_run=True)
    result = controller.tick(end + 1)
    (decision,) = [d for d in result.plan.decisions if d.target == key]
    assert decision.to_value == 4, decision.reason  # ceil(32 requests / 10 per replica)
    assert "requests (running + waiting) / 10 per replica" in decision.reason


def _opted_in(annotations: dict[str, str]) -> ClusterObjects:
    key = "ml/ScaledObject/chat"
    so = ScaleObject(key, 1, 10, 1, opted_in=True, owned_by_keda=False, annotations=annotations)
    return ClusterObjects(scale_objects={key: so})


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        ("vllm:16", ("vllm", 16.0)),
        ("triton_queue: 4.5", ("triton_queue", 4.5)),
        (None, None),
    ],
    ids=["vllm", "triton queue, spaces", "no annotation: GPU utilization"],
)
def test_a_discovered_workload_takes_its_demand_from_its_annotation(
    annotation: str | None, expected: tuple[str, float] | None
) -> None:
    annotations = {} if annotation is None else {DEMAND_ANNOTATION: annotation}
    (w,) = discovered_workloads(_opted_in(annotations), parse_config(""))
    got = None if w.demand is None else (w.demand.preset, w.demand.per_replica)
    assert got == expected


@pytest.mark.parametrize(
    ("annotation", "problem"),
    [
        ("vllm", "is not <preset>:<per_replica>"),
        ("vllm:0", "greater than 0"),
        ("vllm:many", "per_replica"),
        ("sglang:4", "preset"),
        ("query:4", "preset query needs `query`"),
    ],
    ids=["no per_replica", "zero", "not a number", "unknown preset", "query without a query"],
)
def test_a_malformed_demand_annotation_leaves_the_workload_alone_with_one_warning(
    annotation: str, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    objects = _opted_in({DEMAND_ANNOTATION: annotation})
    with caplog.at_level(logging.WARNING, logger="gpuscaler.cluster"):
        assert discovered_workloads(objects, parse_config("")) == ()
        assert discovered_workloads(objects, parse_config("")) == ()  # the next tick: quiet
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "annotation_refused"]
    assert "ml/ScaledObject/chat" in record.getMessage() and problem in record.getMessage()
