"""Grouped, concurrent reads against a real Prometheus (the shipped workload rule
evaluated by promtool): what per-target reads see, in fewer queries, not growing with
the number of workloads."""

from __future__ import annotations

import math
import subprocess
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
from promserver import STEP, binaries, planted_window, prometheus, shipped_rules, write_openmetrics

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.adapters.prometheus.backfill import Backfill, Folds, Pending
from gpuscaler.adapters.prometheus.plan import BUDGET, chunks, split_answer
from gpuscaler.adapters.prometheus.promql import grouped_template
from gpuscaler.adapters.prometheus.transport import SourceError
from gpuscaler.adapters.prometheus.window import Window, decode_range
from gpuscaler.config import Config, parse_config
from gpuscaler.core.snapshot import Observations
from gpuscaler.sources import PrometheusSource

POINTS = 240  # 2 minutes at 500 ms
MODELS = {"a100": "NVIDIA A100", "h100": "NVIDIA H100", "l4": "NVIDIA L4 (24GB)"}
PODS = {  # pod -> (namespace, label convention)
    "chat-7d4f8b9c6-x2x4z": ("ml", "plain"),
    "chat-7d4f8b9c6-bq5mn": ("ml", "plain"),
    "embed-0": ("ml", "plain"),
    "embed-1": ("ml", "plain"),
    "train-5c9d7f6b8d-h7kzt": ("batch", "exported"),
    "chatbot-55f7c9d8b4-qq2rs": ("ml", "plain"),  # not "chat": a workload of its own
}


def _gpus() -> list[dict[str, str]]:
    gpus = []
    pods = list(PODS.items())
    for i in range(12):
        model = list(MODELS.values())[i % 3] if i < 9 else "NVIDIA T4"
        labels = {"UUID": f"GPU-{i}", "gpu": str(i % 4), "modelName": model}
        labels["Hostname"] = "node-9" if i >= 9 else f"node-{i // 3}"
        if i < len(pods):
            pod, (ns, style) = pods[i]
            labels |= (
                {"pod": pod, "namespace": ns}
                if style == "plain"
                else {"exported_pod": pod, "exported_namespace": ns, "pod": "dcgm-exporter-abc12"}
            )
        gpus.append(labels)
    return gpus


def _wave(i: int, g: int, scale: float = 1.0) -> float:
    return scale * (40 + 30 * math.sin((i + 7 * g) / 25.0))


PAST = round(5 / STEP)
"""The steps of a read at `now + 5` after the last planted sample."""
BLOCK = 7200
"""promtool's block length (2 h), aligned to the epoch."""


