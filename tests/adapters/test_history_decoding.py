"""The decoder of the controller's reads and whatif's history: every point a float or a
clear error, any non-finite value a flagged gap; chunks Prometheus accepts."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubefake import serving
from test_prometheus_transport import _Recording

from gpuscaler.adapters.prometheus.history import HistoryReader
from gpuscaler.adapters.prometheus.plan import LIMIT, chunk_steps
from gpuscaler.adapters.prometheus.transport import SourceError
from gpuscaler.adapters.prometheus.window import decode_matrix
from gpuscaler.config import parse_config

VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e-7", "-0", "0x10", "", "1_000", " 2 ", "x"]),
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=False, allow_infinity=False),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)
TIMES = st.one_of(
    st.integers(0, 2**40),
    st.floats(0, 2**40).map(lambda t: round(t, 3)),
    st.sampled_from(["10", "x", None]),
)
POINTS = st.one_of(
    st.tuples(TIMES, VALUES).map(list),
    st.lists(st.integers(0, 9), max_size=3),  # short and long points
    st.sampled_from(["12", "ab", {"0": 1, "1": "2"}, 7]),
)
CLEAN = st.tuples(
    st.integers(0, 2**33).map(lambda t: t / 8),  # Prometheus' times: whole milliseconds
    st.floats(allow_nan=True, allow_infinity=True).map(
        lambda v: "NaN" if math.isnan(v) else ("+Inf" if v == math.inf else repr(v))
    ),
).map(list)


def _decoded(values: Any) -> tuple[list[float], list[float], bool] | str:
    """decode_matrix's answer for a one-series matrix of these values off the wire."""
    body = json.dumps({"data": {"result": [{"metric": {}, "values": values}]}})
    try:
        times, got, bad = decode_matrix(json.loads(body)["data"]["result"])
    except SourceError as e:
        return str(e)
    return times.tolist(), got.tolist(), bad


@settings(max_examples=300, deadline=None)
@given(st.lists(POINTS, max_size=12))
def test_any_answer_decodes_to_finite_floats_and_a_flag_or_a_clear_error(
    values: list[Any],
) -> None:
    decoded = _decoded(values)
    if isinstance(decoded, str):
        assert decoded == 'a sample is not [timestamp, "value"]'
        return
    times, got, bad = decoded
    assert len(times) == len(got) == len(values)
    assert bad == any(math.isnan(v) for v in got)  # every non-finite value a flagged gap
    assert not any(math.isinf(v) for v in got)


