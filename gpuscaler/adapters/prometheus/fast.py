"""Prometheus answers decoded fast (issue 18): the same request as `Transport` (auth,
TLS, retries and error translation through `Transport._call`), decoded by orjson, each
series' points turned into numpy arrays at once instead of by a Python loop per point,
and asked for uncompressed (`PLAIN`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from prometheus_api_client.exceptions import PrometheusApiClientException

from gpuscaler.adapters.prometheus.promql import format_step
from gpuscaler.adapters.prometheus.transport import Transport

PLAIN = {"Accept-Encoding": "identity"}
"""These requests ask for an uncompressed answer. Prometheus gzips an answer whenever the
request accepts gzip or deflate (`newCompressedResponseWriter`, util/httputil/
compression.go in prometheus/prometheus), and requests accepts both by default. At
10,000 GPUs a steady tick's grouped answers are about 2.5 MB of JSON, and compressing them
cost Prometheus 0.13-0.16 of its 0.27-0.37 CPU seconds a tick (bench/tick.py's Prometheus,
measured 2026-12-01): more than the transfer it saves takes on a cluster network (2.5 MB
is 20 ms at 1 Gbit/s). The answer itself is the same bytes either way."""


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
    return decode_fast(_fast_get(transport, "query_range", params))


def fast_query(transport: Transport, query: str, time: float) -> list[Any]:
    """`Transport.query` at `time`, decoded by orjson."""
    return _fast_get(transport, "query", {"query": query, "time": f"{time:.3f}"})


def _fast_get(transport: Transport, path: str, params: dict[str, Any]) -> list[Any]:
    api = transport.client

    def request() -> Any:
        answer = api._session.get(
            f"{api.url}/api/v1/{path}",
            params=params,
            verify=api._session.verify,
            headers={**(api.headers or {}), **PLAIN},
            auth=api.auth,
            cert=api._session.cert,
            timeout=api._timeout,
        )
        if answer.status_code != 200:
            raise PrometheusApiClientException(
                f"HTTP Status Code {answer.status_code} ({answer.content[:200]!r})"
            )
        return orjson.loads(answer.content)["data"]["result"]

    return transport._call(request)


def decode_fast(result: Any) -> list[Any]:
    """Each series' `values` as (times, values) float arrays under `arrays`, which
    `prometheus.decode_matrix` takes as they are; a malformed answer is left for it to
    refuse with its own message."""
    if not isinstance(result, list):
        return result  # type: ignore[no-any-return]
    for item in result:
        values = item.get("values") if isinstance(item, dict) else None
        if not isinstance(values, list):
            continue
        try:
            pairs = np.array(values, dtype=object).reshape(len(values), 2)
            item["arrays"] = (pairs[:, 0].astype(np.float64), pairs[:, 1].astype(np.float64))
        except (ValueError, TypeError):
            continue
    return result
