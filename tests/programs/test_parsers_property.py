"""Every parser boundary under generated input: the config YAML, durations, the
trace CSV, the backtest CSV, Prometheus' JSON and the cluster snapshot. The invariant: a
value, or the parser's own error naming the problem; never another exception, never a hang,
and memory bounded by the input, not by what the input claims (a timestamp gap of a
million years must not allocate a million years of slots).

Budgets are bounded (`max_examples`) so the suite stays fast; the generators lean on the
edges once reproduced as defects: NaN and infinite timestamps, huge gaps, booleans where numbers
belong, lists where names belong, deep nesting, objects where samples belong."""

from __future__ import annotations

import contextlib
import json
import math
import re
import string
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuscaler.adapters.kube.cluster import load_cluster_snapshot
from gpuscaler.adapters.kube.objects import ClusterStateError
from gpuscaler.adapters.prometheus.transport import SourceError
from gpuscaler.adapters.prometheus.window import decode_matrix, decode_vector
from gpuscaler.backtest import BacktestError, load_series_csv, to_grid
from gpuscaler.config import Config, ConfigError, parse_config, parse_duration
from gpuscaler.sim.trace import MAX_BINS, TraceError, load_trace

BUDGET = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SECTIONS = [
    "control", "metrics", "forecast", "fragments", "time_slice", "replicas", "node_pools",
    "workloads", "simulator", "prometheus", "preemption", "kubernetes",
]  # fmt: skip
KEYS = [
    "interval", "dry_run", "window", "step", "horizon", "order", "min_replicas", "name",
    "namespace", "kind", "selector", "label", "value", "gpu_memory_gib", "url", "allowed",
    "metrics_matchers", "overrides", "node_pool", "type", "max_replicas",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["30s", "500ms", "1h", "99999999999999d", "-1s", "nan", "ScaledObject"]),
)
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=4),
    ),
    max_leaves=25,
)
configs = st.dictionaries(st.sampled_from(SECTIONS), documents, max_size=5)


@BUDGET
@given(configs)
def test_any_config_document_is_a_config_or_a_config_error(doc: dict[str, Any]) -> None:
    try:
        text = yaml.safe_dump(doc)
    except (yaml.YAMLError, ValueError):
        return
    try:
        result = parse_config(text, require_targets=True)
    except ConfigError as e:
        assert e.problems and all(isinstance(p, str) and p for p in e.problems)
    else:
        assert isinstance(result, Config)


@BUDGET
@given(st.text(alphabet=string.printable, max_size=200))
def test_any_config_text_is_a_config_or_a_config_error(text: str) -> None:
    with contextlib.suppress(ConfigError):
        parse_config(text)


@BUDGET
@given(st.text(max_size=30))
def test_a_duration_is_seconds_or_a_value_error(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except ValueError as e:
        assert str(e)
    else:
        assert math.isfinite(seconds) and 0 <= seconds <= 366 * 86400


times = st.one_of(
    st.integers(min_value=-(10**15), max_value=10**15).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "2024-05-12T00:00:00", "yesterday", "", "1e300"]),
)
counts = st.one_of(
    st.integers(min_value=-5, max_value=10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", "x", "NaN"]),
)


def _csv(header: str, rows: list[tuple[str, str]]) -> str:
    return header + "\n" + "".join(f"{t},{c}\n" for t, c in rows)


@BUDGET
@given(st.lists(st.tuples(times, counts), max_size=12))
def test_any_trace_csv_is_a_trace_or_a_trace_error_in_bounded_memory(
    tmp_path: Path, rows: list[tuple[str, str]]
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(_csv("time,requests", rows))
    try:
        trace = load_trace(path)
    except TraceError as e:
        assert str(path) in str(e)
    else:
        assert trace.counts.size <= MAX_BINS and trace.bin_seconds > 0


@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        ([("0", "1"), ("10", "1"), ("3e13", "1")], "gap"),
        ([("0", "1"), ("inf", "1")], "row 3"),
        ([("0", "1"), ("nan", "1"), ("20", "2")], "row 3"),
    ],
    ids=["a gap of a million years", "an infinite timestamp", "a NaN timestamp"],
)
def test_trace_timestamps_that_would_explode_memory_are_refused_naming_the_row(
    tmp_path: Path, rows: list[tuple[str, str]], problem: str
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(_csv("time,requests", rows))
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert problem in str(info.value)


@BUDGET
@given(st.lists(st.tuples(times, counts), min_size=0, max_size=12))
def test_any_backtest_csv_is_a_series_or_a_backtest_error(
    tmp_path: Path, rows: list[tuple[str, str]]
) -> None:
    path = tmp_path / "series.csv"
    path.write_text(_csv("timestamp,value", rows))
    try:
        series = load_series_csv(path)
        for name, s in series.items():
            grid = to_grid(name, s, 60.0, "mean", str(path))
            assert grid.values.size <= MAX_BINS  # the bound the parser promises
    except BacktestError as e:
        assert str(e)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
samples = st.one_of(json_values, st.tuples(json_values, json_values))


def _answers(key: str, values: Any) -> Any:
    """Lists of up to 3 series shaped like Prometheus' answers, `key` holding `values`."""
    labels = st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2)
    return st.lists(st.fixed_dictionaries({"metric": labels}, optional={key: values}), max_size=3)


matrix_like = _answers("values", st.lists(samples))
vector_like = _answers("value", samples)


@BUDGET
@given(st.one_of(json_values, matrix_like))
def test_any_prometheus_result_is_decoded_or_a_source_error(result: Any) -> None:
    result = json.loads(json.dumps(result, allow_nan=True))  # as it comes off the wire
    try:
        times_, values, _ = decode_matrix(result)
    except SourceError as e:
        assert str(e)
    else:
        assert times_.shape == values.shape


@BUDGET
@given(st.one_of(json_values, vector_like))
def test_any_instant_prometheus_result_is_decoded_or_a_source_error(result: Any) -> None:
    result = json.loads(json.dumps(result, allow_nan=True))  # as it comes off the wire
    try:
        value, non_finite = decode_vector(result)
    except SourceError as e:
        assert str(e)
    else:
        assert value is None or (math.isfinite(value) and not non_finite)


@pytest.mark.parametrize(
    ("result", "want"),
    [
        ([], (None, False)),  # nothing fresh: memory bounded by the config alone
        ([{"metric": {}, "value": [1.0, "30720"]}], (30720.0, False)),
        ([{"metric": {}, "value": [1.0, "NaN"]}], (None, True)),
        ([{"metric": {}, "value": [1.0, "+Inf"]}], (None, True)),
        ([{"metric": {}, "value": [1.0, "x"]}], "not a number"),
        ([{"metric": {}, "value": [1.0, 2.0]}], "not [timestamp"),  # a number, not a string
        ([{"metric": {}, "value": "a1"}], "not [timestamp"),
        ([{"metric": {}, "value": {"1": "2"}}], "not [timestamp"),
        ([{"metric": {}, "values": [[1.0, "2"]]}], "not [timestamp"),  # a matrix
        ([{"metric": {}, "value": [1.0, "1"]}] * 2, "2 series"),
        ({"not": "a list"}, "not a list"),
    ],
)
def test_an_instant_answer_gives_one_value_or_says_what_is_wrong(
    result: Any, want: tuple[float | None, bool] | str
) -> None:
    if isinstance(want, str):
        with pytest.raises(SourceError, match=re.escape(want)):
            decode_vector(result)
    else:
        assert decode_vector(result) == want


POD = {"kind": "Pod", "metadata": {"name": "p", "namespace": "ml"}, "spec": {}, "status": {}}
NODE = {"kind": "Node", "metadata": {"name": "n"}, "status": {}}


@BUDGET
@given(st.lists(json_values, max_size=4), st.booleans())
def test_any_cluster_snapshot_is_objects_or_a_cluster_state_error(
    tmp_path: Path, extra: list[Any], valid_base: bool
) -> None:
    items: list[Any] = [POD, NODE] if valid_base else []
    items += extra
    path = tmp_path / "dump.yaml"
    path.write_text(yaml.safe_dump({"kind": "List", "items": items}))
    config = Config()
    try:
        load_cluster_snapshot(str(path), config)
    except ClusterStateError as e:
        assert str(path) in str(e)
