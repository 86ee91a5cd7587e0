"""One kind of Kubernetes object kept current by list-then-watch, as client-go's reflector
does it (tools/cache/reflector.go): list in pages, watch from the list's resourceVersion
(bookmarks on), open a closed watch again from the last version seen, relist on 410
Gone, retry any other failure with jittered exponential backoff; a resource the server
does not serve (a CRD not installed) is an empty store, looked for again now and then.
Each object passes through `transform` once as it arrives (None drops it).

`items()` never waits on the network: it raises `CacheUnavailable` when the store is not
synced yet or disconnected longer than `stale_after`, so a tick never acts on a stale
picture of the cluster.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.adapters.kube.api import api_error
from gpuscaler.config import KubernetesConfig

log = logging.getLogger("gpuscaler.kubernetes.watch")

Json = dict[str, Any]

PAGE = 500
"""Objects per list page (client-go's pager default)."""
BACKOFF = (0.8, 30.0)
"""First and longest wait between failed attempts (client-go's reflector)."""
ABSENT_RETRY = 60.0
"""Installing KEDA is picked up within a minute, without a restart."""
SHORT_WATCH = 1.0
"""A watch ending sooner than this without an event is a failure (backoff), so a server
closing every watch at once is not hammered."""


class Gone(Exception):
    """410: the resourceVersion is too old (compacted); only a relist helps."""


class CacheUnavailable(Exception):
    """The store cannot be trusted now: not synced yet, or disconnected too long."""


@dataclass(frozen=True)
class Resource:
    """What to list and watch: a collection path and its field and label selectors."""

    kind: str
    path: str
    field_selector: str | None = None
    label_selector: str | None = None

    def params(self, **extra: Any) -> list[tuple[str, str]]:
        params = [("fieldSelector", self.field_selector)] if self.field_selector else []
        params += [("labelSelector", self.label_selector)] if self.label_selector else []
        return params + [(k, str(v)) for k, v in extra.items() if v is not None]


def object_key(obj: Json) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def slim(obj: Json) -> Json:
    """The object without managedFields (often half its size)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


class Informer:
    """The objects of one `Resource`, kept current by a background thread."""

    def __init__(
        self,
        api: client.ApiClient,
        resource: Resource,
        transform: Callable[[Json], Any] = slim,
        limits: KubernetesConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.api = api
        self.resource = resource
        self.transform = transform
        self.limits = limits or KubernetesConfig()
        self.clock = clock
        self._store: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None
        self._phase = "list"
        self.synced = threading.Event()
        self.tried = threading.Event()
        """Set after the first list attempt, good or failed: a reader waits for this."""
        self.resource_version: str | None = None
        self.absent = False
        """The server does not serve this resource (404 on list)."""
        self.disconnected_since: float | None = None
        self.last_error: str | None = None
        self.lists = self.watches = self.gone = 0
        """Lists (the first and each relist), watches opened, 410 Gone answers."""

    def items(self) -> list[Any]:
        if not self.synced.is_set():
            why = f": {self.last_error}" if self.last_error else ""
            raise CacheUnavailable(f"{self.resource.kind}: not listed yet{why}")
        since = self.disconnected_since
        stale_after = self.limits.watch_stale_after
        if since is not None and self.clock() - since > stale_after:
            raise CacheUnavailable(
                f"{self.resource.kind}: watch down for {self.clock() - since:.0f}s "
                f"(over {stale_after:g}s): {self.last_error}"
            )
        with self._lock:
            return list(self._store.values())

    def start(self) -> Informer:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"watch-{self.resource.kind}", daemon=True
            )
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.halt()
        if self._thread is not None:
            self._thread.join(timeout)

    def halt(self) -> None:
        """Ask the thread to end, shutting an open watch, without waiting for it."""
        self._stop.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()  # urllib3 >= 2.3: unblocks a read in another thread
            except Exception as e:
                log.debug("%s: watch not shut: %s", self.resource.kind, e)

    def _run(self) -> None:
        delay = BACKOFF[0]
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self._list()
                if self.absent:
                    self._stop.wait(ABSENT_RETRY)
                    self.resource_version = None
                    continue
                if self._watch():
                    delay = BACKOFF[0]
                    continue
                self._failed("watch closed at once by the server")
            except Gone:
                log.info("%s: resourceVersion too old (410): relisting", self.resource.kind)
                self.resource_version = None
                self.gone += 1
                continue
            except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as e:
                self._failed(self._reason(e))
            if self._stop.wait(delay * random.uniform(0.8, 1.2)):
                break
            delay = min(BACKOFF[1], delay * 2)

    def _failed(self, reason: str) -> None:
        if self._stop.is_set():
            return
        first = self.disconnected_since is None
        if first:
            self.disconnected_since = self.clock()
        self.last_error = reason
        self.tried.set()
        # Before the first list the reader reports the error; after it, a streak's first
        # failure is worth a warning, its retries are not.
        log.log(
            logging.WARNING if first and self.synced.is_set() else logging.DEBUG,
            "%s: list/watch failed, retrying with backoff: %s",
            self.resource.kind,
            reason,
            extra={"event": "watch_failed", "kind": self.resource.kind},
        )

    def _reason(self, e: Exception) -> str:
        if isinstance(e, ApiException):
            return str(api_error(f"{self._phase} {self.resource.kind}", e))
        return f"{type(e).__name__}: {e}"[:300]

    def _get(self, query: list[tuple[str, str]], read_timeout: float) -> Any:
        """GET on the collection: the urllib3 response, unread; 410 raised as Gone (a list
        page's continue token or a watch's resourceVersion expired: only a relist helps),
        another error status as an ApiException, as the generated API methods do."""
        method, url, headers, body, post = self.api.param_serialize(
            method="GET",
            resource_path=self.resource.path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        answer = self.api.call_api(
            method,
            url,
            header_params=headers,
            body=body,
            post_params=post,
            _request_timeout=(self.limits.connect_timeout, read_timeout),
        )
        response = answer.response
        if answer.status == 410:
            raise Gone()
        if not 200 <= answer.status < 300:
            error = ApiException(status=answer.status, reason=answer.reason)
            error.body = response.data  # the server's Status: _api_error quotes its message
            raise error
        return response

    def _list(self) -> None:
        self._phase = "list"
        store: dict[str, Any] = {}
        token: str | None = None
        version = ""
        while True:
            try:
                answer = self._get(
                    self.resource.params(limit=PAGE, **{"continue": token}),
                    self.limits.read_timeout,
                )
            except ApiException as e:
                if e.status == 404:
                    self._replace({}, None, absent=True)
                    return
                raise
            page = orjson.loads(answer.data)
            for obj in page.get("items") or ():
                value = self.transform(obj)
                if value is not None:
                    store[object_key(obj)] = value
            meta = page.get("metadata") or {}
            version = str(meta.get("resourceVersion") or "")
            token = meta.get("continue") or None
            if token is None:
                break
        self._replace(store, version, absent=False)

    def _replace(self, store: dict[str, Any], version: str | None, absent: bool) -> None:
        with self._lock:
            self._store = store
        self.resource_version = version
        self.absent = absent
        self.lists += 1
        self.disconnected_since = None
        self.last_error = None
        self.synced.set()
        self.tried.set()

    def _watch(self) -> bool:
        """Watch until the server closes the stream; True at a normal end."""
        opened = self.clock()
        self._phase = "watch"
        timeout = self.limits.watch_timeout
        response = self._get(
            self.resource.params(
                watch="true",
                resourceVersion=self.resource_version,
                allowWatchBookmarks="true",
                timeoutSeconds=max(1, round(timeout)),
            ),
            timeout + 15.0,  # the server ends it first; this catches a hung one
        )
        self._response = response
        if self._stop.is_set():  # halted while opening: halt() may have missed it
            response.release_conn()
            return True
        self.watches += 1
        self.disconnected_since = None
        self.last_error = None
        events = 0
        try:
            for line in _lines(response):
                self._apply(orjson.loads(line))
                events += 1
        finally:
            self._response = None
            response.release_conn()
        return events > 0 or self.clock() - opened >= SHORT_WATCH

    def _apply(self, event: Json) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise ValueError(f"watch error {obj.get('code')}: {obj.get('message')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            value = self.transform(obj) if kind != "DELETED" else None
            with self._lock:
                if value is None:
                    self._store.pop(object_key(obj), None)
                else:
                    self._store[object_key(obj)] = value
        elif kind != "BOOKMARK":
            raise ValueError(f"unknown watch event type {kind!r}")
        if version:
            self.resource_version = str(version)


def _lines(response: Any) -> Iterator[bytes]:
    """The newline-separated JSON events of a watch as they arrive."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield line
    if pending.strip():
        yield pending
