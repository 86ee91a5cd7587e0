"""Transport: one HTTP GET of Prometheus' query API per query, its answer's `data.result`
parsed by orjson. Auth (bearer token file re-read on change, basic auth), TLS (CA,
client certificate, explicit insecure), a timeout per request, bounded retries with
backoff; every failure becomes a `SourceError` with every secret scrubbed from its
message.

Answers are asked for uncompressed unless `prometheus.compress_answers`: Prometheus gzips
whenever a request accepts it, which costs it more CPU than the transfer saves on a
cluster network or loopback; the answer is the same either way.
"""

from __future__ import annotations

import base64
import os
from typing import Any
from urllib.parse import urlsplit

import orjson
import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from gpuscaler.adapters.prometheus.promql import format_step
from gpuscaler.config import PrometheusConfig
from gpuscaler.errors import OutsideError

PLAIN = {"Accept-Encoding": "identity"}
"""The header that asks for an uncompressed answer."""


class SourceError(OutsideError):
    """A fetch that failed; the message is safe to log (no secrets)."""


class Transport:
    """Prometheus' HTTP API with auth, TLS, timeouts and retries; secrets never leak.
    Safe to share between threads (one connection pool of `max_concurrent_queries`)."""

    def __init__(self, cfg: PrometheusConfig):
        if cfg.url is None:
            raise ValueError("prometheus.url is not set")
        self.cfg = cfg
        self.url = cfg.url.rstrip("/")
        retry = Retry(
            total=cfg.retries,
            backoff_factor=cfg.backoff,
            status_forcelist=(500, 502, 503, 504),
            allowed_methods=("GET",),
            raise_on_status=False,
        )
        adapter = HTTPAdapter(max_retries=retry, pool_maxsize=max(10, cfg.max_concurrent_queries))
        self.session = requests.Session()
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.verify = not cfg.insecure_skip_verify
        if cfg.ca_file and not cfg.insecure_skip_verify:
            self.session.verify = cfg.ca_file
        if cfg.client_cert_file and cfg.client_key_file:
            self.session.cert = (cfg.client_cert_file, cfg.client_key_file)
        self.auth_headers: dict[str, str] = {}
        """The bearer token's header, when one is configured."""
        self.auth: tuple[str, str] | None = None
        """Basic auth, when configured."""
        self._token: tuple[float, str] | None = None
        self._secrets: set[str] = set()
        password = urlsplit(cfg.url).password
        if password:  # credentials in the URL itself are a secret like any other
            self._secrets.add(password)

    def _read_secret(self, path: str) -> str:
        try:
            with open(path, encoding="utf-8") as f:
                secret = f.read().strip()
        except OSError as e:
            raise SourceError(f"cannot read secret file {path}: {e.strerror}") from None
        if secret:
            self._secrets.add(secret)
        return secret

    def _authorize(self) -> None:
        cfg = self.cfg
        if cfg.bearer_token_file:
            try:
                mtime = os.stat(cfg.bearer_token_file).st_mtime
            except OSError as e:
                raise SourceError(f"cannot read bearer token file: {e.strerror}") from None
            if self._token is None or self._token[0] != mtime:  # rotated: read it again
                self._token = (mtime, self._read_secret(cfg.bearer_token_file))
            self.auth_headers = {"Authorization": f"Bearer {self._token[1]}"}
        if cfg.basic_auth_username and cfg.basic_auth_password_file:
            password = self._read_secret(cfg.basic_auth_password_file)
            self.auth = (cfg.basic_auth_username, password)
            # A server may echo the header back: its encoded form is a secret too.
            pair = f"{cfg.basic_auth_username}:{password}".encode()
            self._secrets.add(base64.b64encode(pair).decode())

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Any]:
        """A range query's `data.result`; start and end are sent in whole seconds."""
        params = {"query": query, "start": round(start), "end": round(end)}
        return self._get("query_range", params | {"step": format_step(step)})

    def query(self, query: str, time: float | None = None) -> list[Any]:
        """An instant query's `data.result`, at `time` when given."""
        params = {"query": query} | ({} if time is None else {"time": f"{time:.3f}"})
        return self._get("query", params)

    def _get(self, path: str, params: dict[str, Any]) -> list[Any]:
        """`data.result` of one request, every failure a SourceError without secrets."""
        self._authorize()
        headers = self.auth_headers if self.cfg.compress_answers else self.auth_headers | PLAIN
        try:
            answer = self.session.get(
                f"{self.url}/api/v1/{path}",
                params=params,
                headers=headers,
                auth=self.auth,
                timeout=self.cfg.timeout,
            )
        except requests.Timeout:
            raise SourceError(f"timed out after {self.cfg.timeout:g}s") from None
        except requests.ConnectionError as e:
            if "timed out" in str(e) or "Timeout" in str(e):  # a read timeout after retries
                raise SourceError(f"timed out after {self.cfg.timeout:g}s") from None
            raise SourceError(self.scrub(f"cannot connect: {type(e).__name__}")) from None
        except requests.RequestException as e:
            raise SourceError(self.scrub(f"request failed: {e}")) from None
        if answer.status_code != 200:
            text = f"HTTP Status Code {answer.status_code} ({answer.content[:200]!r})"
            raise SourceError(self.scrub(text)[:300])
        try:
            result: Any = orjson.loads(answer.content)["data"]["result"]
        except orjson.JSONDecodeError:
            raise SourceError("answer is not JSON") from None
        except (KeyError, TypeError):
            raise SourceError("answer is JSON of the wrong shape (no data.result)") from None
        return result  # type: ignore[no-any-return]
