"""The transport asks for uncompressed answers unless `prometheus.compress_answers`,
keeping its authorization; what is decoded is the same."""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from kubefake import reply, serving
from promserver import STEP, planted_window, prometheus, write_openmetrics

from gpuscaler.adapters.prometheus.promql import format_step
from gpuscaler.adapters.prometheus.transport import Transport
from gpuscaler.adapters.prometheus.window import decode_matrix
from gpuscaler.config import parse_config

ANSWER = {
    "status": "success",
    "data": {
        "resultType": "matrix",
        "result": [{"metric": {"modelName": "a"}, "values": [[10, "1.5"], [10.5, "NaN"]]}],
    },
}


class _Recording:
    """A fake Prometheus that records each request's headers and gzips its answer when
    the request accepts gzip, as Prometheus does."""

    seen: ClassVar[list[dict[str, str]]] = []
    answer: ClassVar[dict[str, Any]] = ANSWER
    status: ClassVar[int] = 200

    @classmethod
    def handler(cls) -> Any:
        from http.server import BaseHTTPRequestHandler

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                cls.seen.append(dict(self.headers.items()))
                body = json.dumps(cls.answer).encode()
                headers = {"Content-Type": "application/json"}
                if "gzip" in self.headers.get("Accept-Encoding", ""):
                    body = gzip.compress(body)
                    headers["Content-Encoding"] = "gzip"
                reply(self, cls.status, body, headers)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


def _transport(url: str, extra: str = "") -> Transport:
    config = parse_config(f'prometheus: {{url: "{url}", retries: 0{extra}}}\n')
    return Transport(config.prometheus)


def test_a_read_asks_for_an_uncompressed_answer_and_keeps_its_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    _Recording.seen.clear()
    with serving(_Recording.handler()) as url:
        transport = _transport(url, f", bearer_token_file: {token}")
        result = transport.query_range("up", 10, 11, STEP)
        transport.query("up", 11.0)
        gzipped = _transport(url, ", compress_answers: true").query_range("up", 10, 11, STEP)
    ranged, instant, compressed = _Recording.seen
    for headers in (ranged, instant):
        assert headers["Accept-Encoding"] == "identity"
        assert headers["Authorization"] == "Bearer t0ken"
    assert "gzip" in compressed["Accept-Encoding"] and gzipped == result
    times, values, bad = decode_matrix(result)
    assert times.tolist() == [10.0, 10.5] and values[0] == 1.5 and math.isnan(values[1]) and bad


POINTS = 120


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    start, end = planted_window(POINTS, lag=3)
    series: dict[str, list[Any]] = {
        "DCGM_FI_DEV_GPU_UTIL": [
            ({"UUID": f"GPU-{g}", "modelName": f"m{g % 3}"}, lambda i, g=g: (7.3 * i + g) % 100)
            for g in range(30)
        ]
    }
    data = tmp_path_factory.mktemp("plain") / "data.om"
    write_openmetrics(data, series, start, POINTS)
    with prometheus(data) as url:
        yield url, end


def test_prometheus_answers_a_read_uncompressed_with_the_same_samples(
    planted: tuple[str, float],
) -> None:
    url, end = planted
    transport = _transport(url)
    encodings: list[str | None] = []
    get = transport.session.get

    def recorded(*args: Any, **kwargs: Any) -> Any:
        answer = get(*args, **kwargs)
        encodings.append(answer.headers.get("Content-Encoding"))
        return answer

    transport.session.get = recorded  # type: ignore[method-assign]
    query = "avg by (modelName) (last_over_time(DCGM_FI_DEV_GPU_UTIL[1s]))"
    start = math.floor(end) - 50
    plain = transport.query_range(query, start, math.floor(end), STEP)
    compressed = transport.session.get(  # gzip accepted
        f"{transport.url}/api/v1/query_range",
        params={"query": query, "start": start, "end": math.floor(end), "step": format_step(STEP)},
        headers={"Accept-Encoding": "gzip, deflate"},
    ).json()["data"]["result"]
    assert encodings == [None, "gzip"]
    assert len(plain) == 3
    key = lambda item: item["metric"]["modelName"]  # noqa: E731
    for ours, theirs in zip(sorted(plain, key=key), sorted(compressed, key=key), strict=True):
        times, values, _ = decode_matrix([ours])
        assert np.array_equal(times, [float(t) for t, _ in theirs["values"]])
        assert np.array_equal(values, [float(v) for _, v in theirs["values"]])
        assert times.size == len(theirs["values"]) > 90
