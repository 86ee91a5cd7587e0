"""Every entry point as a user starts it: the installed `gpuscaler` console script in a
fresh process, with the arguments the Deployment, the image and the README give it.

`gpuscaler run`, the image's command, once crashed at start-up while every test that drove
the controller from inside the test process passed. These tests start the program the way
it is deployed instead.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import http_get
from controlplane import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config" / "gpuscaler.yaml"
SCRIPT = Path(sys.executable).parent / "gpuscaler"
COMMANDS = ("validate-config", "simulate", "backtest", "once", "run", "agent", "extender")


def _deployment_container() -> dict[str, Any]:
    docs = yaml.safe_load_all((ROOT / "deploy" / "deployment.yaml").read_text())
    deployment = next(d for d in docs if d and d.get("kind") == "Deployment")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    container["_grace"] = deployment["spec"]["template"]["spec"].get(
        "terminationGracePeriodSeconds", 30
    )
    return container


def _dockerfile_command() -> list[str]:
    """ENTRYPOINT + CMD of the image, both in exec form."""
    parts: dict[str, list[str]] = {}
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        m = re.match(r"(ENTRYPOINT|CMD)\s+(\[.*\])\s*$", line)
        if m:
            parts[m.group(1)] = json.loads(m.group(2))
    return parts["ENTRYPOINT"] + parts["CMD"]


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


@pytest.fixture
def deployed_run() -> Iterator[tuple[subprocess.Popen[str], int, dict[str, Any]]]:
    """`gpuscaler run` with the Deployment's own arguments: only the config path (mounted
    from a ConfigMap in the pod) points at the shipped config, and the port is a free one."""
    container = _deployment_container()
    args: list[str] = list(container["args"])
    args[args.index("--config") + 1] = str(CONFIG)
    port = free_port()
    args[args.index("--metrics-port") + 1] = str(port)
    env = os.environ | {"POD_NAME": "gpuscaler-test", "POD_NAMESPACE": "gpuscaler"}
    proc = subprocess.Popen(
        [str(SCRIPT), *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )  # fmt: skip
    try:
        yield proc, port, container
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_the_console_script_is_installed_where_the_image_puts_it_on_path() -> None:
    assert SCRIPT.is_file(), f"{SCRIPT} missing: is the package installed (pip install -e .)?"
    assert _dockerfile_command()[0] == "gpuscaler"


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_every_command_answers_help_with_exit_0(command: str) -> None:
    out = _cli(*([command] if command else []), "--help", timeout=60)
    assert out.returncode == 0, out.stderr
    assert "usage: gpuscaler" in out.stdout


def test_the_deployment_and_image_arguments_are_accepted_by_the_parser() -> None:
    from gpuscaler.cli import build_parser

    for argv in (_deployment_container()["args"], _dockerfile_command()[1:]):
        args = build_parser().parse_args(argv)
        assert args.command == "run"
        assert args.metrics_port == 8080
        assert args.metrics_host == "0.0.0.0"  # the kubelet probes the pod IP, not loopback


def test_run_as_the_deployment_starts_it_serves_its_probes_and_stops_cleanly_on_sigterm(
    deployed_run: tuple[subprocess.Popen[str], int, dict[str, Any]],
) -> None:
    proc, port, container = deployed_run
    probes = {
        container[p]["httpGet"]["path"]: container[p]["httpGet"]["port"]
        for p in ("readinessProbe", "livenessProbe")
    }
    named_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert set(probes) == {"/readyz", "/healthz"}
    assert {named_ports[p] for p in probes.values()} == {8080}  # the --metrics-port given

    base = f"http://127.0.0.1:{port}"
    wait_until("/readyz answers 200", lambda: http_get(base + "/readyz")[0] == 200, 60)
    assert http_get(base + "/healthz")[0] == 200
    status, metrics = http_get(base + "/metrics")
    assert status == 200
    assert re.search(r"^gpuscaler_ticks_total\S* [1-9]", metrics, re.M) or re.search(
        r"^gpuscaler_tick_duration_seconds_count\S* [1-9]", metrics, re.M
    ), metrics[:2000]

    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=container["_grace"])
    assert proc.returncode == 0, stderr[-2000:]
    assert time.monotonic() - started < container["_grace"]
    assert "Traceback" not in stderr
    assert '"event": "stopped"' in stderr


def test_once_with_the_shipped_config_prints_the_plan_as_json_lines() -> None:
    out = _cli("once", "--config", str(CONFIG), "--dry-run")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert lines, "a plan names at least one target, as a decision or a skip"
    assert all("reason" in line for line in lines)
    assert all(line.get("outcome") in (None, "dry_run") for line in lines)


def _readme_usage() -> dict[str, set[str]]:
    """The flags each command shows in the README's 'Command line' block."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Command line", 1)[1].split("```", 2)[1]
    flags: dict[str, set[str]] = {}
    command = ""
    for line in block.splitlines():
        words = shlex.split(line.replace("[", " ").replace("]", " ").replace("|", " "))
        if words[:1] == ["gpuscaler"]:
            command = words[1]
        flags.setdefault(command, set()).update(w for w in words if w.startswith("--"))
    return flags


def test_every_flag_the_readme_shows_is_one_the_command_accepts() -> None:
    usage = _readme_usage()
    assert set(COMMANDS) <= set(usage), usage.keys()
    for command, flags in usage.items():
        helptext = _cli(command, "--help", timeout=60).stdout
        missing = sorted(f for f in flags if f not in helptext)
        assert not missing, f"README shows {missing} for `gpuscaler {command}`"
