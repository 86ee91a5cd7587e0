"""Scheduler extender latency: filter + prioritize for 1,000 nodes x 8 GPUs, as a
node-cache-capable kube-scheduler sends them (NodeNames, a full v1.Pod), over real HTTP
on 127.0.0.1 to the ASGI app under uvicorn in its own process.

Baseline, measured in the same run just before: the same verbs called in-process (no
HTTP, no JSON), so `http_overhead` (the p99s over HTTP over the p99s in-process) says what
the wire costs on top of the Filter/Score work. Latency is wall time: it is what
kube-scheduler waits for.

Gate: p99 <= 20 ms for each verb.

    python bench/extender.py [--nodes 1000] [--rounds 500]

Last line: RESULT nodes= filter_p99_ms= prioritize_p99_ms= rps= http_overhead= load1=
gate=pass|fail
"""

from __future__ import annotations

import argparse
import gc
import http.client
import multiprocessing
import os
import random
import socket
import statistics
import time
from typing import Any

import orjson

from gpuscaler.config import SchedulerConfig
from gpuscaler.core.gpufit import Gpu, NodeGpus, NodeMeta, PodRecord
from gpuscaler.extender.metrics import ExtenderMetrics
from gpuscaler.extender.protocol import parse_args
from gpuscaler.extender.server import ExtenderApp
from gpuscaler.extender.service import Extender
from gpuscaler.extender.state import GpuState

GATE_MS = 20.0
A100 = 40960.0


class FixedCluster:
    """GPU data and nodes given up front, no pods."""

    def __init__(self, gpus: dict[str, NodeGpus], meta: dict[str, NodeMeta]):
        self.gpus, self.meta = gpus, meta

    def fetch(self) -> dict[str, NodeGpus]:
        return dict(self.gpus)

    def nodes(self) -> dict[str, NodeMeta]:
        return self.meta

    def pods(self) -> list[PodRecord]:
        return []


def cluster(nodes: int, gpus: int, seed: int) -> dict[str, NodeGpus]:
    rng = random.Random(seed)
    now = time.time() + 3600  # fresh for the whole run
    out = {}
    for n in range(nodes):
        name = f"gpu-node-{n:04d}"
        out[name] = NodeGpus(
            name,
            tuple(
                Gpu(f"GPU-{n}-{i}", i, A100, rng.choice([0, 0.25, 0.4, 0.8, 0.95]) * A100, i // 4)
                for i in range(gpus)
            ),
            now,
        )
    return out


def request(nodes: list[str]) -> bytes:
    """ExtenderArgs with a pod as the API server serializes one (about 3 KB)."""
    pod = {
        "metadata": {
            "name": "llm-serve-7d9f8-abcde",
            "generateName": "llm-serve-7d9f8-",
            "namespace": "inference",
            "uid": "0d6c1c7e-5b8e-4b4e-9a57-1f0e3c2a9b11",
            "resourceVersion": "123456",
            "creationTimestamp": "2026-11-29T10:00:00Z",
            "labels": {"app": "llm-serve", "pod-template-hash": "7d9f8"},
            "annotations": {"gpu-scheduler/memory-mb": "16384", "gpu-scheduler/gpu-count": "2"},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "llm-serve-7d9f8",
                 "uid": "5c1e", "controller": True, "blockOwnerDeletion": True}
            ],
        },
        "spec": {
            "schedulerName": "gpu-scheduler",
            "containers": [
                {"name": "server", "image": "vllm/vllm-openai:v0.6.0",
                 "args": ["--model", "meta-llama/Llama-3-8B", "--tensor-parallel-size", "2"],
                 "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"cpu": "4"}},
                 "env": [{"name": f"VAR_{i}", "value": "x" * 20} for i in range(20)]}
            ],
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }  # fmt: skip
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": nodes})


