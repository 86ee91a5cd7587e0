"""Pool-family recording rules: a pool's utilization and stall read from the
series the shipped PrometheusRule records per `modelName`, when Prometheus records them.

At 10,000 GPUs, Prometheus' own evaluation of a family's grouped range query over the
raw per-GPU series is most of a tick's read (71 steps x 10,000 series, about 0.34 s per
signal). The rules in deploy/prometheus/prometheusrule.yaml (group `gpuscaler-pools`)
compute the same aggregation once per evaluation, one series per pool, so a tick reads
N/100 series instead of N:

    gpuscaler:pool_gpu_utilization:avg =
        avg by (modelName) (last_over_time(DCGM_FI_DEV_GPU_UTIL[1s]))

which is the default `pool_utilization` template grouped by `modelName`, with the
lookback a 500 ms step gives it (two steps, `spacing.lookback_ms`). What it changes: a
rule evaluates at its group's own phase (rules/group.go `EvalTimestamp` in
prometheus/prometheus: `hash(group) % interval` after each multiple of the interval), so
the value read at grid time T is what the rule computed at its latest evaluation at or
before T: the raw aggregate up to one interval (500 ms) older. Hence the rules are used
only when `metrics.step` is their interval, the template is the default one, and the
series is not sampled coarser than the step (those keep their own lookback, read per
target).

Which pools are recorded is asked once per `CHECK_EVERY` (one instant query), not every
tick; again at once when a recorded answer misses a pool. A pool switches source at a
check only, and the switch is logged: its window keeps what was read before, so until
the window has turned over it holds raw reads before the switch and recorded ones after
(the same expression, up to one evaluation apart).
"""

from __future__ import annotations

import logging
from typing import Any

from gpuscaler.adapters.prometheus.transport import SourceError
from gpuscaler.config import Config
from gpuscaler.config.systems import PrometheusQueries

log = logging.getLogger("gpuscaler.prometheus")

RULE_LABEL = "modelName"
"""The pool label the shipped pool rules aggregate by."""
RULE_STEP = 0.5
"""The rules' evaluation interval (group `gpuscaler-pools`): the only step they serve."""
CHECK_EVERY = 300.0
"""Seconds between two checks of which pools are recorded: rules change with a deploy."""

_DEFAULTS = PrometheusQueries()
POOL_RULES = {
    "util": ("gpuscaler:pool_gpu_utilization:avg", _DEFAULTS.pool_utilization),
    "stall": ("gpuscaler:pool_gpu_stall:avg", _DEFAULTS.pool_stall),
}
"""signal -> (recorded series, the template it stands for)."""


def check_query() -> str:
    """The check: which (series, modelName) are recorded now (a removed rule's series are
    marked stale by Prometheus, so an instant selector stops seeing them at once)."""
    names = "|".join(name for name, _ in POOL_RULES.values())
    return f'group by (__name__, {RULE_LABEL}) ({{__name__=~"{names}"}})'


class PoolRules:
    """Which pools' signals Prometheus records, checked every `CHECK_EVERY` seconds."""

    def __init__(self) -> None:
        self.recorded: dict[str, frozenset[str]] = {s: frozenset() for s in POOL_RULES}
        """signal -> the `modelName` values with a recorded series."""
        self.checked_at: float | None = None
        self.due = True

    @staticmethod
    def usable(config: Config, signal: str, label: str, template: str) -> bool:
        """The recorded series stand for this family's signal exactly (up to the rule's
        evaluation delay)."""
        return (
            config.prometheus.pool_recording_rules
            and signal in POOL_RULES
            and label == RULE_LABEL
            and template == POOL_RULES[signal][1]
            and config.metrics.step == RULE_STEP
        )

    def needs_check(self, config: Config, now: float) -> bool:
        if not config.prometheus.pool_recording_rules:
            return False
        return self.due or self.checked_at is None or now - self.checked_at >= CHECK_EVERY

    def update(self, now: float, answer: Any, config: Config) -> None:
        """Take the check's answer (a failed check changes nothing, and is tried again
        at the next tick); log the pools that switch source."""
        if isinstance(answer, SourceError) or not isinstance(answer, list):
            log.warning("prometheus: checking the pool recording rules failed: %s", answer)
            return
        found: dict[str, set[str]] = {s: set() for s in POOL_RULES}
        by_name = {name: signal for signal, (name, _) in POOL_RULES.items()}
        for item in answer:
            metric = item.get("metric", {}) if isinstance(item, dict) else {}
            signal = by_name.get(str(metric.get("__name__", "")))
            if signal is not None and RULE_LABEL in metric:
                found[signal].add(str(metric[RULE_LABEL]))
        pools = family(config)
        for signal, values in found.items():
            now_recorded = frozenset(values)
            _log_switch(signal, pools, self.recorded[signal], now_recorded)
            self.recorded[signal] = now_recorded
        self.checked_at, self.due = now, False

    def note_missing(self, missing: list[str]) -> None:
        """Pools (their raw queries) a recorded series' answer missed: read raw for now
        (the reader asks their own queries), and which pools are recorded is checked
        again at the next read."""
        if missing:
            self.due = True
            log.warning(
                "prometheus: %d recorded pool answer(s) missing (e.g. %s): read raw this tick",
                len(missing),
                missing[0],
                extra={"event": "pool_rules_missing"},
            )

    def split(
        self, config: Config, signal: str, label: str, template: str, pools: list[tuple[str, str]]
    ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """(pools read from the recorded series, pools read raw) of one family's signal."""
        if not self.usable(config, signal, label, template):
            return [], pools
        recorded = self.recorded[signal]
        return [p for p in pools if p[1] in recorded], [p for p in pools if p[1] not in recorded]


def family(config: Config) -> list[tuple[str, str]]:
    """(name, value) of the pools selected by `modelName` alone."""
    out = []
    for p in config.node_pools:
        items = list(p.metrics_matchers.items())
        if len(items) == 1 and items[0][0] == RULE_LABEL:
            out.append((p.name, items[0][1]))
    return out


def recorded_template(signal: str) -> str:
    """The grouped read of a recorded pool series (one series per pool already), as a
    template with `{matchers}` and `{lookback}`."""
    return "last_over_time(" + POOL_RULES[signal][0] + "{{{matchers}}}[{lookback}])"


def _log_switch(
    signal: str, pools: list[tuple[str, str]], before: frozenset[str], after: frozenset[str]
) -> None:
    gained = [n for n, v in pools if v in after and v not in before]
    lost = [n for n, v in pools if v in before and v not in after]
    name = POOL_RULES[signal][0]
    if gained:
        log.info(
            "prometheus: %d pool(s) now read from the recorded %s (e.g. %s); their windows "
            "keep the raw reads before this tick",
            len(gained),
            name,
            gained[0],
            extra={"event": "pool_rules_on", "signal": signal},
        )
    if lost:
        log.warning(
            "prometheus: %d pool(s) no longer recorded as %s (e.g. %s): read raw again; "
            "their windows keep the recorded reads before this tick",
            len(lost),
            name,
            lost[0],
            extra={"event": "pool_rules_off", "signal": signal},
        )
