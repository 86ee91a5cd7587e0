"""A real Prometheus for the tests: Debian's `prometheus` binary on a free 127.0.0.1 port,
with data backfilled by `promtool tsdb create-blocks-from openmetrics`."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from controlplane import free_port as free_port  # re-exported: the tests import it from here
from controlplane import unavailable

STEP = 0.5

ValueAt = Callable[[int], float | None]
"""Sample i (0-based, 500 ms apart) of a planted series; None = no sample (a gap)."""


def binaries() -> tuple[str, str]:
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    if prom and tool:
        return prom, tool
    unavailable("Debian's prometheus package is not installed (apt-get install -y prometheus)")


def promtool_check(exposition: str) -> subprocess.CompletedProcess[str]:
    """`promtool check metrics` (Prometheus' lint of names, units and help) of an exposition."""
    tool = binaries()[1]
    args = [tool, "check", "metrics"]
    return subprocess.run(args, input=exposition, capture_output=True, text=True, timeout=60)


def planted_window(points: int, lag: float) -> tuple[float, float]:
    """(start, end) of `points` samples at STEP ending `lag` seconds before now: call it in
    the fixture that plants them, not at import, since a CLI under test plans at
    wall-clock time and other test modules may run for minutes in between."""
    end = math.floor(time.time()) - lag
    return end - (points - 1) * STEP, end


def _format(value: float) -> str:
    if value != value:  # NaN
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.4f}"


def write_openmetrics(
    path: Path, metrics: dict[str, list[tuple[dict[str, str], ValueAt]]], start: float, points: int
) -> None:
    """Samples of every planted series at start + i * 500 ms, families kept together."""
    with path.open("w", encoding="utf-8") as out:
        for name, series in metrics.items():
            out.write(f"# TYPE {name} gauge\n")
            for labels, value_at in series:
                label_text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                for i in range(points):
                    v = value_at(i)
                    if v is not None:
                        out.write(f"{name}{{{label_text}}} {_format(v)} {start + i * STEP:.3f}\n")
        out.write("# EOF\n")


@contextmanager
def prometheus(
    data: Path | None = None,
    scrape_target: str | None = None,
    rule_file: Path | None = None,
    port: int | None = None,
    blocks: Path | None = None,
    backfill_timeout: float = 120,
) -> Iterator[str]:
    """A running Prometheus (backfilled from the OpenMetrics file `data`, or scraping
    `scrape_target` every 500 ms); yields its URL, stops it and removes its data after."""
    prom, tool = binaries()
    root = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuscaler-prom-{os.getpid()}-{free_port()}"
    tsdb = root / "tsdb"
    tsdb.mkdir(parents=True)
    try:
        if data is not None:
            subprocess.run(
                [tool, "tsdb", "create-blocks-from", "openmetrics", str(data), str(tsdb)],
                check=True,
                capture_output=True,
                timeout=backfill_timeout,  # bench/tick.py backfills 10,000 GPUs
            )
        if blocks is not None:  # ready-made TSDB blocks (promtool create-blocks-from rules)
            for block in blocks.iterdir():
                if block.is_dir():
                    shutil.copytree(block, tsdb / block.name)
        config = root / "prometheus.yml"
        scrape = ""
        if scrape_target:
            scrape = (
                "scrape_configs:\n  - job_name: exporter\n    scrape_interval: 500ms\n"
                f"    scrape_timeout: 400ms\n    static_configs: [{{targets: ['{scrape_target}']}}]\n"
            )
        rules = f"rule_files: ['{rule_file}']\n" if rule_file else ""
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n" + rules + scrape
        )
        port = port or free_port()
        proc = subprocess.Popen(
            [
                prom,
                f"--config.file={config}",
                f"--storage.tsdb.path={tsdb}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=30d",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(root / "prometheus.log").open("w"),
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, proc, root / "prometheus.log")
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"prometheus not ready within {timeout:g}s: {log.read_text()[-2000:]}")


SHIPPED_RULE = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "prometheusrule.yaml"


def shipped_rules(directory: Path) -> Path:
    """The shipped PrometheusRule's groups as a plain Prometheus rule file in `directory`."""
    import yaml

    rule = yaml.safe_load(SHIPPED_RULE.read_text())
    path = directory / "gpuscaler-rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    return path
