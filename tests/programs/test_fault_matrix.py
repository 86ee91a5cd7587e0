"""The fault matrix: each fault paired with each actuator, through the
controller as `run` assembles it (Prometheus source, cluster reader, actuators). Each case:
- no action on the affected target, and a reason in the plan and in the logs;
- the other targets unaffected (their decisions are applied in the same tick);
- recovery on the next good tick (the affected target's decision is applied).

Two pools (a, b) run hot with high stall: each plans fewer fragments and a longer time
slice. Two ScaledObjects (alpha, beta) carry load: each plans a higher floor. A fault hits
one signal of pool a or alpha, or one of their writes.

Prometheus here is a small programmable server, and the Kubernetes API the fake: the
faults are the point (a slow answer, garbage, a 500 on one object, a hang), and a real
server cannot be made to give them on demand. What the real servers do is in
tests/adapters/test_prometheus.py and the control-plane tests.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubefake import FakeCluster, fake_apiserver
from kubeobjects import node, plugin_configmap, scaled_object
from kubernetes import client

from gpuscaler.adapters.kube.actuator import KubeActuator
from gpuscaler.adapters.kube.api import BoundedApiClient
from gpuscaler.adapters.kube.nodepools import sharing_config
from gpuscaler.config import parse_config
from gpuscaler.controller import TickResult
from gpuscaler.controller.assembly import cluster_controller

STEP = 5.0
WINDOW = 1200.0
POOLS = ("a", "b")
WORKLOADS = ("alpha", "beta")


@dataclass
class Faults:
    """What the fake Prometheus does to each query: signal name -> mode."""

    modes: dict[str, str] = field(default_factory=dict)
    down: bool = False
    now: float = 0.0
    """The newest end asked for: "now" for the faults (a read of an older span, such as
    the rest of a window behind its head, sees the same stale or NaN stretch)."""


def _signal(query: str) -> str:
    """Which planted signal a query asks for: pool:a:util, pool:a:stall, workload:alpha."""
    for w in WORKLOADS:
        if w in query:
            return f"workload:{w}"
    pool = next((p for p in POOLS if f'"node-{p}"' in query), "?")
    if "stall" in query:
        return f"pool:{pool}:stall"
    if "FB_" in query:
        return f"pool:{pool}:memory"
    return f"pool:{pool}:util"


def _value(signal: str, i: int) -> float | None:
    wiggle = math.sin(i / 7)
    if signal.endswith(":util"):
        return 96 + wiggle  # hot: fewer fragments
    if signal.endswith(":stall"):
        return 40 + wiggle  # stalled: a longer time slice
    if signal.startswith("workload:"):
        return 600 + 10 * wiggle  # six GPUs of load: a higher floor
    return None  # no frame-buffer series: memory bounds come from the config


def _answer(
    signal: str, mode: str, start: float, end: float, step: float, now: float | None = None
) -> tuple[int, bytes]:
    if mode == "garbage":
        return 200, b"<html>proxy error</html>"
    if mode == "shape":
        return 200, b'{"status":"success","data":{"resultType":"matrix","result":[{"v":1}]}}'
    if mode == "error":
        return 503, b"overloaded"
    values = []
    now = end if now is None else now
    t = math.ceil(start / step) * step
    while t <= end:
        v = _value(signal, round(t / step))
        if v is not None and not (mode == "stale" and t > now - 600):
            text = {"nan": "NaN", "absurd": "1e300"}.get(mode, f"{v:.3f}")
            values.append([t, text if t > now - 60 else f"{v:.3f}"])
        t += step
    result = [] if mode == "empty" or not values else [{"metric": {}, "values": values}]
    body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    return 200, json.dumps(body).encode()


@pytest.fixture
def prometheus() -> Iterator[tuple[str, Faults]]:
    faults = Faults()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            q = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
            signal = _signal(q.get("query", ""))
            mode = "error" if faults.down else faults.modes.get(signal, "")
            if mode == "slow":
                time.sleep(1.5)
            if "start" not in q:  # an instant query: the frame buffer's newest figure
                status, body = _answer(signal, mode, 0.0, -1.0, 1.0)
                body = body.replace(b'"matrix"', b'"vector"')  # empty: no such series here
            else:
                faults.now = max(faults.now, float(q["end"]))
                status, body = _answer(
                    signal, mode, float(q["start"]), float(q["end"]), float(q["step"]), faults.now
                )
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", faults
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


CONFIG = """
prometheus: {{url: "{url}", timeout: 1s, retries: 0}}
metrics: {{step: 5s, window: 20m, staleness: 2m}}
forecast: {{fit_step: 10s, min_history: 5m, horizon: 5m}}
fragments: {{sustain: 0s, cooldown: 0s}}
time_slice: {{stall_window: 2m, cooldown: 0s}}
replicas: {{cooldown: 0s, max_replicas: 20, skill_check: false}}  # floors from the first tick
preemption: {{enabled: false}}
kubernetes:
  max_writes_per_minute: 1000
  max_nodes_per_tick: 10
  read_timeout: 1s
  watch_cache: false  # the fake API server has no watch (the cache: tests/adapters/test_watch_cache.py)
