"""What a tick asks Prometheus: few grouped queries, and per-target ones for what they
cannot answer, so that a tick's queries do not grow with the number of targets.

- pools whose `metrics_matchers` are one equality on the same label (a "pool family",
  e.g. `modelName`) share one query per signal, `avg by (modelName) (...)`, or read the
  series the shipped pool rules record (`rules.py`);
- workloads share one query over the recording rule `gpuscaler:workload_gpu_utilization:sum`
  (deploy/prometheus/prometheusrule.yaml: GPU utilization by namespace and workload);
- a target that does not fit a group (other matchers, a custom template, a series
  sampled coarser than the step, a demand or leading signal) or that the grouped answer
  does not cover is read by its own query: the grouped form never loses one.

Answers are kept by (target's own query, start, end), so a grouped answer split into
its targets (`split_answer`) and a per-target read are the same to the reader.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuscaler.adapters.prometheus.promql import (
    HOSTNAME_LABELS,
    build_query,
    build_workload_query,
    escape_label_value,
    grouped_template,
)
from gpuscaler.adapters.prometheus.rules import PoolRules, recorded_template
from gpuscaler.adapters.prometheus.spacing import lookback_ms
from gpuscaler.adapters.prometheus.transport import SourceError
from gpuscaler.adapters.prometheus.window import Samples
from gpuscaler.config import Config
from gpuscaler.config.systems import PrometheusQueries

LIMIT = 11_000
"""Points per series a range query may have (prometheus web/api/v1/api.go, `queryRange`)."""

BUDGET = 50_000
"""Points one range answer holds at most, over all its series (about 8 MB of JSON)."""

INSTANT = math.inf
Chunk = tuple[float, float]
"""A range query's (start, end) in whole seconds, or an instant query's (time, INSTANT)."""
AnswerKey = tuple[str, float, float]
Answer = list[Any] | SourceError
"""A range query's series decoded (`window.Samples`), an instant query's `data.result`,
or the error it failed with."""

WORKLOAD_RULE = "gpuscaler:workload_gpu_utilization:sum"
DEFAULT_WORKLOAD_TEMPLATE = PrometheusQueries().workload_load
"""The per-target workload query the rule stands for (a custom one is read per target)."""


@dataclass
class Group:
    """One grouped query and the targets it answers: label values -> (key, query)."""

    query: str
    by: tuple[str, ...]
    targets: dict[tuple[str, ...], tuple[str, str]] = field(default_factory=dict)
    instant: bool = False
    """An instant query at the grid's end (the frame-buffer signals), else a range query."""
    stale: Group | None = None
    """An instant group's second try, over `metrics.staleness`, for what it found empty."""
    recorded: bool = False
    """Over a pool recording rule's series (`rules.py`)."""


@dataclass(frozen=True)
class Plan:
    groups: list[Group]
    single: list[tuple[str, str, bool]]
    """(key, query, instant) of the targets read by their own query."""


def memory_lookbacks(config: Config) -> tuple[str, str]:
    """The frame-buffer queries' lookbacks: the step's, then `metrics.staleness`."""
    stale = f"{max(1, math.ceil(config.metrics.staleness * 1000))}ms"
    return lookback_ms(config.metrics.step, None), stale


def workload_queries(config: Config, measured: Mapping[str, float]) -> list[tuple[str, str]]:
    """(key, query) of each workload's load (its serving stack's demand where it has one)."""
    default = config.prometheus.queries.workload_load
    step = config.metrics.step
    return [
        (
            f"workload:{w.key}",
            build_workload_query(
                w.demand.template if w.demand is not None else default,
                w.namespace,
                w.name,
                lookback_ms(step, measured.get(f"workload:{w.key}")),
            ),
        )
        for w in config.workloads
    ]


def plan_reads(config: Config, measured: Mapping[str, float], rules: PoolRules) -> Plan:
    """The grouped and per-target queries, given the series found coarser than the step."""
    q = config.prometheus.queries
    signals = [
        ("util", q.pool_utilization, False),
        ("stall", q.pool_stall, False),
        ("fb_used", q.pool_memory_used, True),
        ("fb_total", q.pool_memory_total, True),
    ]
    lookbacks = memory_lookbacks(config)

    def lookback(key: str, instant: bool) -> str:
        return lookbacks[0] if instant else lookback_ms(config.metrics.step, measured.get(key))

    grouped = config.prometheus.grouped_queries
    families: dict[str, list[tuple[str, str]]] = {}
    single: list[tuple[str, str, bool]] = []
    for p in config.node_pools:
        if not p.metrics_matchers:
            continue
        (label, value), *more = p.metrics_matchers.items()
        if more or label in HOSTNAME_LABELS or not grouped:
            single += [
                (key, build_query(t, p.metrics_matchers, lookback(key, i)), i)
                for s, t, i in signals
                for key in [f"pool:{p.name}:{s}"]
            ]
        else:
            families.setdefault(label, []).append((p.name, value))
    groups: list[Group] = []
    for label, pools in families.items():
        for signal, template, instant in signals:
            recorded, raw = rules.split(config, signal, label, template, pools)
            for members, rule in ((recorded, True), (raw, False)):
                if members:
                    group, alone = _family_group(
                        label, members, signal, template, instant, rule, lookback, lookbacks
                    )
                    groups += [group] if group is not None else []
                    single += alone
    loads = workload_queries(config, measured)
    covered: set[str] = set()
    if grouped and q.workload_load == DEFAULT_WORKLOAD_TEMPLATE and config.workloads:
        # One series per pair already: no `sum by` (a pair twice: `split_answer`).
        g = Group(f"last_over_time({WORKLOAD_RULE}[{lookbacks[0]}])", ("namespace", "workload"))
        for w, (key, query) in zip(config.workloads, loads, strict=True):
            if w.demand is None and key not in measured:
                g.targets[(w.namespace, w.name)] = (key, query)
        groups.append(g)
        covered = {key for key, _ in g.targets.values()}
    single += [(k, query, False) for k, query in loads if k not in covered]
    single += [
        (f"workload:{w.key}:demand", w.leading_query, False)
        for w in config.workloads
        if w.leading_query
    ]
    return Plan(groups, single)