def build_app(nodes: int, gpus: int, seed: int) -> ExtenderApp:
    gpu_nodes = cluster(nodes, gpus, seed)
    # two NUMA domains per node, from the fallback label
    fixed = FixedCluster(gpu_nodes, {n: NodeMeta(n, gpus_per_numa="4") for n in gpu_nodes})
    cfg = SchedulerConfig()
    state = GpuState(fixed, fixed, cfg.memory_margin, cfg.reservation_ttl, time.time)
    state.refresh()
    no_binder: Any = None  # the benchmark never binds
    return ExtenderApp(
        Extender(state, no_binder, cfg, lambda: True, time.time), ExtenderMetrics(), lambda: None
    )


def serve(port: int, nodes: int, gpus: int, seed: int) -> None:
    import uvicorn

    app = build_app(nodes, gpus, seed).build()
    gc.freeze()  # as gpuscaler.extender.run does after each refresh
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/healthz")
            if c.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("extender did not start")


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] * 1000


def over_http(port: int, body: bytes, rounds: int) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # keep-alive, as Go's client
    headers = {"Content-Type": "application/json"}
    times: dict[str, list[float]] = {"filter": [], "prioritize": []}
    kept = 0
    gc.disable()  # the client stands in for kube-scheduler (Go): its own GC is not measured
    started = time.perf_counter()
    for _ in range(rounds):
        for verb in ("filter", "prioritize"):
            t = time.perf_counter()
            conn.request("POST", f"/{verb}", body=body, headers=headers)
            answer = conn.getresponse().read()
            times[verb].append(time.perf_counter() - t)
            if verb == "filter":
                kept = len(orjson.loads(answer)["NodeNames"])
    elapsed = time.perf_counter() - started
    gc.enable()
    return {"times": times, "rps": 2 * rounds / elapsed, "kept": kept}


def in_process(app: ExtenderApp, body: bytes, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"filter": [], "prioritize": []}
    for _ in range(rounds):
        t = time.perf_counter()
        app.extender.filter(parse_args(body, app.extender.config.max_nodes))
        times["filter"].append(time.perf_counter() - t)
        t = time.perf_counter()
        app.extender.prioritize(parse_args(body, app.extender.config.max_nodes))
        times["prioritize"].append(time.perf_counter() - t)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    a = parser.parse_args()
    names = [f"gpu-node-{n:04d}" for n in range(a.nodes)]
    body = request(names)
    app = build_app(a.nodes, a.gpus, a.seed)
    in_process(app, body, 20)  # warm-up, as over HTTP
    base = in_process(app, body, a.rounds)
    port = free_port()
    proc = multiprocessing.get_context("spawn").Process(
        target=serve, args=(port, a.nodes, a.gpus, a.seed), daemon=True
    )
    proc.start()
    try:
        wait_up(port)
        over_http(port, body, 20)  # warm-up
        http = over_http(port, body, a.rounds)
    finally:
        proc.terminate()
        proc.join(10)
    f99, p99_ = p99(http["times"]["filter"]), p99(http["times"]["prioritize"])
    b99 = p99(base["filter"]) + p99(base["prioritize"])
    ms = {k: statistics.median(v) * 1000 for k, v in http["times"].items()}
    print(f"request body {len(body)} bytes, {a.nodes} nodes x {a.gpus} GPUs, {a.rounds} rounds")
    print(f"filter kept {http['kept']} of {a.nodes} nodes")
    print(f"in-process p99: filter {p99(base['filter']):.2f} ms, ", end="")
    print(f"prioritize {p99(base['prioritize']):.2f} ms")
    print(f"over HTTP p50: filter {ms['filter']:.2f} ms, prioritize {ms['prioritize']:.2f} ms")
    ok = f99 <= GATE_MS and p99_ <= GATE_MS
    print(
        f"RESULT nodes={a.nodes} filter_p99_ms={f99:.2f} prioritize_p99_ms={p99_:.2f} "
        f"rps={http['rps']:.0f} http_overhead={(f99 + p99_) / b99:.2f} "
        f"load1={os.getloadavg()[0]:.1f} gate={'pass' if ok else 'fail'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
