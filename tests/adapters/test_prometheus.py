"""The Prometheus source against a real Prometheus (backfilled with promtool) and against
misbehaving HTTP servers on 127.0.0.1."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from builders import run_cli
from kubefake import reply, serving
from promserver import STEP, free_port, planted_window, prometheus, write_openmetrics

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.adapters.prometheus.promql import (
    build_query,
    build_workload_query,
    escape_label_value,
    format_step,
)
from gpuscaler.adapters.prometheus.transport import SourceError, Transport
from gpuscaler.config import Config, parse_config
from gpuscaler.sources import PrometheusSource

POINTS = 7200  # one hour at 500 ms
START, END = planted_window(POINTS, 30)  # set again by the fixture that plants them


def _noise(i: int) -> float:
    return 1.5 * math.sin(i * 0.7) + 0.8 * math.sin(i * 0.13)


PLANTED = {
    "rising": lambda i: 40 + 57 * i / POINTS + _noise(i),  # ends near 97 %
    "idle": lambda i: 15 + _noise(i),
    "flat": lambda i: 62 + _noise(i),
    "nan": lambda i: float("nan") if i > POINTS - 20 else 60 + _noise(i),
    "gone": lambda i: None if i > POINTS - 1200 else 60 + _noise(i),  # silent for 10 min
    "gappy": lambda i: None if (i // 400) % 3 == 1 else 62 + _noise(i),  # gaps, recent data
    "full": lambda i: 15 + _noise(i),  # idle, but its tenants fill the memory
}
FB_USED_MIB = {"idle": 20_000.0, "full": 70_000.0}  # of 81,920 MiB
POOL_LABEL = {"idle": "hostname"}  # the newer dcgm-exporter's lowercase label


def _gpu(name: str) -> dict[str, str]:
    return {POOL_LABEL.get(name, "Hostname"): f"node-{name}", "gpu": "0", "UUID": f"GPU-{name}"}


def _metrics() -> dict[str, list[tuple[dict[str, str], Any]]]:
    util, stall, used, free = [], [], [], []
    for name, mib in FB_USED_MIB.items():
        used.append((_gpu(name), lambda i, mib=mib: mib))
        free.append((_gpu(name), lambda i, mib=mib: 81_920.0 - mib))
    for name, fn in PLANTED.items():
        labels = _gpu(name)
        util.append((labels, fn))
        level = 20.0 if name == "rising" else 4.0
        stall.append((labels, (lambda i, fn=fn, level=level: None if fn(i) is None else level)))
    work = {"Hostname": "node-work", "gpu": "1", "UUID": "GPU-work", "namespace": "ml"}
    util.append(({**work, "pod": "chat-7d9f-a"}, lambda i: 100 + 150 * i / POINTS + _noise(i)))
    util.append(
        ({**work, "pod": "chat-7d9f-b", "gpu": "2"}, lambda i: 100 + 150 * i / POINTS - _noise(i))
    )
    util.append(({**work, "pod": "chatty-1", "gpu": "3"}, lambda i: 500.0))  # must not match "chat"
    return {
        "DCGM_FI_DEV_GPU_UTIL": util,
        "nvidia_gpu_stall_percentage": stall,
        "DCGM_FI_DEV_FB_USED": used,
        "DCGM_FI_DEV_FB_FREE": free,
    }


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("prom") / "data.om"
    global START, END
    START, END = planted_window(POINTS, 30)
    write_openmetrics(data, _metrics(), START, POINTS)
    with prometheus(data) as url:
        yield url


def _config(url: str, extra: str = "") -> str:
    pools = "\n".join(
        f"  - {{name: {name}, selector: {{label: pool, value: {name}}}, gpu_memory_gib: 80, "
        f"initial_fragments: {2 if name in ('idle', 'full') else 4}, "
        f"metrics_matchers: {{{POOL_LABEL.get(name, 'Hostname')}: node-{name}}}}}"
        for name in [*PLANTED, "ghost"]
    )
    return f"""
prometheus: {{url: "{url}", timeout: 5s, retries: 1, backoff: 100ms,
  background_backfill: false}}
