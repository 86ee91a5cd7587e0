"""Pool recording rules against a real Prometheus (the shipped rules evaluated by promtool):
the same windows as raw grouped reads; raw reads without them; checked every 5 minutes."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from test_prometheus_grouped import (
    MODELS,
    PAST,
    WORKLOADS,
    _config,
    _prometheus,
    _same,
    _sources,
    planted,
)

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.adapters.prometheus.rules import CHECK_EVERY, POOL_RULES, PoolRules, check_query
from gpuscaler.adapters.prometheus.transport import SourceError
from gpuscaler.config import Config
from gpuscaler.sources import PrometheusSource

__all__ = ["planted"]  # the module's fixture: a Prometheus with and one without the rules


def _grouped(url: str, rules: bool = True) -> PrometheusSource:
    cfg = _prometheus(_config(url, WORKLOADS), pool_recording_rules=rules)
    return PrometheusSource(cfg, CurrentState())


def _recorded_queries(source: PrometheusSource) -> list[str]:
    return [g.query for g in source._plan_now().groups if g.recorded]


def test_pools_read_from_the_recording_rules_get_the_windows_the_raw_series_give(
    planted: tuple[str, str, float],
) -> None:
    url, _, now = planted
    rules, raw = _grouped(url), _grouped(url, rules=False)
    plain = PrometheusSource(_config(url, WORKLOADS, grouped=False), CurrentState())
    got = rules.observe(now)
    want = plain.observe(now)
    _same(got, want, rule=True)
    _same(raw.observe(now), want, rule=True)
    models = set(MODELS.values())  # and the T4, selected by Hostname: read raw
    assert all(models < rules.rules.recorded[s] for s in POOL_RULES)
    assert [q.split("{")[0] for q in _recorded_queries(rules)] == [
        f"last_over_time({name}" for name, _ in POOL_RULES.values()
    ]
    assert _recorded_queries(raw) == []
    # The same number of queries as the raw grouped reads, plus the check.
    assert rules.queries_last_tick == raw.queries_last_tick + 1
    # Later ticks do not check again: as many queries as the raw reads.
    _same(rules.observe(now + 5), raw.observe(now + 5), rule=True, past=PAST)
    assert rules.queries_last_tick == raw.queries_last_tick


def test_without_the_pool_rules_the_raw_series_are_read(
    planted: tuple[str, str, float],
) -> None:
    _, raw_url, now = planted
    source, plain = _sources(raw_url, WORKLOADS)
    _same(source.observe(now), plain.observe(now))
    assert source.rules.recorded == {s: frozenset() for s in POOL_RULES}
    assert _recorded_queries(source) == []


def test_a_pool_whose_recorded_series_is_missing_is_read_raw_and_checked_again(
    planted: tuple[str, str, float], caplog: pytest.LogCaptureFixture
) -> None:
    """The rules were removed after the last check: this tick reads the raw series for
    the pools the recorded answer misses, and the next read checks again."""
    _, raw_url, now = planted
    source, plain = _sources(raw_url, WORKLOADS)
    rules = source.rules
    rules.recorded = {s: frozenset(MODELS.values()) for s in POOL_RULES}
    rules.checked_at, rules.due = now, False
    with caplog.at_level(logging.WARNING, logger="gpuscaler.prometheus"):
        _same(source.observe(now), plain.observe(now))
    assert rules.due and "recorded pool answer(s) missing" in caplog.text
    _same(source.observe(now + 5), plain.observe(now + 5))
    assert rules.recorded == {s: frozenset() for s in POOL_RULES} and not rules.due


def _cfg(rules: bool = True, step: str = "0.5s", matchers: str = "modelName: A") -> Config:
    from gpuscaler.config import parse_config

    return parse_config(
        f'prometheus: {{url: "http://p:9090", pool_recording_rules: {str(rules).lower()}}}\n'
        f"metrics: {{step: {step}, window: 10m}}\n"
        "node_pools:\n"
        f"  - {{name: a, selector: {{label: x, value: a}}, gpu_memory_gib: 80, "
        f"metrics_matchers: {{{matchers}}}}}\n"
        "  - {name: b, selector: {label: x, value: b}, gpu_memory_gib: 80, "
        "metrics_matchers: {modelName: B}}\n"
    )


def _answer(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"metric": {"__name__": POOL_RULES[s][0], "modelName": v}} for s, v in pairs]


@pytest.mark.parametrize(
    ("checked_at", "due", "now", "want"),
    [
        (None, True, 1000.0, True),  # never checked
        (1000.0, False, 1000.0 + CHECK_EVERY - 30, False),  # a tick before the 5 minutes
        (1000.0, False, 1000.0 + CHECK_EVERY, True),
        (1000.0, True, 1030.0, True),  # a recorded answer missed a pool
    ],
)
def test_which_pools_are_recorded_is_checked_every_five_minutes_or_when_an_answer_misses(
    checked_at: float | None, due: bool, now: float, want: bool
) -> None:
    rules = PoolRules()
    rules.checked_at, rules.due = checked_at, due
    assert rules.needs_check(_cfg(), now) is want
    assert rules.needs_check(_cfg(rules=False), now) is False  # turned off: never asked


def test_a_check_splits_each_signal_between_recorded_and_raw_pools(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rules, cfg = PoolRules(), _cfg()
    template = cfg.prometheus.queries.pool_utilization
    pools = [("a", "A"), ("b", "B")]
    with caplog.at_level(logging.INFO, logger="gpuscaler.prometheus"):
        rules.update(1000.0, _answer(("util", "A"), ("util", "B"), ("stall", "B")), cfg)
    assert "2 pool(s) now read from the recorded gpuscaler:pool_gpu_utilization:avg" in caplog.text
    assert rules.split(cfg, "util", "modelName", template, pools) == (pools, [])
    stall = cfg.prometheus.queries.pool_stall
    assert rules.split(cfg, "stall", "modelName", stall, pools) == ([("b", "B")], [("a", "A")])
    # A failed check changes nothing and is tried again.
    rules.due = True
    rules.update(1030.0, SourceError("timed out"), cfg)
    assert rules.recorded["util"] == {"A", "B"} and rules.due
    # A rule removed: its pools go back to the raw series, and that is said.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gpuscaler.prometheus"):
        rules.update(1060.0, _answer(("util", "B")), cfg)
    assert "1 pool(s) no longer recorded" in caplog.text
    assert rules.split(cfg, "util", "modelName", template, pools) == ([("b", "B")], [("a", "A")])


@pytest.mark.parametrize(
    ("cfg", "signal", "label", "template", "usable"),
    [
        (_cfg(), "util", "modelName", None, True),
        (_cfg(rules=False), "util", "modelName", None, False),  # turned off
        (_cfg(step="1s"), "util", "modelName", None, False),  # not the rules' interval
        (_cfg(), "util", "gpu_type", None, False),  # another pool label
        (_cfg(), "util", "modelName", "avg(X{{{matchers}}})", False),  # a template of one's own
        (_cfg(), "fb_used", "modelName", None, False),  # no rule for the frame buffer
    ],
)
def test_the_recorded_series_stand_only_for_the_default_queries_at_the_500ms_step(
    cfg: Config, signal: str, label: str, template: str | None, usable: bool
) -> None:
    default = POOL_RULES[signal][1] if signal in POOL_RULES else "x"
    assert PoolRules.usable(cfg, signal, label, template or default) is usable


def test_the_check_asks_for_both_recorded_series_by_pool() -> None:
    query = check_query()
    assert all(name in query for name, _ in POOL_RULES.values())
    assert query.startswith("group by (__name__, modelName)")
