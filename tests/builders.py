"""Tiny builders for core inputs: one line per test row."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

import numpy as np

from gpuscaler.config import Config, NodePoolConfig, ReplicasConfig, parse_config
from gpuscaler.core.guards import Outcome
from gpuscaler.core.history import Signal as HistorySignal
from gpuscaler.core.history import WorkloadHistory
from gpuscaler.core.model import (
    Forecast,
    PoolObservation,
    Series,
    Signal,
    TargetHistory,
    WorkloadObservation,
)
from gpuscaler.core.replicas import replica_floors
from gpuscaler.sim.trace import Trace, load_trace

NOW = 1_700_000_000.0
HISTORY = (
    ("workload_requests", "q_req"),
    ("workload_load", "q_load"),
    ("kube_horizontalpodautoscaler_status_current_replicas", "q_rep"),
)


def forecast(peak: float, upper: float | None = None, last: float | None = None) -> Forecast:
    upper = peak + 5 if upper is None else upper
    steps = 30
    return Forecast(
        origin=NOW,
        step=10.0,
        mean=np.full(steps, float(peak)),
        lower=np.full(steps, max(0.0, 2.0 * peak - upper)),
        upper=np.full(steps, float(upper)),
        level=0.6,
        method="test",
        reason="test forecast",
        last_value=peak if last is None else last,
    )


def signal(
    peak: float | None, upper: float | None = None, age: float = 1.0, problem: str | None = None
) -> Signal:
    f = None if peak is None else forecast(peak, upper)
    return Signal(last_sample_time=NOW - age, forecast=f, problem=problem)


def pool(**kw: object) -> NodePoolConfig:
    base: dict[str, object] = {
        "name": "a100",
        "selector": {"label": "nvidia.com/gpu.product", "value": "A100"},
        "gpu_memory_gib": 80,
        "workload_type": "inference",
    }
    base.update(kw)
    return NodePoolConfig.model_validate(base)


def pool_obs(
    util: Signal,
    fragments: int | None = 4,
    stall: float | None = 5.0,
    level: str | None = "medium",
    held: int = 0,
    gpu_memory_gib: float | None = None,
    memory_used_gib: float | None = None,
) -> PoolObservation:
    return PoolObservation(
        name="a100",
        utilization=util,
        fragments=fragments,
        time_slice_level=level,
        stall_mean_pct=stall,
        stall_last_sample_time=NOW - 1,
        gpu_memory_gib=gpu_memory_gib,
        max_shares_held=held,
        memory_used_gib=memory_used_gib,
    )


def workload_obs(
    load: Signal, floor: int | None = 4, max_replicas: int | None = None, share: float = 1.0
) -> WorkloadObservation:
    return WorkloadObservation(
        key="ml/ScaledObject/chat",
        load=load,
        floor=floor,
        replicas=floor,
        max_replicas=max_replicas,
        replica_gpu_share=share,
    )


def history(
    changed_ago: float | None = None,
    direction: int = 0,
    pending_for: float | None = None,
    pending_direction: int = 0,
    recs: tuple[tuple[float, int], ...] = (),
    calm_for: float | None = None,
) -> TargetHistory:
    return TargetHistory(
        last_change_at=None if changed_ago is None else NOW - changed_ago,
        last_direction=direction,
        pending_since=None if pending_for is None else NOW - pending_for,
        pending_direction=pending_direction,
        recommendations=tuple((NOW - ago, v) for ago, v in recs),
        calm_since=None if calm_for is None else NOW - calm_for,
    )


def floor_of(
    obs: WorkloadObservation, cfg: ReplicasConfig, staleness: float, h: TargetHistory, now: float
) -> Outcome:
    """The replica floor of one workload: `replica_floors` of a tick of one."""
    return replica_floors([(obs, cfg, h)], staleness, now)[0]


def config(yaml_text: str = "") -> Config:
    return parse_config(yaml_text)


def assert_outcome(out: Outcome, expect: tuple[str, object], decision_text: str) -> None:
    """expect: ("set", to) | ("hold", text in the reason) | ("invalid", text in the reason)."""
    kind, value = expect
    if kind == "set":
        assert out.skip is None, out.skip
        assert out.decision is not None
        assert out.decision.to_value == value, out.decision.reason
        assert decision_text in out.decision.reason, out.decision.reason
    else:
        assert out.decision is None, out.decision
        assert out.skip is not None
        assert out.skip.invalid_input is (kind == "invalid")
        assert str(value) in out.skip.reason, out.skip.reason


CLI = [sys.executable, "-m", "gpuscaler.cli"]


def run_cli(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`gpuscaler ARGS` in a fresh process (with `env` added), output captured, bounded."""
    full = None if env is None else {**os.environ, **env}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=full)


def http_get(url: str) -> tuple[int, str]:
    """(status, body) of a GET of a program's endpoint; (0, why) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def workload_history(
    key: str,
    n: int,
    *series: Series | None,
    problems: Sequence[str | None] = (None, None, None),
    start: float = 1000.0,
) -> WorkloadHistory:
    """`n` samples of 10 s from `start` of a workload's request rate, GPU load and
    replicas (those not given: no series)."""
    given = (*series, None, None, None)[:3]
    signals = [
        HistorySignal(name, query, s, problem)
        for (name, query), s, problem in zip(HISTORY, given, problems, strict=True)
    ]
    return WorkloadHistory(key, start, start + 10.0 * (n - 1), 10.0, *signals)


class Terminal(io.StringIO):
    """A stream that says it is a terminal: progress bars show on it."""

    def isatty(self) -> bool:
        return True


def shifted_week(i: int, scale: float) -> Trace:
    """Workload i's demand: the bundled week shifted by i x 5 h, scaled."""
    base = load_trace()
    shift = round(i * 5 * 3600 / base.bin_seconds)
    return Trace(f"w{i}", base.start, base.bin_seconds, np.roll(base.counts, -shift) * scale)
