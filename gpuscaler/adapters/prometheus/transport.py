"""Transport: auth (bearer token file re-read on change, basic auth), TLS (CA, client
certificate, explicit insecure), timeouts, bounded retries with backoff; errors become
`SourceError` with every secret scrubbed from the message.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from gpuscaler.adapters.prometheus.promql import format_step
from gpuscaler.config import PrometheusConfig
from gpuscaler.errors import OutsideError


class SourceError(OutsideError):
    """A fetch that failed; the message is safe to log (no secrets)."""


# --------------------------------------------------------------------------- transport


class Transport:
    """prometheus-api-client with auth, TLS, timeouts and retries; secrets never leak."""

    def __init__(self, cfg: PrometheusConfig):
        if cfg.url is None:
            raise ValueError("prometheus.url is not set")
        self.cfg = cfg
        retry = Retry(
            total=cfg.retries,
            backoff_factor=cfg.backoff,
            status_forcelist=(500, 502, 503, 504),
            allowed_methods=("GET",),
            raise_on_status=False,
        )
        self.client = PrometheusConnect(
            url=cfg.url.rstrip("/"),
            disable_ssl=cfg.insecure_skip_verify,
            retry=retry,
            timeout=cfg.timeout,
        )
        session = self.client._session
        if cfg.ca_file and not cfg.insecure_skip_verify:
            session.verify = cfg.ca_file
        if cfg.client_cert_file and cfg.client_key_file:
            session.cert = (cfg.client_cert_file, cfg.client_key_file)
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
            self.client.headers = {"Authorization": f"Bearer {self._token[1]}"}
        if cfg.basic_auth_username and cfg.basic_auth_password_file:
            password = self._read_secret(cfg.basic_auth_password_file)
            self.client.auth = (cfg.basic_auth_username, password)
            # A server may echo the header back: its encoded form is a secret too.
            pair = f"{cfg.basic_auth_username}:{password}".encode()
            self._secrets.add(base64.b64encode(pair).decode())

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Any]:
        return self._call(
            lambda: self.client.custom_query_range(
                query,
                start_time=datetime.fromtimestamp(start, UTC),
                end_time=datetime.fromtimestamp(end, UTC),
                step=format_step(step),
            )
        )

    def query(self, query: str, time: float | None = None) -> list[Any]:
        """An instant query, at `time` when given (the scheduler extender's grouped
        GPU-memory read; the tick's newest frame-buffer figures)."""
        params = {} if time is None else {"time": f"{time:.3f}"}
        return self._call(lambda: self.client.custom_query(query, params=params))

    def _call(self, request: Callable[[], Any]) -> list[Any]:
        """`data.result` of one request, every failure a SourceError without secrets."""
        self._authorize()
        try:
            result: Any = request()
        except requests.exceptions.JSONDecodeError:
            raise SourceError("answer is not JSON") from None
        except requests.Timeout:
            raise SourceError(f"timed out after {self.cfg.timeout:g}s") from None
        except requests.ConnectionError as e:
            if "timed out" in str(e) or "Timeout" in str(e):  # a read timeout after retries
                raise SourceError(f"timed out after {self.cfg.timeout:g}s") from None
            raise SourceError(self.scrub(f"cannot connect: {type(e).__name__}")) from None
        except requests.RequestException as e:
            raise SourceError(self.scrub(f"request failed: {e}")) from None
        except PrometheusApiClientException as e:
            raise SourceError(self.scrub(str(e))[:300]) from None
        except ValueError:
            raise SourceError("answer is not JSON") from None
        except (KeyError, TypeError):
            raise SourceError("answer is JSON of the wrong shape (no data.result)") from None
        return result  # type: ignore[no-any-return]
