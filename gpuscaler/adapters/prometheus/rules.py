"""Pool-family recording rules: a `modelName` pool's utilization and stall read from the
series deploy/prometheus/prometheusrule.yaml (group `gpuscaler-pools`) records per pool,
when Prometheus records them: N/100 series a tick instead of N per-GPU ones.

A rule evaluates at its group's own phase, so the value read at grid time T is the raw
aggregate up to one interval (500 ms) older; hence it is used only when `metrics.step`
is that interval, the template is the default one and the series is not sampled coarser
than the step. Which pools are recorded is checked every `CHECK_EVERY` (one instant
query), and again at once when a recorded answer misses a pool; a switch is logged, and
the pool's window keeps what was read before it.
"""

from __future__ import annotations

import logging
from typing import Any

from gpuscaler.adapters.prometheus.transport import SourceError
from gpuscaler.config import Config
from gpuscaler.config.systems import PrometheusQueries

log = logging.getLogger("gpuscaler.prometheus")

RULE_LABEL = "modelName"
RULE_STEP = 0.5
"""The rules' evaluation interval: the only step they serve."""
CHECK_EVERY = 300.0
"""Seconds between two checks of which pools are recorded: rules change with a deploy."""

_DEFAULTS = PrometheusQueries()
POOL_RULES = {
    "util": ("gpuscaler:pool_gpu_utilization:avg", _DEFAULTS.pool_utilization),
    "stall": ("gpuscaler:pool_gpu_stall:avg", _DEFAULTS.pool_stall),
}
"""signal -> (recorded series, the template it stands for)."""


def check_query() -> str:
    """Which (series, modelName) are recorded now (a removed rule's series turn stale)."""
    names = "|".join(name for name, _ in POOL_RULES.values())
    return f'group by (__name__, {RULE_LABEL}) ({{__name__=~"{names}"}})'


class PoolRules:
    """Which pools' signals Prometheus records (signal -> `modelName` values)."""

    def __init__(self) -> None:
        self.recorded: dict[str, frozenset[str]] = {s: frozenset() for s in POOL_RULES}
        self.checked_at: float | None = None
        self.due = True

    @staticmethod
    def usable(config: Config, signal: str, label: str, template: str) -> bool:
        """The recorded series stand for this family's signal exactly."""
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
        """Take the check's answer (a failed one changes nothing and is tried again next
        tick); log the pools that switch source."""
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
        pools = [
            (p.name, p.metrics_matchers[RULE_LABEL])
            for p in config.node_pools
            if list(p.metrics_matchers) == [RULE_LABEL]
        ]
        for signal, values in found.items():
            before, after = self.recorded[signal], frozenset(values)
            _log_switch(signal, pools, before, after)
            self.recorded[signal] = after
        self.checked_at, self.due = now, False

    def note_missing(self, missing: list[str]) -> None:
        """Pools (their raw queries) a recorded answer missed: read raw this tick, and the
        rules checked again at the next read."""
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


def recorded_template(signal: str) -> str:
    """The grouped read of a recorded pool series, with `{matchers}` and `{lookback}`."""
    return "last_over_time(" + POOL_RULES[signal][0] + "{{{matchers}}}[{lookback}])"


def _log_switch(
    signal: str, pools: list[tuple[str, str]], before: frozenset[str], after: frozenset[str]
) -> None:
    name = POOL_RULES[signal][0]
    gained = [n for n, v in pools if v in after and v not in before]
    lost = [n for n, v in pools if v in before and v not in after]
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
