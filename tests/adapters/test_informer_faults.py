"""Informer faults a real API server does not give on demand (garbage on a watch, an
ERROR event, a 500 on list), from a scripted HTTP server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from kubefake import reply, serving
from kubernetes import client

from gpuscaler.adapters.kube import informer as informer_module
from gpuscaler.adapters.kube.informer import CacheUnavailable, Informer, Resource
from gpuscaler.config import KubernetesConfig


def _node(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}}


def _list(*names: str, version: str = "10") -> tuple[int, bytes]:
    items = [_node(n, version) for n in names]
    return 200, json.dumps({"metadata": {"resourceVersion": version}, "items": items}).encode()


def _events(*events: Any) -> tuple[int, bytes]:
    return 200, b"".join(
        (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n" for e in events
    )


class Script:
    """Answers for list and watch requests, in order; the last one repeats."""

    def __init__(self, lists: list[tuple[int, bytes]], watches: list[tuple[int, bytes]]):
        self.lists, self.watches = lists, watches
        self.seen: list[str] = []

    def answer(self, path: str) -> tuple[int, bytes]:
        self.seen.append(path)
        queue = self.watches if "watch=true" in path else self.lists
        return queue.pop(0) if len(queue) > 1 else queue[0]


@pytest.fixture
def serve() -> Iterator[Any]:
    with ExitStack() as servers:

        def start(script: Script) -> str:
            class Handler(BaseHTTPRequestHandler):
                def do_GET(self) -> None:
                    status, body = script.answer(self.path)
                    reply(self, status, body, {"Content-Type": "application/json"})

                def log_message(self, *args: Any) -> None:
                    pass

            return servers.enter_context(serving(Handler))

        yield start


def _informer(url: str, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Informer:
    monkeypatch.setattr(informer_module, "BACKOFF", (0.05, 0.2))  # seconds, not minutes
    api = client.ApiClient(client.Configuration(host=url))
    return Informer(api, Resource("Node", "/api/v1/nodes"), **kw).start()


def _until(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.02)


def _names(informer: Informer) -> set[str]:
    return {o["metadata"]["name"] for o in informer.items()}


@pytest.mark.parametrize(
    "bad_watch",
    [
        _events(b"{not json"),
        _events({"type": "ERROR", "object": {"code": 500, "message": "etcd is sad"}}),
        _events({"type": "SURPRISE", "object": _node("x", "11")}),
        (500, b'{"message": "internal"}'),
    ],
    ids=["garbage", "error-500", "unknown-type", "http-500"],
)
def test_a_broken_watch_is_retried_and_the_next_good_one_is_applied(
    serve: Any, monkeypatch: pytest.MonkeyPatch, bad_watch: tuple[int, bytes]
) -> None:
    good = _events({"type": "ADDED", "object": _node("b", "12")})
    script = Script([_list("a")], [bad_watch, good])
    informer = _informer(serve(script), monkeypatch)
    try:
        _until(lambda: informer.synced.is_set() and _names(informer) == {"a", "b"})
        assert informer.lists == 1  # only 410 relists
        assert any("resourceVersion=10" in p and "watch=true" in p for p in script.seen)
    finally:
        informer.stop()


def test_a_failing_list_is_retried_and_reported_until_it_succeeds(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script([(500, b'{"message": "no"}'), (500, b"{}"), _list("a")], [_events()])
    informer = _informer(serve(script), monkeypatch)
    try:
        _until(informer.tried.is_set)
        _until(informer.synced.is_set)
        assert _names(informer) == {"a"}
        assert sum("watch=true" not in p for p in script.seen) >= 3
    finally:
        informer.stop()


def test_a_cache_whose_watch_keeps_failing_is_refused_after_stale_after(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script([_list("a")], [(500, b"{}")])
    limits = KubernetesConfig(watch_stale_after="300ms")
    informer = _informer(serve(script), monkeypatch, limits=limits)
    try:
        _until(informer.synced.is_set)

        def refused() -> bool:
            try:
                informer.items()
            except CacheUnavailable as e:
                return "watch down" in str(e)
            return False

        _until(refused)
    finally:
        informer.stop()