fragments: {{sustain: 0s}}
replicas: {{skill_check: false}}  # one tick has no skill verdict; these test the adapters
node_pools:
{pools}
workloads:
  - {{namespace: ml, kind: ScaledObject, name: chat}}
{extra}"""


def _source(url: str, extra: str = "") -> tuple[Config, PrometheusSource]:
    config = parse_config(_config(url, extra))
    state = CurrentState(
        fragments={p.name: p.initial_fragments or 1 for p in config.node_pools},
        floors={"ml/ScaledObject/chat": 2},
    )
    return config, PrometheusSource(config, state)


def test_once_dry_run_plans_the_planted_decisions_and_skips_the_bad_series(
    prom_url: str, tmp_path: Path
) -> None:
    cfg = tmp_path / "gpuscaler.yaml"
    cfg.write_text(_config(prom_url))
    state = tmp_path / "state.yaml"
    state.write_text(
        "pools: {rising: {fragments: 4, time_slice_level: medium}}\n"
        "workloads: {ml/ScaledObject/chat: {floor: 2, replicas: 2}}\n"
    )
    out = run_cli("once", "--config", str(cfg), "--dry-run", "--state", str(state), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "source: Prometheus" in out.stderr and "state file" in out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    decided = {(d["kind"], d["target"]): d for d in lines if not d.get("skipped")}
    skipped = {(d["kind"], d["target"]): d for d in lines if d.get("skipped")}
    assert decided[("fragments", "rising")]["to"] == 2
    assert decided[("fragments", "idle")]["to"] == 4
    assert decided[("time_slice", "rising")]["to"] == "long"  # stall 20 % > 15 %
    floor = decided[("replica_floor", "ml/ScaledObject/chat")]
    assert floor["from"] == 2 and floor["to"] >= 4  # ~250 % GPU rising, target 70 %
    assert not skipped[("fragments", "flat")]["invalid_input"]
    assert not skipped[("fragments", "gappy")]["invalid_input"]  # gaps are not a failure
    full = skipped[("fragments", "full")]  # measured memory in use blocks the doubling
    assert not full["invalid_input"] and "tenants hold 34.2 GiB each" in full["reason"]
    for pool, reason in (("nan", "NaN or Inf"), ("gone", "stale"), ("ghost", "empty result")):
        for kind in ("fragments", "time_slice"):
            skip = skipped[(kind, pool)]
            assert skip["invalid_input"], skip
        assert reason in skipped[("fragments", pool)]["reason"]
    assert {k for k in decided} == {
        ("fragments", "rising"),
        ("fragments", "idle"),
        ("time_slice", "rising"),
        ("replica_floor", "ml/ScaledObject/chat"),
    }


class Recording(Transport):
    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.calls: list[tuple[str, float, float]] = []

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Any]:
        self.calls.append((query, start, end))
        return super().query_range(query, start, end, step)


def test_the_first_cycle_backfills_in_chunks_and_later_cycles_fetch_only_what_is_new(
    prom_url: str,
) -> None:
    config = parse_config(_config(prom_url, "metrics: {window: 2h}\n"))
    transport = Recording(config.prometheus)
    source = PrometheusSource(config, CurrentState(), transport)
    now = END + 1
    obs = source.observe(now)
    first = [c for c in transport.calls if "node-flat" in c[0] and "GPU_UTIL" in c[0]]
    assert len(first) == 2  # 2 h at 500 ms = 14,400 points: two chunks under 11,000
    assert all((end - start) / STEP + 1 <= 11_000 for _, start, end in first)
    flat = next(p for p in obs.pools if p.name == "flat")
    assert flat.utilization is not None and flat.problem is None
    # The planted hour in 10 s buckets; the hour before it: gaps, not zeros.
    assert flat.utilization.step == 10.0
    assert np.isfinite(flat.utilization.values).sum() >= POINTS * STEP / 10 - 1
    assert np.isnan(flat.utilization.values[:350]).all()
    transport.calls.clear()
    source.observe(now + 30)
    later = [c for c in transport.calls if "node-flat" in c[0] and "GPU_UTIL" in c[0]]
    assert len(later) == 1
    _, start, end = later[0]
    assert end - start <= 30 + config.prometheus.overlap + 1  # only what is new


def test_gaps_stay_gaps(prom_url: str) -> None:
    _, source = _source(prom_url)
    gappy = next(p for p in source.observe(END + 1).pools if p.name == "gappy")
    assert gappy.utilization is not None
    values = gappy.utilization.values
    assert 0.25 < np.isnan(values).mean() < 0.45  # a third planted missing, none filled in


def test_a_name_with_quotes_and_braces_cannot_change_the_query(prom_url: str) -> None:
    config = parse_config(_config(prom_url))
    transport = Transport(config.prometheus)
    evil = 'x"} or vector(1) or {a="'
    query = build_workload_query(config.prometheus.queries.workload_load, evil, "chat", "1s")
    assert transport.query_range(query, END - 10, END, STEP) == []  # parsed, matches nothing
    pool_query = build_query(
        config.prometheus.queries.pool_utilization, {"Hostname": evil + "\\"}, "1s"
    )
    assert transport.query_range(pool_query, END - 10, END, STEP) == []


@pytest.mark.parametrize(
    ("value", "literal"),
    [
        ("plain", '"plain"'),
        ('a"b', '"a\\"b"'),
        ("a\\b", '"a\\\\b"'),
        ("a}b", '"a}b"'),
        ("a\nb", '"a\\nb"'),
    ],
)
def test_label_values_are_escaped_into_string_literals(value: str, literal: str) -> None:
    assert escape_label_value(value) == literal


def test_a_hostname_matcher_also_tries_the_lowercase_label() -> None:
    q = build_query("avg(m{{{matchers}}})", {"Hostname": "n1"}, "1s")
    assert q == '(avg(m{Hostname="n1"})) or (avg(m{hostname="n1"}))'


@pytest.mark.parametrize(("seconds", "text"), [(0.5, "0.5"), (1.0, "1"), (30.0, "30")])
def test_steps_are_sent_as_float_seconds(seconds: float, text: str) -> None:
    assert format_step(seconds) == text


# --------------------------------------------------------------------------- failures


def _answer(result_type: str, result: list[Any]) -> bytes:
    return json.dumps(
        {"status": "success", "data": {"resultType": result_type, "result": result}}
    ).encode()


class _Handler(BaseHTTPRequestHandler):
    mode = "garbage"

    def do_GET(self) -> None:
        if self.mode == "slow":
            time.sleep(3)
        status, body = {
            "garbage": (200, b"<html>not json</html>"),
            "shape": (200, b'{"status": "success", "data": {"nope": []}}'),
            "error": (503, b"overloaded"),
            "echo": (500, ("token was " + self.headers.get("Authorization", "")).encode()),
            "slow": (200, _answer("matrix", [])),
            "object_sample": (
                200,
                _answer("matrix", [{"metric": {}, "values": [{"t": 1, "v": "2"}]}]),
            ),
            "infinite": (
                200,
                _answer("matrix", [{"metric": {}, "values": [[END - 1, "+Inf"], [END, "1"]]}]),
            ),
        }[self.mode]
        if self.mode == "infinite" and self.path.startswith("/api/v1/query?"):
            # An instant query (the frame buffer's newest figure) answers a vector.
            body = _answer("vector", [{"metric": {}, "value": [END, "+Inf"]}])
        reply(self, status, body, {})

    def log_message(self, *args: Any) -> None:
        pass


def _bad_server(mode: str) -> AbstractContextManager[str]:
    return serving(type("H", (_Handler,), {"mode": mode}))


def _flat_problem(url: str, extra: str = "") -> tuple[str | None, PrometheusSource]:
    _, source = _source(url, extra)
    flat = next(p for p in source.observe(END + 1).pools if p.name == "flat")
    return flat.problem, source


@pytest.mark.parametrize(
    ("mode", "message", "healthy"),
    [
        ("garbage", "not JSON", False),
        ("shape", "wrong shape", False),
        ("error", "503", False),
        ("slow", "timed out", False),
        ("infinite", "NaN or Inf", True),  # the server is fine, the data is not
    ],
)
def test_a_misbehaving_server_or_bad_data_means_no_action(
    mode: str, message: str, healthy: bool
) -> None:
    with _bad_server(mode) as url:
        extra = f'prometheus: {{url: "{url}", timeout: 1s, retries: 0}}\n' if mode == "slow" else ""
        problem, source = _flat_problem(url, extra)
    assert problem is not None and message in problem, problem
    assert source.health.ok is healthy


def test_a_stopped_server_means_no_action_and_the_next_good_cycle_recovers(tmp_path: Path) -> None:
    data = tmp_path / "data.om"
    flat = [({"Hostname": "node-flat"}, PLANTED["flat"])]
    metrics = {"DCGM_FI_DEV_GPU_UTIL": flat, "nvidia_gpu_stall_percentage": flat}
    write_openmetrics(data, metrics, START, POINTS)
    port = free_port()
    with prometheus(data, port=port) as url:
        _, source = _source(url)
        pool = next(p for p in source.observe(END + 1).pools if p.name == "flat")
        assert pool.problem is None and source.health.ok
    # The server is stopped: no action, an unhealthy source, the window kept.
    pool = next(p for p in source.observe(END + 2).pools if p.name == "flat")
    assert pool.problem is not None and "cannot connect" in pool.problem
    assert not source.health.ok and pool.utilization is not None
    with prometheus(data, port=port):  # back on the same address
        pool = next(p for p in source.observe(END + 3).pools if p.name == "flat")
    assert pool.problem is None and source.health.ok


def test_secrets_never_appear_in_errors_and_a_rotated_token_is_read_again(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cr3t-token-1\n")
    with _bad_server("echo") as url:
        extra = f'prometheus: {{url: "{url}", bearer_token_file: {token}, retries: 0}}\n'
        config = parse_config(_config(url, extra))
        transport = Transport(config.prometheus)
        with pytest.raises(SourceError) as info:
            transport.query_range("up", END - 1, END, STEP)
        assert "s3cr3t" not in str(info.value) and "HTTP 500 from" in str(info.value)
        time.sleep(0.01)
        token.write_text("s3cr3t-token-2\n")
        import os

        os.utime(token, (time.time() + 5, time.time() + 5))
        with pytest.raises(SourceError):
            transport.query_range("up", END - 1, END, STEP)
        seen = transport.auth_headers
    assert seen == {"Authorization": "Bearer s3cr3t-token-2"}


def test_basic_auth_is_sent_and_its_password_never_appears_in_errors(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("hunter2-secret\n")
    with _bad_server("echo") as url:
        extra = (
            f'prometheus: {{url: "{url}", retries: 0, basic_auth_username: gpuscaler, '
            f"basic_auth_password_file: {password}}}\n"
        )
        transport = Transport(parse_config(_config(url, extra)).prometheus)
        with pytest.raises(SourceError) as info:
            transport.query_range("up", END - 1, END, STEP)
    import base64

    sent = base64.b64encode(b"gpuscaler:hunter2-secret").decode()
    assert sent not in str(info.value) and "hunter2" not in str(info.value)
    assert transport.auth_headers == {"Authorization": f"Basic {sent}"}


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ('prometheus: {url: "ftp://x"}', "is not an http(s) URL"),
        ('prometheus: {url: "http://x", basic_auth_username: u}', "needs both"),
        ('prometheus: {url: "http://x", client_cert_file: /c}', "client certificate needs both"),
        ("prometheus: {queries: {pool_utilization: 'avg(x)'}}", "must contain {matchers}"),
        (
            "prometheus: {queries: {pool_utilization: 'avg(x{{{matchers}}}[{oops}])'}}",
            "only {matchers} and {lookback}",
        ),
    ],
)
def test_a_bad_prometheus_section_is_refused(extra: str, problem: str) -> None:
    from gpuscaler.config import ConfigError

    with pytest.raises(ConfigError) as info:
        parse_config(extra)
    assert any(problem in p for p in info.value.problems), info.value.problems


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("- a list\n", "expected a mapping"),
        ("pools: {p: {fragments: many}}\n", "malformed state file"),
        (None, "cannot read state file"),
    ],
)
def test_a_bad_state_file_exits_two_before_any_query(
    tmp_path: Path, content: str | None, message: str
) -> None:
    cfg = tmp_path / "gpuscaler.yaml"
    cfg.write_text(_config("http://127.0.0.1:9"))
    state = tmp_path / "state.yaml"
    if content is not None:
        state.write_text(content)
    out = run_cli("once", "--config", str(cfg), "--state", str(state), timeout=60)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
