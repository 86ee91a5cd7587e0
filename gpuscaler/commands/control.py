"""The controller's subcommands: once and run."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from gpuscaler.commands.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_OK,
    cluster_parser,
    config_or_default,
)
from gpuscaler.config import Config, redact_url
from gpuscaler.controller import Controller
from gpuscaler.logs import decision_outcome


def _reloading(
    controller: Controller,
    args: argparse.Namespace,
    adapt: Callable[[Config], Config] = lambda c: c,
) -> tuple[Controller, None, Any]:
    """`run` without a cluster reloads its config file too: a valid change applies from the
    next tick (`adapt`ed as the mode needs), an invalid one is logged and refused."""
    if args.command != "run":
        return controller, None, None
    from gpuscaler.reload import ConfigReloader

    reloader = ConfigReloader(args.config, lambda c, _: controller.reconfigure(adapt(c)))
    controller.before_tick.insert(0, reloader.check)
    return controller, None, reloader


def _controller(args: argparse.Namespace, config: Config) -> tuple[Controller, Any, Any]:
    """The controller for once/run, the cluster parts around it (None without a cluster)
    and the config reloader (None when nothing reloads). Exits 2 on bad input: a bad
    state or snapshot file, no Kubernetes API."""
    from gpuscaler.controller.assembly import NoActuator, cluster_controller, snapshot_controller
    from gpuscaler.setup import SetupError, kube_api

    snapshot = getattr(args, "cluster_snapshot", None)
    try:
        if snapshot is not None:
            if not args.dry_run:
                raise SetupError("--cluster-snapshot plans only: add --dry-run")
            controller = snapshot_controller(config, snapshot)
            print(
                f"cluster state from {snapshot}; metrics from Prometheus; dry run", file=sys.stderr
            )
            return controller, None, None
        if not config.prometheus.url:
            from gpuscaler.sim.live import LiveSimulation
            from gpuscaler.sim.replay import scenario_config

            print(
                "source: simulator on the bundled trace (no prometheus.url in the config): "
                "`once` and `run` observe and act on an in-process simulated cluster, never a "
                "real one.",
                file=sys.stderr,
            )
            live = LiveSimulation(config, wall_start=time.time())
            dry = args.dry_run or config.control.dry_run
            live_controller = Controller(live.config, live, live, dry_run=dry)
            return _reloading(live_controller, args, scenario_config)
        if args.state is not None:
            from gpuscaler.adapters.kube.cluster import load_state
            from gpuscaler.sources import PrometheusSource

            state, said = load_state(args.state, config)
            url = redact_url(config.prometheus.url)
            print(f"source: Prometheus at {url}; {said}; no cluster: dry run.", file=sys.stderr)
            source = PrometheusSource(config, state)
            return _reloading(Controller(config, source, NoActuator(), dry_run=True), args)
        api = kube_api(args.kubeconfig, config.kubernetes)
        elect = args.command == "run" and not args.no_leader_election
        parts = cluster_controller(config, api, args.dry_run, args.config, elect)
        return parts.controller, parts, parts.reloader
    except (SetupError, ValueError) as e:
        print(str(e), file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None


def cmd_once(args: argparse.Namespace) -> int:
    config = config_or_default(args.config)
    # One tick decides: it reads its whole window first, with nothing left behind it.
    prometheus = config.prometheus.model_copy(update={"background_backfill": False})
    config = config.model_copy(update={"prometheus": prometheus})
    controller, _, _ = _controller(args, config)
    result = controller.tick(time.time())
    for d in result.plan.decisions:
        outcome = decision_outcome(d, result.applied, result.mode)
        print(json.dumps(d.as_record() | {"outcome": outcome}))
    for s in result.plan.skips:
        print(json.dumps(s.as_record()))
    return EXIT_OK


def _serve_external_scaler(
    args: argparse.Namespace, config: Config, parts: Any, registry: Any
) -> Any:
    """KEDA's external scaler (gpuscaler.extscaler) when a port is set; None when off."""
    port = args.external_scaler_port
    port = config.external_scaler.port if port is None else port  # 0: off
    if not port:
        return None
    if parts is None:
        print("external scaler: serves a cluster's ScaledObjects; off here", file=sys.stderr)
        return None
    from gpuscaler.extscaler.server import attach

    server = attach(parts, port, registry=registry)  # ExternalScalerSetupError: exit 2
    print(f"serving KEDA's external scaler (gRPC) on port {server.port}", file=sys.stderr)
    return server


def cmd_run(args: argparse.Namespace) -> int:
    from gpuscaler.controller.loop import ControlLoop

    config = config_or_default(args.config)
    controller, parts, reloader = _controller(args, config)
    registry = None
    if args.metrics_port:
        from gpuscaler.observability import ControllerMetrics, HealthState, serve

        metrics = ControllerMetrics()
        metrics.attach(controller)
        if parts is not None:
            metrics.attach_cluster(parts)
        elif reloader is not None:
            metrics.attach_reloader(reloader)
        port, host = args.metrics_port, args.metrics_host
        serve(metrics, HealthState(controller, config.control.interval), port, host)
        print(f"serving /metrics, /healthz, /readyz on {host}:{port}", file=sys.stderr)
        registry = metrics.registry
    external = _serve_external_scaler(args, config, parts, registry)
    if parts is not None and parts.elector is not None:
        parts.elector.step()  # the first tick knows whether it leads
        parts.elector.start()
    try:
        ControlLoop(controller, config.control.interval, max_ticks=args.max_ticks).run()
    finally:
        if external is not None:
            external.stop()
        if parts is not None:
            parts.stop()  # releases the lease so a standby takes over at once
    return EXIT_OK if controller.stats.failed == 0 or controller.stats.ticks > 0 else EXIT_FAILURE


def add_controller_parsers(sub: Any) -> None:
    for name, func, help_text in (
        ("once", cmd_once, "run one control cycle and print the plan as JSON lines"),
        ("run", cmd_run, "run the control loop until SIGTERM/SIGINT"),
    ):
        p = cluster_parser(sub, name, help_text, func)
        p.add_argument("--dry-run", action="store_true", help="plan only, change nothing")
        state = "plan without a cluster: YAML of current fragments and floors"
        p.add_argument("--state", help=state)
        if name == "once":
            snapshot = (
                "plan (with --dry-run) against a `kubectl get <kinds> -A -o yaml` dump "
                "(the kinds: README, or the error a file without nodes and pods gets)"
            )
            p.add_argument("--cluster-snapshot", metavar="FILE", help=snapshot)
        if name == "run":
            p.add_argument("--max-ticks", type=int, default=None, help=argparse.SUPPRESS)
            lease = "act without a Lease (one replica only)"
            p.add_argument("--no-leader-election", action="store_true", help=lease)
            probes = "/metrics, /healthz, /readyz"
            p.add_argument("--metrics-port", type=int, default=8080, help=f"{probes} (0: off)")
            where = f"address to serve {probes} on (default: all, for probes)"
            p.add_argument("--metrics-host", default="0.0.0.0", help=where)
            keda = "KEDA external scaler gRPC port (default: external_scaler.port; 0: off)"
            p.add_argument("--external-scaler-port", type=int, default=None, help=keda)
