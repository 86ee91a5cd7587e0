"""No credential, in any form, reaches an output channel. A real HTTP server answers 401
and echoes the Authorization header it got, and the user:password it decodes from it,
repr-escaped, in Prometheus' JSON error; each channel is searched for the credential.
Every generated credential holds MARK, which survives every escaping (repr, JSON,
%-encoding) but base64, searched for on its own."""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from builders import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubefake import reply, serving

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.adapters.prometheus.transport import SourceError, Transport
from gpuscaler.config import ConfigError, parse_config
from gpuscaler.controller import Controller
from gpuscaler.controller.assembly import NoActuator
from gpuscaler.observability import ControllerMetrics
from gpuscaler.sources import PrometheusSource

MARK = "Zq7s3cr3t"
TARGETS = """node_pools:
  - {name: p, selector: {label: a, value: b}, gpu_memory_gib: 80, metrics_matchers: {Hostname: n}}
workloads:
  - {namespace: ml, kind: ScaledObject, name: chat}
"""


class _Echo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if "query=vector" in self.path:  # whatif's probe passes; every read is refused
            data = {"resultType": "vector", "result": [{"metric": {}, "value": [1, "1"]}]}
            reply(self, 200, json.dumps({"status": "success", "data": data}).encode(), {})
            return
        header = self.headers.get("Authorization", "")
        decoded = ""
        if header.startswith("Basic "):
            decoded = base64.b64decode(header[6:]).decode("utf-8", "replace")
        error = f"unauthorized: {header} {header!r} {decoded} {decoded!r}"
        body = json.dumps({"status": "error", "errorType": "auth", "error": error})
        reply(self, 401, body.encode(), {"Content-Type": "application/json"})

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    with serving(_Echo) as url:
        yield url


def _config(url: str, kind: str, secret: str, file: Path, extra: str = "") -> str:
    auth = ""
    if kind == "url":
        url = url.replace("://", f"://ops:{quote(secret, safe='')}@")
    else:
        file.write_text(secret + "\n", encoding="utf-8")
        key = "bearer_token_file" if kind.startswith("bearer") else "basic_auth_password_file"
        auth = f", {key}: {file}" + (", basic_auth_username: ops" if kind == "basic" else "")
    prometheus = f"url: {json.dumps(url)}, retries: 0, background_backfill: false{auth}{extra}"
    return f"prometheus: {{{prometheus}}}\nreplicas: {{skill_check: false}}\n{TARGETS}"


def _leaks(text: str, secret: str) -> list[str]:
    encoded = {base64.b64encode(f"ops:{s}".encode()).decode() for s in (secret, secret.strip())}
    return [form for form in (MARK, *encoded) if form in text]


AWKWARD = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=8),  # a header's
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["url", "basic", "bearer"]),
    st.builds(lambda a, b: a + MARK + b, AWKWARD, AWKWARD),
)
def test_no_form_of_a_credential_reaches_an_error_a_skip_reason_or_a_log(
    echo: str, tmp_path_factory: pytest.TempPathFactory, kind: str, secret: str
) -> None:
    file = tmp_path_factory.mktemp("cred") / "secret"
    config = parse_config(_config(echo, kind, secret, file))
    with pytest.raises(SourceError) as error:
        Transport(config.prometheus).query_range("up", 0, 60, 10)
    records: list[str] = []

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(logging.Formatter().format(record))

    handler = Kept()
    logging.getLogger().addHandler(handler)
    try:
        state = CurrentState(fragments={"p": 1})
        observed = PrometheusSource(config, state).observe(time.time())
    finally:
        logging.getLogger().removeHandler(handler)
    problems = [t.problem or "" for t in observed.pools] + [
        t.problem or "" for t in observed.workloads
    ]
    refused = ""  # the ConfigRefused Event's note is the problems of a refused config
    if kind == "url":
        with pytest.raises(ConfigError) as bad:
            parse_config(_config(echo.replace("http", "ftp"), kind, secret, file))
        refused = str(bad.value)
    said = "\n".join([str(error.value), *problems, *records, refused])
    assert not _leaks(said, secret), said
    assert "401" in str(error.value) or "cannot carry" in str(error.value)
    assert all(problems)


@pytest.mark.parametrize(
    ("kind", "secret"),
    [
        ("url", f"p@ss:w/rd \"q'\\ ü☃\n{MARK}"),
        ("basic", f"p@ss:w/rd \"q'\\ ü☃\t{MARK} "),
        ("bearer", f"tok-{MARK}~+/="),
        ("bearer with a newline inside", f"tok\n{MARK}"),
    ],
)
def test_no_credential_reaches_once_whatif_or_the_metrics(
    echo: str, tmp_path: Path, kind: str, secret: str
) -> None:
    config = tmp_path / "gpuscaler.yaml"
    config.write_text(_config(echo, kind, secret, tmp_path / "secret"), encoding="utf-8")
    once = run_cli("once", "--config", str(config), "--dry-run", "--state", "/dev/null")
    report = tmp_path / "report"
    whatif = run_cli("whatif", "--config", str(config), "--since", "1h", "--report", str(report))
    parsed = parse_config(config.read_text(encoding="utf-8"))
    controller = Controller(
        parsed, PrometheusSource(parsed, CurrentState(fragments={"p": 1})), NoActuator()
    )
    metrics = ControllerMetrics()
    metrics.attach(controller)
    controller.tick(time.time())
    exposition = metrics.exposition().decode()
    assert once.returncode == 0, once.stderr
    why = "cannot carry" if "newline" in kind else "HTTP 401"
    assert why in once.stdout and why in whatif.stdout + whatif.stderr
    written = [f.read_text(errors="replace") for f in report.rglob("*") if f.is_file()]
    for text in (once.stdout, once.stderr, whatif.stdout, whatif.stderr, exposition, *written):
        assert not _leaks(text, secret), text
