"""Prometheus answers decoded fast (issue 18): the same request as `Transport` (auth,
TLS, retries and error translation through `Transport._call`), decoded by orjson, each
series' points turned into numpy arrays at once instead of by a Python loop per point
(with the per-point lists shed after), and
asked for uncompressed (`PLAIN`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
from prometheus_api_client.exceptions import PrometheusApiClientException

from gpuscaler.adapters.prometheus.promql import format_step
from gpuscaler.adapters.prometheus.transport import Transport
from gpuscaler.core.model import FloatArray

PLAIN = {"Accept-Encoding": "identity"}
"""These requests ask for an uncompressed answer. Prometheus gzips an answer whenever the
request accepts gzip or deflate (`newCompressedResponseWriter`, util/httputil/
compression.go in prometheus/prometheus), and requests accepts both by default. At
10,000 GPUs a steady tick's grouped answers are about 2.5 MB of JSON, and compressing them
cost Prometheus 0.13-0.16 of its 0.27-0.37 CPU seconds a tick (bench/tick.py's Prometheus,
measured 2026-12-01): more than the transfer it saves takes on a cluster network (2.5 MB
is 20 ms at 1 Gbit/s). The answer itself is the same bytes either way. whatif's history
reads (issue 20) ask the same: a week of a series at 10 s is about 1.2 MB of JSON (a fifth
of it gzipped); uncompressed and in larger chunks, Prometheus' CPU for 100 workload-weeks
fell from 37-41 to 17-19 seconds (bench/history_reads.py; gzip alone doubled it).
`prometheus.compress_answers: true` accepts gzip again, for a slow link."""


def _headers(transport: Transport) -> dict[str, str]:
    """The request's headers: the transport's own (auth) and, unless the config asks for
    compressed answers, `PLAIN`."""
    headers = dict(transport.client.headers or {})
    return headers if transport.cfg.compress_answers else {**headers, **PLAIN}


def fast_query_range(
    transport: Transport, query: str, start: float, end: float, step: float
) -> list[Any]:
    """`Transport.query_range` (same auth, TLS, retries and error translation), with the
    answer decoded by orjson and each series' points turned into numpy arrays at once."""
    params = {
        "query": query,
        "start": round(start),  # as custom_query_range sends them
        "end": round(end),
        "step": format_step(step),
    }
    return _fast_get(transport, "query_range", params, decode_fast)


def fast_query(transport: Transport, query: str, time: float) -> list[Any]:
    """`Transport.query` at `time`, decoded by orjson."""
    return _fast_get(transport, "query", {"query": query, "time": f"{time:.3f}"})


def _fast_get(
    transport: Transport,
    path: str,
    params: dict[str, Any],
    decode: Callable[[Any], list[Any]] | None = None,
) -> list[Any]:
    """One request's `data.result`; a range answer decoded (`decode`) and its per-point
    lists shed (`_shed`)."""
    api = transport.client

    def request() -> Any:
        answer = api._session.get(
            f"{api.url}/api/v1/{path}",
            params=params,
            verify=api._session.verify,
            headers=_headers(transport),
            auth=api.auth,
            cert=api._session.cert,
            timeout=api._timeout,
        )
        if answer.status_code != 200:
            raise PrometheusApiClientException(
                f"HTTP Status Code {answer.status_code} ({answer.content[:200]!r})"
            )
        result = orjson.loads(answer.content)["data"]["result"]
        return result if decode is None else _shed(decode(result))

    return transport._call(request)


def _shed(result: list[Any]) -> list[Any]:
    """A decoded series' `values` emptied: its points are in `arrays`, which is all
    `window.decode_matrix` and `bulk.py` read of it (an empty list still says "a matrix
    series"). At 10,000 GPUs a steady tick's range answers hold about 86,000 small lists
    of [time, "value"]; kept until the tick ends, every collection of the garbage
    collector walked them (a full one most ticks). Shed while it is paused, they are
    freed before any collection sees them."""
    for item in result:
        if isinstance(item, dict) and "arrays" in item:
            item["values"] = []
    return result


def decode_fast(result: Any) -> list[Any]:
    """Each series' `values` as (times, values) float arrays under `arrays`, which
    `prometheus.decode_matrix` takes as they are; a malformed answer is left for it to
    refuse with its own message. Every point is converted by `float`, as decode_matrix's
    own loop converts it (the same bits), but in one pass per column (issue 20: a week of
    10 s points is 60,480 a series)."""
    if not isinstance(result, list):
        return result  # type: ignore[no-any-return]
    for item in result:
        values = item.get("values") if isinstance(item, dict) else None
        if not isinstance(values, list):
            continue
        arrays = _columns(values)
        if arrays is not None:
            item["arrays"] = arrays
    return result


def _columns(values: list[Any]) -> tuple[FloatArray, FloatArray] | None:
    """(times, values) of a list of [time, "value"] lists, each by `float`; None when any
    point is not a list of at least two items both `float` takes (left to decode_matrix,
    which names the problem, or reads points of more than two items as it always did)."""
    n = len(values)
    if n == 0:
        return np.empty(0), np.empty(0)
    if set(map(type, values)) != {list}:
        return None
    try:
        times, samples = itertools.islice(zip(*values, strict=False), 2)
        return (
            np.fromiter(map(float, times), np.float64, n),
            np.fromiter(map(float, samples), np.float64, n),
        )
    except (ValueError, TypeError):  # a short point, or an item float refuses
        return None
