"""What the benches that run gpuscaler against a real Prometheus share: the synthetic
cluster's config, the controller's source, the measurements of a process (its peak RSS,
Prometheus' CPU) and another git revision's `gpuscaler` as a baseline in the same run.

The benches import the test suite's real-Prometheus fixture (tests/promserver.py) through
`PROMSERVER`'s path, inserted here once."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # promserver: the tests' real Prometheus

HASH = "7d4f8b9c6"
"""The pod-template hash of the synthetic Deployments' pod names."""


class NoActuator:
    """Applies nothing: the benches time the reads, the forecast and the plan."""

    def apply(self, decisions: object) -> tuple[()]:
        return ()


def cluster_config(url: str, pools: int, workloads: int, prometheus: str = "") -> str:
    """A config of `pools` node pools (pool-P by `modelName`) and `workloads` workloads
    (w<W> in namespace w<W>), dry-run, everything else at its default but the
    `prometheus` settings given (YAML flow mapping entries, e.g. "grouped_queries: false")."""
    lines = [
        f'prometheus: {{url: "{url}", timeout: 60s, {prometheus}}}',
        "control: {dry_run: true}",
        "node_pools:",
        *(
            f"  - {{name: pool-{p}, selector: {{label: pool, value: p{p}}}, "
            f"gpu_memory_gib: 80, initial_fragments: 2, metrics_matchers: {{modelName: pool-{p}}}}}"
            for p in range(pools)
        ),
        "workloads:",
        *(f"  - {{namespace: w{w}, kind: ScaledObject, name: w{w}}}" for w in range(workloads)),
    ]
    return "\n".join(lines) + "\n"


def window_seconds() -> float:
    """The default config's metrics window: the history the forecaster sees."""
    from gpuscaler.config import Config

    return float(Config().metrics.window)


def controller(config_text: str) -> tuple[Any, Any]:
    """(a dry-run controller reading `config_text`'s Prometheus as the program does by
    default, with grouped queries, and a fixed, empty cluster state; its source)."""
    from gpuscaler.adapters.kube.objects import CurrentState
    from gpuscaler.config import parse_config
    from gpuscaler.controller import Controller
    from gpuscaler.sources import PrometheusSource

    config = parse_config(config_text)
    source = PrometheusSource(config, CurrentState())
    return Controller(config, source, NoActuator(), dry_run=True, log_decisions=False), source


def wait_backfill(source: Any) -> None:
    """Waits until `source` has read the older part of its first window, which it fetches
    behind the ticks (written into the windows at the next tick)."""
    if not source.backfill.wait(timeout=600):
        raise SystemExit("the backfill of the first window took over 10 minutes")


def rss_mb(field: str = "VmHWM") -> float:
    """This process' peak resident set (VmHWM), or another field of /proc/self/status
    (VmRSS: the resident set now), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def prometheus_cpu(url: str) -> float:
    """Prometheus' own CPU seconds (`process_cpu_seconds_total`, all its threads)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=60) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("process_cpu_seconds_total "):
                return float(line.split()[1])
    raise RuntimeError("Prometheus exports no process_cpu_seconds_total")


def unpack(revision: str, dest: Path) -> None:
    """Extract `revision`'s gpuscaler/ into `dest` (git archive | tar)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "gpuscaler"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def env_for(tree: Path) -> dict[str, str]:
    """This environment with `tree`'s gpuscaler first on the import path, and BLAS on one
    thread (a BLAS thread pool spinning on 2 shared cores inflates CPU time)."""
    return {
        **os.environ,
        "PYTHONPATH": str(tree),
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }
