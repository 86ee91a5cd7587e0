"""Assembly of the node agent and its poll loop (`gpuscaler agent --config PATH [--node N]`).

The node name comes from `--node`, else `NODE_NAME`, and the agent's own pod UID from
`POD_UID` (the DaemonSet sets both by the downward API; without `POD_UID` the pod list is
never trusted, so nothing is killed). `cli` parses arguments and calls `run_agent`.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuscaler.adapters.host import HostFs
from gpuscaler.adapters.kube.api import KubeError
from gpuscaler.adapters.node import NodeApi
from gpuscaler.adapters.nvml import FakeNvml, Nvml, NvmlError, RealNvml
from gpuscaler.adapters.podresources import PodResourcesError, list_pods
from gpuscaler.agent.metrics import AgentHealth, AgentMetrics
from gpuscaler.agent.runner import NodeAgent
from gpuscaler.config import Config
from gpuscaler.setup import SetupError, identity, kube_api, stop_on_signal

log = logging.getLogger("gpuscaler.agent")


@dataclass(frozen=True)
class AgentArgs:
    node: str | None
    kubeconfig: str | None
    metrics_port: int
    metrics_host: str
    fake_nvml: str | None = None


def node_name(given: str | None) -> str:
    name = given or os.environ.get("NODE_NAME")
    if not name:
        raise SetupError(
            "no node name: pass --node NAME or set NODE_NAME (the DaemonSet sets it from "
            "spec.nodeName by the downward API)"
        )
    return name


def build_agent(
    config: Config, args: AgentArgs, metrics: AgentMetrics
) -> tuple[NodeAgent, Callable[[], None]]:
    """The agent, and what starts each poll (the API client's time budget per poll)."""
    name = node_name(args.node)
    api = kube_api(args.kubeconfig, config.kubernetes)
    nvml: Nvml
    try:
        nvml = FakeNvml(args.fake_nvml) if args.fake_nvml else RealNvml()
    except NvmlError as e:
        raise SetupError(f"no NVML: {e}") from None
    cfg = config.agent
    socket = cfg.pod_resources_socket
    agent = NodeAgent(
        config,
        NodeApi(api, config, name, identity()),
        nvml,
        HostFs(Path(cfg.proc_root), Path(cfg.sys_root)),
        metrics,
        kubelet_pods=functools.partial(list_pods, socket, cfg.pod_resources_timeout),
        own_uid=os.environ.get("POD_UID") or None,
    )
    return agent, api.begin_tick


def poll_once(
    agent: NodeAgent,
    metrics: AgentMetrics,
    health: AgentHealth,
    begin: Callable[[], None] = lambda: None,
) -> bool:
    """One poll; a failure is logged and counted, and the loop goes on."""
    begin()
    try:
        report = agent.poll(time.monotonic())
    except (KubeError, NvmlError, PodResourcesError, OSError) as e:
        metrics.polls.labels("failed").inc()
        health.record(False)
        log.warning("poll failed: %s", e, extra={"event": "poll_failed"})
        return False
    metrics.polls.labels("ok").inc()
    health.record(True)
    log.debug("poll: %d GPU(s), problems: %s", len(report.gpus), report.problems)
    return True


def run_agent(config: Config, args: AgentArgs) -> int:
    """Poll every `agent.poll_interval` until SIGTERM/SIGINT. 0 on a clean stop."""
    from gpuscaler.observability import serve

    metrics = AgentMetrics()
    health = AgentHealth(config.agent.poll_interval)
    agent, begin = build_agent(config, args, metrics)
    stop = stop_on_signal()
    if args.metrics_port:
        serve(metrics, health, args.metrics_port, args.metrics_host)
        print(
            f"serving /metrics, /healthz, /readyz on {args.metrics_host}:{args.metrics_port}",
            file=sys.stderr,
        )
    mode = "dry run" if agent.dry_run else "acting"
    if agent.own_uid is None:
        mode += " (POD_UID unset: no pod list is trusted, nothing is killed)"
    print(f"agent on node {agent.node.node}: {mode}", file=sys.stderr)
    while True:
        poll_once(agent, metrics, health, begin)
        if stop.wait(config.agent.poll_interval):
            return 0