def _one_block(start: float, end: float) -> tuple[float, float]:
    """The planted minutes moved before a 2-hour block boundary they would straddle: promtool's
    rule backfill misses the evaluations in the second before one (cmd/promtool/rules.go)."""
    if math.floor((start - 1) / BLOCK) == math.floor((end + 2) / BLOCK):
        return start, end
    end = math.floor((end + 2) / BLOCK) * BLOCK - 3
    return end - (POINTS - 1) * STEP, end


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, float]]:
    """(URL with the workload rule recorded, URL with raw data only, `now`)."""
    _, tool = binaries()
    tmp = tmp_path_factory.mktemp("grouped")
    start, end = _one_block(*planted_window(POINTS, lag=3))
    gpus = _gpus()
    series: dict[str, list[Any]] = {
        "DCGM_FI_DEV_GPU_UTIL": [(g, lambda i, n=n: _wave(i, n)) for n, g in enumerate(gpus)],
        "nvidia_gpu_stall_percentage": [
            (g, lambda i, n=n: _wave(i, n, 0.2)) for n, g in enumerate(gpus)
        ],
        "DCGM_FI_DEV_FB_USED": [(g, lambda i, n=n: 1000.0 * n + i) for n, g in enumerate(gpus)],
        "DCGM_FI_DEV_FB_FREE": [(g, lambda i: 80_000.0) for g in gpus],
    }
    data = tmp / "data.om"
    write_openmetrics(data, series, start, POINTS)
    rules = shipped_rules(tmp)
    blocks = tmp / "blocks"
    with prometheus(data) as raw_url:
        subprocess.run(
            [
                tool,
                "tsdb",
                "create-blocks-from",
                "rules",
                f"--start={math.floor(start)}",
                f"--end={math.ceil(end) + 1}",
                f"--url={raw_url}",
                f"--output-dir={blocks}",
                str(rules),
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
        with prometheus(data, blocks=blocks) as url:
            yield url, raw_url, end


def _config(
    url: str, workloads: list[tuple[str, str, str]], grouped: bool = True, extra: str = ""
) -> Config:
    pools = "".join(
        f"""
  - name: {name}
    selector: {{label: nvidia.com/gpu.product, value: {name}}}
    gpu_memory_gib: 80
    metrics_matchers: {{modelName: "{model}"}}"""
        for name, model in MODELS.items()
    )
    listed = "".join(
        f"\n  - {{namespace: {ns}, kind: {kind}, name: {name}}}" for ns, kind, name in workloads
    )
    flag = str(grouped).lower()  # per target: the whole window at once, as a reference
    return parse_config(
        f"""
prometheus: {{url: "{url}", grouped_queries: {flag}, background_backfill: {flag}, timeout: 20s,
  retries: 0}}
metrics: {{step: 0.5s, window: 10m}}
node_pools:{pools}
  - name: t4
    selector: {{label: nvidia.com/gpu.product, value: t4}}
    gpu_memory_gib: 16
    metrics_matchers: {{Hostname: node-9}}
workloads:{listed}
{extra}"""
    )


def _prometheus(cfg: Config, **update: Any) -> Config:
    """`cfg` with its prometheus section updated."""
    return cfg.model_copy(update={"prometheus": cfg.prometheus.model_copy(update=update)})


WORKLOADS = [
    ("ml", "ScaledObject", "chat"),
    ("ml", "HorizontalPodAutoscaler", "embed"),
    ("batch", "ScaledObject", "train"),
    ("ml", "ScaledObject", "chatbot"),
]


def _same_load(grouped: Any, plain: Any, rule: bool, past: int = 0) -> bool:
    """Equal; through the recording rule, up to one evaluation (500 ms) of delay, which moves
    one sample of twenty between 10 s buckets: means within a few percent, an edge bucket
    holding a sample in one only. `past`: the newest steps after the last planted sample,
    left out (there the backfilled rule runs on from its own evaluation phase)."""
    g, p = grouped.values, plain.values
    if past:
        g, p = g[:-past], p[:-past]
    if np.allclose(g, p, equal_nan=True):
        return True
    both = np.isfinite(g) & np.isfinite(p)
    edges = int((np.isfinite(g) != np.isfinite(p)).sum())
    return rule and edges <= 2 and bool(np.allclose(g[both], p[both], rtol=0.05))


def _same(a: Observations, b: Observations, rule: bool = False, past: int = 0) -> None:

    def eq(x: Any, y: Any) -> bool:
        if x is None or y is None:
            return x is y
        return bool(np.array_equal(x.values, y.values, equal_nan=True))

    for p, q in zip(a.pools, b.pools, strict=True):
        assert p.name == q.name and p.problem == q.problem, (p.problem, q.problem)
        for x, y in ((p.utilization, q.utilization), (p.stall, q.stall)):  # pool rules too
            both = x is not None and y is not None
            assert eq(x, y) or (both and _same_load(x, y, rule, past)), p.name
        assert (p.memory_used_gib, p.gpu_memory_gib) == (q.memory_used_gib, q.gpu_memory_gib)
    for w, v in zip(a.workloads, b.workloads, strict=True):
        assert w.key == v.key and w.problem == v.problem, (w.key, w.problem, v.problem)
        assert w.load is not None and v.load is not None
        assert _same_load(w.load, v.load, rule, past), w.key


def _sources(
    url: str, workloads: list[tuple[str, str, str]], extra: str = ""
) -> tuple[PrometheusSource, PrometheusSource]:
    grouped = PrometheusSource(_config(url, workloads, extra=extra), CurrentState())
    plain = PrometheusSource(_config(url, workloads, grouped=False, extra=extra), CurrentState())
    return grouped, plain


def test_grouped_reads_see_what_per_target_reads_see_in_fewer_queries(
    planted: tuple[str, str, float],
) -> None:
    url, _, now = planted
    grouped, plain = _sources(url, WORKLOADS)
    first = grouped.observe(now)
    _same(first, plain.observe(now), rule=True)
    assert all(w.load is not None and np.isfinite(w.load.values).any() for w in first.workloads)
    # 4 signals x (1 modelName family + the Hostname pool) + 1 for every workload, and
    # the first read's check of which pools are recorded (adapters/prometheus/rules.py).
    assert grouped.queries_last_tick == 4 + 4 + 1 + 1
    # The next tick reads only what is new, with as few queries, but the planted samples
    # end at `now`: the frame buffer's newest is 5 s old, past the step's lookback, so its
    # grouped instant query and the Hostname pool's are tried again over
    # metrics.staleness (source._newest_gib); the frame-buffer totals (the family's and
    # the Hostname pool's) are kept from the first tick (adapters/prometheus/source.py, Totals).
    _same(grouped.observe(now + 5), plain.observe(now + 5), rule=True, past=PAST)
    assert grouped.queries_last_tick == 9 - 2 + 1 + 1


def test_the_first_read_takes_what_a_forecast_needs_and_the_rest_follows_behind(
    planted: tuple[str, str, float],
) -> None:
    """The first tick acts once forecast.min_history is in; the rest of the window follows
    behind it and is in the windows by the next tick, equal to a whole-window read."""
    url, _, now = planted
    grouped, plain = _sources(url, WORKLOADS, extra="forecast: {min_history: 80s}\n")
    first = grouped.observe(now)
    # min_history, overlap (5 s) and a bucket of the 2 planted minutes, in 10 s buckets.
    for pool in first.pools:
        if pool.utilization is not None:
            seen = np.isfinite(pool.utilization.values).sum() * 10.0
            assert 80 <= seen <= 80 + 5 + 2 * 10, pool.name
    assert first.pools[0].memory_used_gib is not None  # the newest figure needs no history
    assert grouped.backfilling and grouped.queries_last_tick == 9 + 1  # backfill not counted
    grouped.after_tick()  # as the controller does once the tick is done
    assert grouped.backfill.wait(timeout=120), "backfill still running after 120 s"
    _same(grouped.observe(now + 5), plain.observe(now + 5), rule=True, past=PAST)
    assert not grouped.backfilling
    assert grouped.queries_last_tick == 9 - 2 + 1 + 1  # as steady as without a backfill


def test_a_frame_buffer_template_that_cannot_be_grouped_is_read_per_pool_in_advance(
    planted: tuple[str, str, float],
) -> None:
    url, _, now = planted
    used = "max(last_over_time(DCGM_FI_DEV_FB_USED{{{matchers}}}[{lookback}])) * 1"

    def custom(cfg: Config) -> Config:
        queries = cfg.prometheus.queries.model_copy(update={"pool_memory_used": used})
        return _prometheus(cfg, queries=queries)

    grouped = PrometheusSource(custom(_config(url, WORKLOADS)), CurrentState())
    plain = PrometheusSource(custom(_config(url, WORKLOADS, grouped=False)), CurrentState())
    _same(grouped.observe(now), plain.observe(now), rule=True)
    # The modelName family's fb_used group becomes one query per pool (3), each asked
    # before the per-target reads, which then ask nothing more.
    assert grouped.queries_last_tick == 9 - 1 + len(MODELS) + 1


def test_a_backfill_that_failed_is_asked_again_behind_the_next_read() -> None:
    window = Window(step=STEP, width=1.0, size=10)
    window.advance(10.0)  # buckets ending at 1 to 10 s
    calls: list[list[str]] = []

    def fetch(batch: Mapping[str, Pending]) -> Folds:
        calls.append(list(batch))
        folds = Folds(batch)
        if len(calls) == 1:
            folds.take(("q", 5.0, 8.0), SourceError("timed out"))
        else:  # the sample at 8 s is the first read's: left out
            points = [[5.0, "1"], [7.0, "2"], [8.0, "3"]]
            folds.take(("q", 5.0, 8.0), decode_range([{"metric": {}, "values": points}]))
        return folds

    backfill = Backfill(fetch)
    backfill.pending["k"] = Pending(window, "q", 5.0, 8.0, (0.0, 100.0))
    for _ in range(2):
        backfill.start()
        assert backfill.wait(timeout=10)
        backfill.apply({"k": window})
    assert calls == [["k"], ["k"]] and not backfill.busy
    values = window.series().values  # the buckets ending at 1 to 10 s
    np.testing.assert_array_equal(values[[4, 6]], [1.0, 2.0])
    assert np.isfinite(values).sum() == 2


def test_queries_per_tick_do_not_grow_with_the_workloads(planted: tuple[str, str, float]) -> None:
    url, _, now = planted
    few, _ = _sources(url, WORKLOADS[:1])
    many, _ = _sources(url, WORKLOADS)
    few.observe(now)
    many.observe(now)
    assert few.queries_last_tick == many.queries_last_tick


def test_without_the_recording_rule_every_workload_is_still_read_on_its_own(
    planted: tuple[str, str, float],
) -> None:
    _, raw_url, now = planted
    grouped, plain = _sources(raw_url, WORKLOADS)
    _same(grouped.observe(now), plain.observe(now))
    assert grouped.queries_last_tick == 9 + len(WORKLOADS) + 1  # + the pool rules' check


def test_a_failing_prometheus_flags_every_target_as_per_target_reads_do() -> None:
    grouped, plain = _sources("http://127.0.0.1:9", WORKLOADS)
    got, want = grouped.observe(1e9), plain.observe(1e9)
    assert [p.problem for p in got.pools] == [p.problem for p in want.pools]
    assert all(w.problem and "cannot connect" in w.problem for w in got.workloads)


@pytest.mark.parametrize(
    ("template", "grouped"),
    [
        (
            "avg(last_over_time(X{{{matchers}}}[1s]))",
            "avg by (L) (last_over_time(X{{{matchers}}}[1s]))",
        ),
        (
            "min(A{{{matchers}}} + B{{{matchers}}})",
            "min by (L) (A{{{matchers}}} + B{{{matchers}}})",
        ),
        ("avg(a{{{matchers}}}) / avg(b{{{matchers}}})", None),  # two aggregations
        ("quantile(0.9, X{{{matchers}}})", None),  # not a plain aggregation
        ("avg(X)", None),  # no matchers: nothing to group by
    ],
)
def test_only_a_single_plain_aggregation_is_grouped(template: str, grouped: str | None) -> None:
    assert grouped_template(template, ["L"]) == grouped


@pytest.mark.parametrize("chunk", [(0.0, 30.0), (30.0, math.inf)], ids=["range", "instant"])
def test_a_target_a_grouped_answer_holds_twice_is_read_on_its_own(
    chunk: tuple[float, float],
) -> None:
    """The workload rule's series are read without aggregation: were a (namespace,
    workload) recorded twice (another copy of the rule, extra labels), the target is
    read by its own query instead of taking either series, or their sum."""
    result = [
        {"metric": {"namespace": "ml", "workload": "chat"}, "values": [[1, "1"]]},
        {"metric": {"namespace": "ml", "workload": "chat", "copy": "b"}, "values": [[1, "2"]]},
        {"metric": {"namespace": "ml", "workload": "embed"}, "values": [[1, "3"]]},
    ]
    members: list[tuple[tuple[str, ...], str]] = [
        (("ml", "chat"), "qc"),
        (("ml", "embed"), "qe"),
        (("ml", "gone"), "qg"),
    ]
    answers: dict[tuple[str, float, float], Any] = {}
    split_answer(("namespace", "workload"), members, chunk, answers.__setitem__, result)
    want: dict[tuple[str, float, float], Any] = {("qe", *chunk): [result[2]]}
    if chunk[1] == math.inf:
        want[("qg", *chunk)] = []  # an instant answer is complete: absent means no sample
    assert answers == want


def test_a_range_is_read_in_chunks_under_the_point_limit_sharing_their_edges() -> None:
    assert chunks(0.0, 100.0, STEP) == [(0, 100)]
    # At most 11,000 points less the 2 steps rounding to whole seconds may add: 5,499 s.
    assert chunks(0.0, 12_000.0, STEP) == [(0, 5499), (5499, 10998), (10998, 12000)]
    # A backfill's parallel chunks: at least `pieces`, never over the points limit.
    assert chunks(0.0, 100.0, STEP, pieces=4) == [(0, 25), (25, 50), (50, 75), (75, 100)]
    assert len(chunks(0.0, 12_000.0, STEP, pieces=2)) == 3
    # An answer over many series holds at most BUDGET points: 1,000 series, 100 s each.
    assert chunks(0.0, 1_000.0, STEP, series=BUDGET // 200) == [
        (t, t + 100) for t in range(0, 1_000, 100)
    ]