node_pools:
  - {{name: a, selector: {{label: pool, value: a}}, gpu_memory_gib: 80, metrics_matchers: {{Hostname: node-a}}}}
  - {{name: b, selector: {{label: pool, value: b}}, gpu_memory_gib: 80, metrics_matchers: {{Hostname: node-b}}}}
workloads:
  - {{namespace: ml, kind: ScaledObject, name: alpha, node_pool: a}}
  - {{namespace: ml, kind: ScaledObject, name: beta, node_pool: b}}
"""


class World:
    """The fake cluster, the fake Prometheus and the controller `run` would build."""

    def __init__(
        self, prom: str, faults: Faults, api_url: str, fake: FakeCluster, path: Path | None = None
    ):
        self.faults, self.fake = faults, fake
        for pool in POOLS:
            n = node(f"gpu-{pool}", config="ts-4", gpus=2, extra_labels={"pool": pool})
            fake.add("v1", "nodes", n)
        configs = {f"ts-{n}": sharing_config("time-slicing", n) for n in (1, 2, 4, 8)}
        fake.add("v1", "configmaps", plugin_configmap(configs))  # pre-provisioned
        for w in WORKLOADS:
            fake.add("keda.sh/v1alpha1", "scaledobjects", scaled_object(w, 1))
        text = CONFIG.format(url=prom)
        if path is not None:
            path.write_text(text)
        self.config = parse_config(text)
        self.api = BoundedApiClient(client.Configuration(host=api_url), 1.0, 1.0, 30.0)
        reload = str(path) if path else None
        self.parts = cluster_controller(
            self.config, self.api, dry_run=False, config_path=reload, leader_election=False
        )

    def tick(self) -> TickResult:
        return self.parts.controller.tick(time.time())


@pytest.fixture
def world(prometheus: tuple[str, Faults]) -> Iterator[World]:
    with fake_apiserver() as (url, fake):
        yield World(prometheus[0], prometheus[1], url, fake)


def _applied(result: TickResult) -> set[tuple[str, str]]:
    return {(d.kind, d.target) for d in result.applied}


def _skips(result: TickResult) -> dict[tuple[str, str], str]:
    return {(s.kind, s.target): s.reason for s in result.plan.skips}


EVERY = {
    ("fragments", "a"),
    ("fragments", "b"),
    ("time_slice", "a"),
    ("time_slice", "b"),
    ("replica_floor", "ml/ScaledObject/alpha"),
    ("replica_floor", "ml/ScaledObject/beta"),
}
FLOOR_A = ("replica_floor", "ml/ScaledObject/alpha")


def test_with_no_fault_every_actuator_acts_on_every_target(world: World) -> None:
    assert _applied(world.tick()) == EVERY


METRIC_FAULTS = {
    "slow": "timed out",
    "garbage": "not JSON",
    "shape": "no values list",
    "error": "503",
    "nan": "NaN or Inf",
    "absurd": "outside 0..",
    "stale": "stale",
    "empty": "empty result",
}
SIGNALS = {  # the faulty signal -> the decisions of the affected target
    "pool:a:util": {("fragments", "a"), ("time_slice", "a")},
    "pool:a:stall": {("fragments", "a"), ("time_slice", "a")},
    "workload:alpha": {FLOOR_A},
}


@pytest.mark.parametrize("signal", list(SIGNALS))
@pytest.mark.parametrize("mode", list(METRIC_FAULTS))
def test_a_metric_fault_stops_only_its_target_and_the_next_good_tick_recovers(
    world: World, signal: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    affected = SIGNALS[signal]
    if mode == "stale":  # only the decision that reads the stale series waits
        affected = {("fragments", "a")} if signal.endswith("util") else affected
        affected = {("time_slice", "a")} if signal.endswith("stall") else affected
    world.faults.modes[signal] = mode
    with caplog.at_level(logging.INFO):
        first = world.tick()
    assert _applied(first) == EVERY - affected
    skips = _skips(first)
    for target in affected:
        assert METRIC_FAULTS[mode] in skips.get(target, ""), (target, skips)
        assert any(METRIC_FAULTS[mode] in r.getMessage() + str(r.__dict__) for r in caplog.records)
    world.faults.modes.clear()
    assert affected <= _applied(world.tick())  # the others may step again: still hot


def test_prometheus_down_stops_every_target_and_the_next_good_tick_recovers(
    world: World,
) -> None:
    world.faults.down = True
    first = world.tick()
    assert _applied(first) == set()
    assert all("503" in reason for reason in _skips(first).values())
    world.faults.down = False
    assert _applied(world.tick()) == EVERY


API_FAULTS = {  # fault -> (verb, path of pool a's node or alpha, code, what the log says)
    "409 on every try": (409, "still conflicting"),
    "500": (500, "HTTP 500"),
    "403": (403, "HTTP 403"),
    "429 (API priority and fairness)": (429, "HTTP 429"),
}
WRITES = {
    "node a (fragments and time slice)": (
        r"/nodes/gpu-a$",
        {("fragments", "a"), ("time_slice", "a")},
    ),
    "ScaledObject alpha (floor)": (r"/scaledobjects/alpha$", {FLOOR_A}),
}


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("fault", list(API_FAULTS))
def test_an_api_fault_on_one_write_leaves_that_object_unchanged_and_the_rest_applied(
    world: World, write: str, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    path, affected = WRITES[write]
    code, says = API_FAULTS[fault]
    for _ in range(12):  # every try of this tick
        world.fake.fail_next("PATCH", path, code)
    with caplog.at_level(logging.WARNING):
        first = world.tick()
    assert _applied(first) == EVERY - affected
    assert any(says in r.getMessage() for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]
    assert {(d.kind, d.target) for d in first.plan.decisions} >= affected  # planned, not applied
    world.fake.faults.clear()
    second = world.tick()
    assert affected <= _applied(second) | _held_by_progress(second)


def _held_by_progress(result: TickResult) -> set[tuple[str, str]]:
    """A node change that was half rolled out continues from the node annotations."""
    return {(s.kind, s.target) for s in result.plan.skips if "rollout" in s.reason}


def test_an_api_server_that_hangs_flags_every_target_within_the_timeouts(world: World) -> None:
    world.fake.delay = 5.0  # longer than the 1 s read timeout
    started = time.monotonic()
    first = world.tick()
    assert time.monotonic() - started < 20
    assert _applied(first) == set()
    assert all("no answer from the API server in time" in r for r in _skips(first).values())
    world.fake.delay = 0.0
    assert _applied(world.tick()) == EVERY


def test_leadership_lost_mid_tick_stops_the_remaining_writes(world: World) -> None:
    writes: list[int] = []
    leading = {"now": True}
    actuator = world.parts.controller.actuator
    assert isinstance(actuator, KubeActuator)
    actuator.workloads.writer.may_act = lambda: leading["now"]
    original = world.fake.handle

    def count(
        verb: str, path: str, query: dict[str, list[str]], ctype: str, body: Any
    ) -> tuple[int, dict[str, Any]]:
        if verb == "PATCH":
            writes.append(1)
            leading["now"] = False  # lost after the first write
        return original(verb, path, query, ctype, body)

    world.fake.handle = count  # type: ignore[method-assign]
    result = world.tick()
    assert len(result.applied) <= 1
    assert len(writes) <= 2  # the write in flight, and at most the Event that records it


def test_a_config_changed_mid_tick_applies_whole_once_the_next_ticks_read_it_alike(
    prometheus: tuple[str, Faults], tmp_path: Path
) -> None:
    config_file = tmp_path / "gpuscaler.yaml"
    with fake_apiserver() as (url, fake):
        world = World(prometheus[0], prometheus[1], url, fake, path=config_file)
        original = fake.handle
        edited: list[bool] = []

        def edit_during_the_first_write(
            verb: str, path: str, query: dict[str, list[str]], ctype: str, body: Any
        ) -> tuple[int, dict[str, Any]]:
            if verb == "PATCH" and not edited:
                edited.append(True)  # the operator saves a new config mid-tick
                config_file.write_text(
                    config_file.read_text().replace(
                        "preemption:", "control: {dry_run: true}\npreemption:"
                    )
                )
            return original(verb, path, query, ctype, body)

        fake.handle = edit_during_the_first_write  # type: ignore[method-assign]
        first = world.tick()
        assert edited and _applied(first) == EVERY  # the tick finished on the config it began with
        world.tick()  # the change read once: it may still be being written
        third = world.tick()
        assert third.mode == "dry_run" and third.applied == ()
        assert world.parts.controller.config.control.dry_run is True