def _family_group(
    label: str,
    pools: list[tuple[str, str]],
    signal: str,
    template: str,
    instant: bool,
    recorded: bool,
    lookback: Callable[[str, bool], str],
    lookbacks: tuple[str, str],
) -> tuple[Group | None, list[tuple[str, str, bool]]]:
    """One signal's grouped query over a pool family, and the pools read on their own: a
    series sampled coarser than the step needs its own lookback (except the frame buffer,
    whose fallback is the group over `metrics.staleness`)."""
    key = {name: f"pool:{name}:{signal}" for name, _ in pools}
    coarse = set() if instant else {n for n in key if lookback(key[n], False) != lookbacks[0]}
    grouped = recorded_template(signal) if recorded else grouped_template(template, [label])
    if grouped is None:  # each pool read by its own query
        return None, [
            (key[n], build_query(template, {label: v}, lookback(key[n], instant)), instant)
            for n, v in pools
        ]
    regex = "|".join(re.escape(v) for _, v in pools)
    matcher = f"{label}=~{escape_label_value(regex)}"
    group: Group | None = None
    # For the frame buffer, the group over metrics.staleness is built first: it is the
    # fallback of the one over the step's lookback.
    for each in reversed(lookbacks) if instant else lookbacks[:1]:
        own = {
            n: build_query(template, {label: v}, each if instant else lookback(key[n], False))
            for n, v in pools
        }
        g = Group(grouped.format(matchers=matcher, lookback=each), (label,), instant=instant)
        g.recorded = recorded
        g.targets = {(v,): (key[n], own[n]) for n, v in pools if n not in coarse}
        g.stale, group = group, g
    return group, [(key[n], own[n], instant) for n in sorted(coarse)]


def chunk_steps(step: float) -> int:
    """Steps a range request spans at most: LIMIT, less what rounding to whole seconds adds."""
    return max(1, LIMIT - math.ceil(1.0 / step))


def chunks(start: float, end: float, step: float, pieces: int = 1, series: int = 1) -> list[Chunk]:
    """The (start, end) pairs, in whole seconds and sharing their edge sample, a range is
    read in: each of at most `chunk_steps` steps and BUDGET points over `series` series,
    at least `pieces` of them (a backfill's parallel chunks)."""
    out: list[Chunk] = []
    size = max(1, math.floor(min(chunk_steps(step), BUDGET / max(1, series)) * step))
    if pieces > 1:
        size = max(1, min(size, math.ceil((math.floor(end) - math.floor(start)) / pieces)))
    last = math.floor(end)
    t = math.floor(start)
    while True:
        chunk_end = min(last, t + size)
        out.append((t, chunk_end))
        if chunk_end >= last:
            return out
        t = chunk_end


Store = Callable[[AnswerKey, Answer], None]


def split_answer(
    by: tuple[str, ...],
    members: list[tuple[tuple[str, ...], str]],
    chunk: Chunk,
    store: Store,
    result: Answer,
) -> None:
    """One grouped answer cut into per-target answers for `store`. A failed answer, or a
    target it holds twice (the workload rule is not aggregated), gives nothing: those
    are asked on their own. A pool an instant answer lacks is empty."""
    if isinstance(result, SourceError) or not isinstance(result, list):
        return
    by_values: dict[tuple[str, ...], Any] = {}
    twice = set()
    for item in result:
        metric = _labels(item)
        values = tuple(str(metric.get(label, "")) for label in by)
        if values in by_values:
            twice.add(values)
        by_values[values] = item
    for values, query in members:
        if values in twice:
            continue
        item = by_values.get(values)
        if item is not None:
            store((query, *chunk), [item])
        elif chunk[1] == INSTANT:
            store((query, *chunk), [])


def _labels(item: Any) -> Mapping[str, Any]:
    if isinstance(item, Samples):
        return item.metric
    return (item.get("metric") or {}) if isinstance(item, dict) else {}
