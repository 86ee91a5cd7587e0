"""The extender's scheduling row and alerts: every dashboard query returns data from a real
Prometheus scraping a served extender; every alert fires on the series it watches
(`promtool test rules` on the shipped PrometheusRule)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
import yaml
from controlplane import wait_until
from extenderkit import A100, MemoryCluster, args, gpu_node, make_extender, pod
from promserver import SHIPPED_RULE, binaries, free_port, prometheus, shipped_rules
from test_observability import DASHBOARD, dashboard_queries

from gpuscaler.core.gpufit import NodeMeta

SCHEDULING = (
    "request_duration_seconds_bucket", "filter_rejections_total", "node_fragmentation",
    "pool_fragmentation", "reservations_in_flight", "stale_nodes",
)  # fmt: skip
"""The extender's metrics the scheduling row draws."""


def _extender_exprs() -> list[str]:
    return [e for e in dashboard_queries()[0] if "gpuscaler_extender_" in e]


def test_the_dashboard_has_a_scheduling_row_over_the_extender_metrics() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert any(p["type"] == "row" and "Scheduling" in p["title"] for p in board["panels"])
    used = " ".join(_extender_exprs())
    for metric in SCHEDULING:
        assert f"gpuscaler_extender_{metric}" in used, metric


@pytest.fixture
def served_extender() -> Iterator[int]:
    now = time.time()
    cluster = MemoryCluster(
        {
            "n1": gpu_node("n1", [0.0, 0.5 * A100], at=now + 3600),
            "old": gpu_node("old", [0.0], at=now - 60),  # stale
        },
        {"n1": NodeMeta("n1", pool="a100"), "old": NodeMeta("old", pool="a100")},
    )
    cluster.add(pod("a", memory="1000"))
    app, _ = make_extender(cluster)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app.build(), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    wait_until("the extender serving", lambda: server.started, 20, 0.05)

    def post(verb: str, body: object) -> None:
        request = urllib.request.Request(f"{base}/{verb}", json.dumps(body).encode(), method="POST")
        urllib.request.urlopen(request, timeout=5).read()

    post("filter", args(pod("a", memory="1000"), ["n1", "old", "ghost"]))
    post("prioritize", args(pod("a", memory="1000"), ["n1"]))
    post("bind", {"PodName": "a", "PodNamespace": "default", "PodUID": "uid-a", "Node": "n1"})
    app.observe_state()
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


def _query(url: str, expr: str) -> list[object]:
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
        return list(json.loads(r.read())["data"]["result"])


def test_every_scheduling_panel_returns_data_from_a_real_prometheus(
    served_extender: int, tmp_path: Path
) -> None:
    exprs = _extender_exprs()
    rules = shipped_rules(tmp_path)
    with prometheus(scrape_target=f"127.0.0.1:{served_extender}", rule_file=rules) as url:
        missing = exprs
        deadline = time.monotonic() + 60
        while missing and time.monotonic() < deadline:
            time.sleep(1)
            missing = [e for e in exprs if not _query(url, e)]
        assert not missing, f"no data for: {missing}"
        pending: set[str] = set()
        deadline = time.monotonic() + 30
        while "GPUStateStale" not in pending and time.monotonic() < deadline:
            time.sleep(1)
            with urllib.request.urlopen(f"{url}/api/v1/alerts", timeout=5) as r:
                pending = {a["labels"]["alertname"] for a in json.loads(r.read())["data"]["alerts"]}
        assert "GPUStateStale" in pending  # the "old" node is stale


RULE_TESTS = {
    "rule_files": ["rules.yaml"],
    "evaluation_interval": "1m",
    "tests": [
        {
            "interval": "1m",
            "input_series": [
                {"series": 'DCGM_FI_DEV_FB_USED{UUID="GPU-1",Hostname="n1"}', "values": "39000x5"},
                {"series": 'DCGM_FI_DEV_FB_FREE{UUID="GPU-1",Hostname="n1"}', "values": "1000x5"},
                {"series": 'DCGM_FI_DEV_FB_USED{UUID="GPU-2",Hostname="n1"}', "values": "20000x5"},
                {"series": 'DCGM_FI_DEV_FB_FREE{UUID="GPU-2",Hostname="n1"}', "values": "20000x5"},
                {"series": "gpuscaler_extender_oldest_unschedulable_seconds", "values": "0 300 700 760 820 880"},
                {"series": 'gpuscaler_extender_stale_nodes{state="stale"}', "values": "0 1 1 1 1 1"},
                {"series": 'gpuscaler_extender_stale_nodes{state="stale_scored"}', "values": "0x5"},
            ],
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": "GPUMemoryNearlyFull", "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "UUID": "GPU-1", "Hostname": "n1"},
                     "exp_annotations": {"summary": "GPU GPU-1 on n1 uses 97.5% of its memory (OOM risk)"}}
                ]},
                {"eval_time": "1m", "alertname": "GPUPodUnschedulableByExtender", "exp_alerts": []},
                {"eval_time": "2m", "alertname": "GPUPodUnschedulableByExtender", "exp_alerts": [
                    {"exp_labels": {"severity": "warning"},
                     "exp_annotations": {"summary": "A pod has found no node with enough usable GPU memory for 11m 40s; see its FailedScheduling events for the extender's reasons"}}
                ]},
                {"eval_time": "3m", "alertname": "GPUStateStale", "exp_alerts": [
                    {"exp_labels": {"severity": "warning"},
                     "exp_annotations": {"summary": "1 GPU node(s) have no fresh dcgm-exporter data: scored from old state, then filtered out as 'GPU state stale'"}}
                ]},
            ],
        },
        {
            "interval": "15s",
            "input_series": [
                # 2 % of filter calls take 0.1-0.5 s: p99 interpolates to 0.1 + 0.4 x (1 / 2) = 0.3 s
                {"series": 'gpuscaler_extender_request_duration_seconds_bucket{verb="filter",le="0.1"}', "values": "0+98x80"},
                {"series": 'gpuscaler_extender_request_duration_seconds_bucket{verb="filter",le="0.5"}', "values": "0+100x80"},
                {"series": 'gpuscaler_extender_request_duration_seconds_bucket{verb="filter",le="+Inf"}', "values": "0+100x80"},
            ],
            "alert_rule_test": [
                {"eval_time": "16m", "alertname": "GPUExtenderFilterSlow", "exp_alerts": [
                    {"exp_labels": {"severity": "warning"},
                     "exp_annotations": {"summary": "The GPU extender's p99 filter latency is 300ms (above 100 ms): pod scheduling slows down"}}
                ]},
            ],
        },
    ],
}  # fmt: skip


def test_each_scheduling_alert_fires_on_what_it_watches(tmp_path: Path) -> None:
    _, promtool = binaries()
    (tmp_path / "rules.yaml").write_text(
        yaml.safe_dump(yaml.safe_load(SHIPPED_RULE.read_text())["spec"])
    )
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(RULE_TESTS))
    out = subprocess.run(
        [promtool, "test", "rules", "test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
