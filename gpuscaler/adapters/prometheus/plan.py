"""What a tick asks Prometheus: few grouped queries, and per-target queries for what they
cannot answer, so that a tick's queries do not grow with the number of targets.

- **pools**: pools whose `metrics_matchers` are one equality on the same label (a "pool
  family", e.g. `modelName`) share one query per signal:
  `avg by (modelName) (last_over_time(DCGM_FI_DEV_GPU_UTIL{modelName=~"A|B"}[1s]))`;
  each series answers the pool with that label value; a `modelName` pool's utilization
  and stall come from the series the shipped pool rules record, where Prometheus records
  them (`rules.py`: one series per pool for Prometheus to read instead of one per GPU);
- **workloads**: one query over the recording rule `gpuscaler:workload_gpu_utilization:sum`
  (deploy/prometheus/prometheusrule.yaml), which sums GPU utilization by (namespace,
  workload) with the workload taken from the pod's name (Deployment
  `<name>-<hash>-<id>`, StatefulSet `<name>-<ordinal>`, either pod label convention);
- a target whose matchers or template do not fit a group, a series sampled coarser than
  the step (it needs its own lookback), a serving stack's demand and a leading signal are
  read by their own query; so is a target the grouped answer does not cover (the rule
  not installed, a workload named unlike its pods): the grouped form never loses one.

Each target's own query is the key its answers are kept under, by (query, start, end)
in the chunks `chunks` cuts (at most BUDGET points an answer), so a grouped answer split
into its targets (`split_answer`) and a per-target read are one and the same to the
reader.
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

LIMIT = 11_000
"""Prometheus refuses a range query whose (end - start) / step, in whole steps, passes
this (prometheus/prometheus web/api/v1/api.go, `queryRange`: "exceeded maximum resolution
of 11,000 points per timeseries")."""

BUDGET = 50_000
"""Points one range answer holds at most, over all its series: a grouped answer's JSON
costs about 150 bytes a point until it is decoded, so a long range over many series is
read in chunks of at most this many (about 8 MB each)."""

INSTANT = math.inf
Chunk = tuple[float, float]
"""A range query's (start, end) in whole seconds, or an instant query's (time, INSTANT)."""
AnswerKey = tuple[str, float, float]
Answer = list[Any] | SourceError
"""A query's answer: a range query's series decoded (`window.Samples`), an instant
query's `data.result`, or the error it failed with."""

WORKLOAD_RULE = "gpuscaler:workload_gpu_utilization:sum"
"""Recorded by deploy/prometheus/prometheusrule.yaml: GPU utilization summed by
(namespace, workload)."""
DEFAULT_WORKLOAD_TEMPLATE = "sum(last_over_time(DCGM_FI_DEV_GPU_UTIL{{{matchers}}}[{lookback}]))"
"""The per-target workload query the rule stands for; a custom template is read per
target, since the rule cannot know what it computes."""


@dataclass
class Group:
    """One grouped query and the targets it answers: label values -> (key, query)."""

    query: str
    by: tuple[str, ...]
    targets: dict[tuple[str, ...], tuple[str, str]] = field(default_factory=dict)
    instant: bool = False
    """An instant query at the grid's end (the frame-buffer signals), else a range query
    over what is new."""
    stale: Group | None = None
    """An instant group's second try, over `metrics.staleness`, for the targets the
    first (over the step's lookback) found nothing of."""
    recorded: bool = False
    """Over a pool recording rule's series (`rules.py`), not the raw per-GPU ones."""


@dataclass(frozen=True)
class Plan:
    groups: list[Group]
    single: list[tuple[str, str, bool]]
    """(key, query, instant) of the targets read by their own query."""


def memory_lookbacks(config: Config) -> tuple[str, str]:
    """The frame-buffer queries' lookbacks: that of a series sampled at the step, then
    `metrics.staleness` (a GPU's figure counts while fresher than that)."""
    stale = f"{max(1, math.ceil(config.metrics.staleness * 1000))}ms"
    return lookback_ms(config.metrics.step, None), stale


def workload_queries(config: Config, measured: Mapping[str, float]) -> list[tuple[str, str]]:
    """(key, query) of each workload's load: the config's template, or its serving
    stack's demand template where it has one; the lookback fits the series' spacing."""
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
    """The grouped queries and the per-target ones for `config`, given the series found
    coarser than the step (`measured`) and the pools Prometheus records (`rules`)."""
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
    """One signal's grouped query over a pool family (over the pool recording rule's
    series when `recorded`), and the pools read on their own: a series sampled coarser
    than the step needs its own lookback (frame-buffer figures have their own fallback,
    the group over `metrics.staleness`, instead)."""
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
    """Steps a range request spans at most: LIMIT, less what rounding its start and end
    to whole seconds (as `chunks` cuts them) can add, under a second
    (10,999 at 10 s: a week in 6 requests)."""
    return max(1, LIMIT - math.ceil(1.0 / step))


def chunks(start: float, end: float, step: float, pieces: int = 1, series: int = 1) -> list[Chunk]:
    """The (start, end) pairs a range is read in, in whole seconds, each of at most
    `chunk_steps` steps and, for an answer holding `series` series, at most BUDGET
    points in all, sharing their edge sample; with `pieces`, cut into at least that
    many (a backfill's parallel chunks)."""
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
"""Takes a target's answer to one chunk."""


def split_answer(
    by: tuple[str, ...],
    members: list[tuple[tuple[str, ...], str]],
    chunk: Chunk,
    store: Store,
    result: Answer,
) -> None:
    """One grouped answer cut into the per-target answers it holds, each given to
    `store`; a failed one gives nothing, so each target is asked on its own, and so does
    a target the answer holds twice (series not aggregated: the workload rule's). An
    instant answer is complete: a pool it does not hold has no sample in its lookback, so
    its own query would be empty."""
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
    """A series' labels: a decoded range series' `metric`, or an instant item's."""
    if isinstance(item, Samples):
        return item.metric
    return (item.get("metric") or {}) if isinstance(item, dict) else {}