@settings(max_examples=200, deadline=None)
@given(st.lists(CLEAN, min_size=1, max_size=200))
def test_a_clean_answer_is_decoded_to_the_floats_it_writes(values: list[Any]) -> None:
    decoded = _decoded(values)
    assert not isinstance(decoded, str)
    times, got, _ = decoded
    want = [float(v) if math.isfinite(float(v)) else math.nan for _, v in values]
    assert times == [float(t) for t, _ in values]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], ([], [], False)),
        ([[10, "1.5"], [20, "NaN"]], ([10.0, 20.0], [1.5, math.nan], True)),
        ([[10, "+Inf"], [20, "-Inf"]], ([10.0, 20.0], [math.nan, math.nan], True)),
        ([[10.5, "2"], [11.25, "-0"]], ([10.5, 11.25], [2.0, -0.0], False)),
        ([[10, "1", "extra"], [20, "2"]], ([10.0, 20.0], [1.0, 2.0], False)),
        ([[10, "x"]], 'a sample is not [timestamp, "value"]'),
        ([[10]], 'a sample is not [timestamp, "value"]'),
        ([[10, None]], 'a sample is not [timestamp, "value"]'),
        (["12"], ([1.0], [2.0], False)),  # indexable: read as it indexes
    ],
    ids=["empty", "nan", "inf", "fractions", "long", "garbage", "short", "null", "string"],
)
def test_edge_answers_decode_as_the_table_says(values: list[Any], expected: Any) -> None:
    if isinstance(expected, str):
        assert _decoded(values) == expected
    else:  # a NaN Prometheus sends (stale markers it leaves out) is a flagged gap
        times, got, bad = decode_matrix([{"values": values}])  # no labels needed
        assert times.dtype == got.dtype == np.float64
        np.testing.assert_array_equal(times, expected[0])
        np.testing.assert_array_equal(got, expected[1])
        assert bad is expected[2]


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"a": 1}, "data.result is not a list"),
        ([{"values": []}, {"values": []}], "query returned 2 series"),
        ("result", "data.result is not a list"),
        ([{"metric": {}}], "result item has no values list"),
        ([{"values": "1,2"}], "result item has no values list"),
        ([["not", "an", "object"]], "result item has no values list"),
        ([{"metric": {}, "values": [{"t": 1, "v": "2"}]}], 'a sample is not [timestamp, "value"]'),
    ],
)
def test_a_malformed_result_keeps_its_message(result: Any, message: str) -> None:
    with pytest.raises(SourceError, match=message.replace("[", r"\[")):
        decode_matrix(result)


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 2e9), st.floats(0.001, 86400))
def test_a_chunk_stays_under_the_point_limit_after_rounding_its_ends(
    start: float, step: float
) -> None:
    end = start + chunk_steps(step) * step
    # Prometheus: `end.Sub(start) / step` in whole nanoseconds, refused over LIMIT; the
    # request's start and end are rounded to whole seconds.
    span_ns = (round(end) - round(start)) * 10**9
    assert span_ns // round(step * 1e9) <= LIMIT


def test_a_week_at_ten_seconds_is_read_in_six_requests_of_at_most_the_limit() -> None:
    assert chunk_steps(10.0) == LIMIT - 1
    assert math.ceil((7 * 86400 / 10 + 2) / chunk_steps(10.0)) == 6


def _config(url: str, extra: str = "") -> Any:
    return parse_config(
        f'prometheus: {{url: "{url}", retries: 0{extra}, queries: {{workload_requests: '
        '"sum(r{{{matchers}}})"}}\n'
        "node_pools:\n  - {name: p, selector: {label: l, value: v}, gpu_memory_gib: 80,\n"
        "     workload_type: inference, profile: compute_bound}\n"
        "workloads:\n  - {namespace: ns, kind: ScaledObject, name: w, node_pool: p}\n"
    )


@pytest.mark.parametrize(
    ("extra", "encoding"), [("", "identity"), (", compress_answers: true", "gzip")]
)
def test_history_is_read_uncompressed_unless_the_config_asks_for_gzip(
    extra: str, encoding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _Recording.seen.clear()
    answer = {"data": {"result": [{"metric": {}, "values": [[10, "1.5"], [20, "2"]]}]}}
    monkeypatch.setattr(_Recording, "answer", answer)
    with serving(_Recording.handler()) as url:
        reader = HistoryReader(_config(url, extra))
        series = reader.read("q", 10.0, 20.0, 10.0)
    assert series.values.tolist() == [1.5, 2.0]
    assert all(encoding in h["Accept-Encoding"] for h in _Recording.seen)


def test_a_request_over_the_point_limit_is_a_clear_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = {  # Prometheus' answer to a range over 11,000 points (HTTP 400)
        "status": "error",
        "errorType": "bad_data",
        "error": "exceeded maximum resolution of 11,000 points per timeseries. Try "
        "decreasing the query resolution (?step=XX)",
    }
    monkeypatch.setattr(_Recording, "answer", refused)
    monkeypatch.setattr(_Recording, "status", 400)
    with serving(_Recording.handler()) as url:
        reader = HistoryReader(_config(url))
        history = reader.workload(reader.config.workloads[0], 0.0, 3600.0, 10.0)
    assert history.requests.series is None
    assert "400" in str(history.requests.problem)
    assert "exceeded maximum resolution" in str(history.requests.problem)
    assert LIMIT == 11_000
