"""The extender's HTTP face: a Starlette ASGI app with the verbs kube-scheduler calls
(`POST {urlPrefix}/filter|prioritize|bind`) and /healthz, /readyz, /metrics.

- A body that is not the protocol: 400 naming what is wrong (kube-scheduler logs it).
- Anything else that goes wrong inside a verb: a protocol answer carrying `Error`, never
  a 500 without one. A filter answer always carries NodeNames (or Nodes).
- A body above `max_body_bytes` is refused with 413, from its Content-Length or while
  it is read; a request naming more than `max_nodes` nodes with 400.
- Small Filter and Prioritize calls are answered on the event loop (pure, sub-millisecond
  per 100 nodes); a larger body is parsed and answered in the thread pool, so /healthz
  and small calls go on meanwhile. Bind, which calls the Kubernetes API, always is.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from gpuscaler.core.gpufit import freshness
from gpuscaler.extender import protocol
from gpuscaler.extender.metrics import ExtenderMetrics
from gpuscaler.extender.protocol import ExtenderArgs, ProtocolError
from gpuscaler.extender.service import Extender, FilterAnswer

log = logging.getLogger("gpuscaler.extender")
INLINE_BYTES = 64 << 10
"""Bodies up to this are answered on the event loop: about 1,000 node names."""


class TooLarge(Exception):
    pass


async def _body(request: Request, limit: int) -> bytes:
    """The body, or TooLarge past `limit` bytes (declared or read: never held whole)."""
    declared = request.headers.get("content-length", "0")  # digits: the HTTP parser checked
    if len(declared) > 18 or int(declared) > limit:
        raise TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


@dataclass(eq=False)
class ExtenderApp:
    extender: Extender
    metrics: ExtenderMetrics
    ready: Callable[[], str | None]
    clock: Callable[[], float] = time.monotonic
    refused_since: dict[str, float] = field(default_factory=dict, init=False)
    """Pod UID -> when the filter first found no node for it (until one fits)."""

    def build(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/filter", self._verb("filter", self._filter), methods=["POST"]),
                Route("/prioritize", self._verb("prioritize", self._prioritize), methods=["POST"]),
                Route("/bind", self._verb("bind", self._bind), methods=["POST"]),
                Route("/healthz", self._healthz, methods=["GET"]),
                Route("/readyz", self._readyz, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
            ]
        )

    def _verb(
        self, verb: str, handle: Callable[[bytes], bytes]
    ) -> Callable[[Request], Awaitable[Response]]:
        histogram = self.metrics.latency.labels(verb)

        async def endpoint(request: Request) -> Response:
            started = time.perf_counter()
            limit = self.extender.config.max_body_bytes
            try:
                body = await _body(request, limit)
                if verb == "bind" or len(body) > INLINE_BYTES:
                    answer = await run_in_threadpool(handle, body)
                else:
                    answer = handle(body)
            except TooLarge:
                self.metrics.bad_requests.inc()
                text = f"{verb}: body over {limit} bytes (scheduler.max_body_bytes)\n"
                return PlainTextResponse(text, status_code=413)
            except ProtocolError as e:
                self.metrics.bad_requests.inc()
                return PlainTextResponse(f"{verb}: {e}\n", status_code=400)
            finally:
                histogram.observe(time.perf_counter() - started)
            return Response(answer, media_type="application/json")

        return endpoint

    def _filter(self, body: bytes) -> bytes:
        args = protocol.parse_args(body, self.extender.config.max_nodes)
        try:
            answer = self.extender.filter(args)
        except Exception as e:  # a defect: say so in the protocol, keep serving
            log.exception("filter failed")
            return protocol.filter_result(args, [], {}, {}, f"gpuscaler extender: {e}")
        self.metrics.rejected(answer.reasons)
        self._track_refusals(args, answer)
        return protocol.filter_result(args, answer.kept, answer.failed, answer.unresolvable)

    def _track_refusals(self, args: ExtenderArgs, answer: FilterAnswer) -> None:
        uid = args.Pod.metadata.uid
        if answer.kept or not uid:
            self.refused_since.pop(uid, None)
        else:
            self.refused_since.setdefault(uid, self.clock())

    def _prioritize(self, body: bytes) -> bytes:
        args = protocol.parse_args(body, self.extender.config.max_nodes)
        try:
            scores = self.extender.prioritize(args)
        except Exception:
            log.exception("prioritize failed")
            scores = [(n, 0) for n in args.node_names()]
        return protocol.priorities(scores)

    def _bind(self, body: bytes) -> bytes:
        args = protocol.parse_binding(body)
        try:
            error = self.extender.bind(args)
        except Exception as e:
            log.exception("bind failed")
            error = f"gpuscaler extender: {type(e).__name__}: {e}"
        self.metrics.binds.labels("refused" if error else "bound").inc()
        if not error:
            self.refused_since.pop(args.PodUID, None)
        else:
            log.info("bind refused: %s", error, extra={"event": "bind_refused"})
        return protocol.binding_result(error)

    async def _healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def _readyz(self, request: Request) -> Response:
        problem = self.ready()
        return PlainTextResponse(f"{problem or 'ok'}\n", 200 if problem is None else 503)

    async def _metrics(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type="text/plain; version=0.0.4")

    def observe_state(self, live_uids: set[str] | None = None) -> None:
        """Refresh the state gauges; forget refusals of pods that are gone."""
        state = self.extender.state
        snap = state.snapshot
        now = self.extender.wall()
        ttl = self.extender.config.cache_ttl
        ages: Counter[str] = Counter(freshness(now - n.sampled_at, ttl) for n in snap.gpus.values())
        if live_uids is not None:
            for uid in list(self.refused_since):
                if uid not in live_uids:
                    del self.refused_since[uid]
        oldest = min(self.refused_since.values(), default=None)
        waiting = self.clock() - oldest if oldest is not None else 0.0
        self.metrics.observe_state(snap, ages, len(state.reservations), waiting)
