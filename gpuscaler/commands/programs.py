"""The sibling programs' subcommands: agent and extender."""

from __future__ import annotations

import argparse
from typing import Any

from gpuscaler.commands.common import EXIT_OK, cluster_parser, config_or_default


def cmd_agent(args: argparse.Namespace) -> int:
    """The node agent: see gpuscaler.agent."""
    from gpuscaler.agent.app import AgentArgs, run_agent

    config = config_or_default(args.config, require_targets=False)  # the agent manages its node
    names = ("node", "kubeconfig", "metrics_port", "metrics_host", "fake_nvml")
    return run_agent(config, AgentArgs(**{n: getattr(args, n) for n in names}))


def add_agent_parser(sub: Any) -> None:
    does = "the node agent: time slices, GPU topology, orphan cleanup"
    p = cluster_parser(sub, "agent", does, cmd_agent)
    p.add_argument("--node", help="this node's name (default: $NODE_NAME)")
    p.add_argument("--metrics-port", type=int, default=8080, help="/metrics, /healthz, /readyz")
    p.add_argument("--metrics-host", default="0.0.0.0", help="address for the probes (all)")
    p.add_argument("--fake-nvml", help=argparse.SUPPRESS)  # tests: GPUs from a JSON file


def cmd_extender(args: argparse.Namespace) -> int:
    """The scheduler extender for a second kube-scheduler."""
    from gpuscaler.setup import SetupError, kube_api

    config = config_or_default(args.config, require_targets=False)  # it places pods, not targets
    if not config.prometheus.url:
        why = "the extender reads GPU memory from dcgm-exporter through Prometheus"
        raise SetupError(f"prometheus.url is not set: {why}")
    for flag, port in (("--port", args.port), ("--metrics-port", args.metrics_port)):
        if port is not None and not 0 < port < 65536:
            raise SetupError(f"{flag} {port}: not a TCP port")
    from gpuscaler.extender.run import serve

    # no API, an address that cannot be listened on, unreadable TLS files: SetupError, exit 2
    api = kube_api(args.kubeconfig, config.kubernetes)
    serve(config, api, args.host, args.port, not args.no_leader_election, args.metrics_port)
    return EXIT_OK


def add_extender_parser(sub: Any) -> None:
    does = "serve the memory-aware kube-scheduler extender"
    p = cluster_parser(sub, "extender", does, cmd_extender)
    p.add_argument("--port", type=int, default=8888)
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all)")
    probes = "also /metrics, /healthz, /readyz here, plain HTTP"
    p.add_argument("--metrics-port", type=int, help=probes)
    lease = "act without a Lease (one replica only)"
    p.add_argument("--no-leader-election", action="store_true", help=lease)
