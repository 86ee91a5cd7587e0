"""The Kubernetes API client every adapter uses, with the bounds every call needs: a
(connect, read) timeout on every call (the official client sets none), a per-thread
budget per tick (`begin_tick`; the Lease renewals' thread is not charged), and a
transport failure raised as an `ApiException` of status 0, so that one error path
(`api_error` -> `KubeError` naming the call) covers it. Objects travel as JSON
(`_preload_content=False`): the client's models reject objects they do not expect.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.errors import OutsideError

NO_ANSWER = 0
"""`ApiException.status` of a call that got no HTTP answer."""


class BoundedApiClient(client.ApiClient):
    def __init__(
        self,
        configuration: client.Configuration,
        connect_timeout: float = 5.0,
        read_timeout: float = 15.0,
        tick_budget: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__(configuration)
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.tick_budget = tick_budget
        self.clock = clock
        self._local = threading.local()

    def begin_tick(self) -> None:
        """Start the calling thread's API-time budget for one tick."""
        self._local.deadline = self.clock() + self.tick_budget

    def _timeouts(self) -> tuple[float, float]:
        connect, read = self.connect_timeout, self.read_timeout
        deadline: float | None = getattr(self._local, "deadline", None)
        if deadline is None:
            return connect, read
        left = deadline - self.clock()
        if left <= 0:
            raise ApiException(
                status=NO_ANSWER,
                reason=f"the tick's Kubernetes API time budget ({self.tick_budget:g}s) is spent",
            )
        return min(connect, left), min(read, left)

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = self._timeouts()
        try:
            return super().call_api(*args, **kwargs)
        except urllib3.exceptions.HTTPError as e:
            raise ApiException(status=NO_ANSWER, reason=_transport_reason(e)) from None


def _transport_reason(e: urllib3.exceptions.HTTPError) -> str:
    """What went wrong on the wire, without the URL's query or any header."""
    cause = getattr(e, "reason", None) or e
    # NewConnectionError subclasses ConnectTimeoutError in urllib3: ask for it first.
    if isinstance(cause, urllib3.exceptions.NewConnectionError | ConnectionError):
        return "cannot connect to the API server (connection refused or unreachable)"
    if isinstance(cause, urllib3.exceptions.TimeoutError | TimeoutError):
        return f"no answer from the API server in time ({type(cause).__name__})"
    return f"API server connection failed ({type(cause).__name__})"


class KubeError(OutsideError):
    """A Kubernetes API call that failed or was refused; the message names the object."""


def api_error(action: str, e: ApiException) -> KubeError:
    """With the server's message for a 403 (what RBAC lacks) or a 422 (the field refused)."""
    if e.status == NO_ANSWER:
        return KubeError(f"{action}: {e.reason}")
    message = f"{action}: HTTP {e.status} {e.reason}"
    if e.status in (403, 422):
        try:
            detail = json.loads(e.body or "{}").get("message")
        except (ValueError, AttributeError):
            detail = None
        if isinstance(detail, str) and detail:
            message += f": {detail[:300]}"
    return KubeError(message)


def written(action: str, call: Callable[[], Any]) -> bool:
    """True when the write went through, False on a conflict (409: read again and retry);
    any other failure a KubeError naming `action`."""
    try:
        call()
    except ApiException as e:
        if e.status == 409:
            return False
        raise api_error(action, e) from None
    return True


def json_body(response: Any) -> dict[str, Any]:
    data = response if isinstance(response, dict) else json.loads(response.data)
    if not isinstance(data, dict):
        raise KubeError("answer is not a JSON object")
    return data


def read_json(action: str, call: Callable[[], Any]) -> dict[str, Any]:
    """One object, as JSON; API errors become KubeError naming `action`."""
    try:
        return json_body(call())
    except ApiException as e:
        raise api_error(action, e) from None
