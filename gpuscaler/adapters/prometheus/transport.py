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
import json
import os
import re
from typing import Any
from urllib.parse import quote, quote_plus, unquote, urlsplit

import orjson
import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from gpuscaler.adapters.prometheus.promql import format_step
from gpuscaler.config import PrometheusConfig
from gpuscaler.errors import OutsideError

PLAIN = {"Accept-Encoding": "identity"}
"""The header that asks for an uncompressed answer."""
TOKEN = re.compile(r"[\x21-\x7e]+")
"""A bearer token an HTTP header can carry: printable ASCII, no space."""
MAX_SECRET_BYTES = 64 << 10
"""A token or password file is read up to this (a projected token is about 1 KB)."""


class SourceError(OutsideError):
    """A fetch that failed; the message is safe to log (no secrets)."""


class Transport:
    """Safe to share between threads (one connection pool of `max_concurrent_queries`).

    The Authorization header is built here, from the URL's userinfo (which is then cut
    from the URL requests sees), the password file or the token file, and every form of
    each credential is kept for `scrub`. A message is written from the status code and
    the URL, never from an HTTP library's exception text, which may quote the header."""

    def __init__(self, cfg: PrometheusConfig):
        if cfg.url is None:
            raise ValueError("prometheus.url is not set")
        self.cfg = cfg
        parts = urlsplit(cfg.url)
        self.url = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl().rstrip("/")
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
        """The Authorization header, when a credential is configured."""
        self._token: tuple[float, str] | None = None
        self._secrets: list[str] = []
        if parts.username is not None or parts.password is not None:
            self._keep(parts.password or "")  # as written, %-encoded
            self._basic(unquote(parts.username or ""), unquote(parts.password or ""))

    def _keep(self, *secrets: str) -> None:
        """Remember every form in which `secrets` may appear in a message, longest first."""
        for s in secrets:
            self._secrets += (
                s,
                repr(s)[1:-1],
                json.dumps(s)[1:-1],
                s.encode("unicode_escape").decode(),
                repr(s.encode())[2:-1],
                quote(s, safe=""),
                quote_plus(s),
            )
        self._secrets = sorted({s for s in self._secrets if s}, key=len, reverse=True)

    def _basic(self, user: str, password: str) -> None:
        encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
        self._keep(password, f"{user}:{password}", encoded)
        self.auth_headers = {"Authorization": f"Basic {encoded}"}

    def _read_secret(self, path: str) -> str:
        try:
            with open(path, encoding="utf-8", newline="") as f:  # a secret as written
                raw = f.read(MAX_SECRET_BYTES)
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) else "not UTF-8"
            raise SourceError(f"cannot read secret file {path}: {why}") from None
        self._keep(raw, raw.strip())
        return raw.strip()

    def _authorize(self) -> None:
        cfg = self.cfg
        if cfg.bearer_token_file:
            try:
                mtime = os.stat(cfg.bearer_token_file).st_mtime
            except OSError as e:
                raise SourceError(f"cannot read bearer token file: {e.strerror}") from None
            if self._token is None or self._token[0] != mtime:  # rotated: read it again
                self._token = (mtime, self._read_secret(cfg.bearer_token_file))
            if not TOKEN.fullmatch(self._token[1]):
                raise SourceError(
                    f"bearer token file {cfg.bearer_token_file}: the token holds a character "
                    "an HTTP header cannot carry (a space or newline inside it, a control or "
                    "non-ASCII character)"
                )
            self.auth_headers = {"Authorization": f"Bearer {self._token[1]}"}
        if cfg.basic_auth_username and cfg.basic_auth_password_file:
            password = self._read_secret(cfg.basic_auth_password_file)
            self._basic(cfg.basic_auth_username, password)

    def scrub(self, text: str) -> str:
        """`text` with every form of every credential replaced by ***."""
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
                timeout=self.cfg.timeout,
            )
        except requests.Timeout:
            raise SourceError(f"timed out after {self.cfg.timeout:g}s") from None
        except requests.ConnectionError as e:
            if "timed out" in str(e) or "Timeout" in str(e):  # a read timeout after retries
                raise SourceError(f"timed out after {self.cfg.timeout:g}s") from None
            raise SourceError(f"cannot connect to {self.url}: {type(e).__name__}") from None
        except requests.RequestException as e:
            raise SourceError(f"request to {self.url} failed: {type(e).__name__}") from None
        if answer.status_code != 200:
            raise SourceError(
                f"HTTP {answer.status_code} from {self.url}/api/v1/{path}"
                + self._said(answer.content)
            )
        try:
            result: Any = orjson.loads(answer.content)["data"]["result"]
        except orjson.JSONDecodeError:
            raise SourceError("answer is not JSON") from None
        except (KeyError, TypeError):
            raise SourceError("answer is JSON of the wrong shape (no data.result)") from None
        return result  # type: ignore[no-any-return]

    def _said(self, body: bytes) -> str:
        """Prometheus' own error of a refused query (JSON `error`), scrubbed, then cut."""
        try:
            error = orjson.loads(body).get("error")
        except (orjson.JSONDecodeError, AttributeError):
            return ""
        return f": {self.scrub(error)[:200]}" if isinstance(error, str) else ""
