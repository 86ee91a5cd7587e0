"""Planning is linear in the number of targets: the config indexes its targets once,
instead of scanning the workload list for every workload on every tick."""

from __future__ import annotations

import sys
from dataclasses import replace
from types import FrameType
from typing import Any

from builders import NOW, config, signal, workload_obs

from gpuscaler.config import Config
from gpuscaler.core.model import History, Snapshot
from gpuscaler.core.plan import plan


def _case(n: int) -> tuple[Snapshot, Config]:
    workloads = "\n".join(
        f"  - {{namespace: ml, kind: ScaledObject, name: w{i}"
        + (", overrides: {replicas: {max_replicas: 40}}}" if i % 10 == 0 else "}")
        for i in range(n)
    )
    cfg = config(f"workloads:\n{workloads}\n")
    obs = workload_obs(signal(280, 490))
    snap = Snapshot(NOW, (), tuple(replace(obs, key=f"ml/ScaledObject/w{i}") for i in range(n)))
    return snap, cfg


def _work(snap: Snapshot, cfg: Config) -> int:
    """The plan's work, counted deterministically: every Python call, line and return
    (`sys.settrace`) and every call into C (`sys.setprofile`), the same on any machine."""
    events = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal events
        events += 1
        return tracer

    def profiler(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal events
        if event == "c_call":
            events += 1

    # Put back what was there: coverage.py traces the tests through sys.settrace in CI.
    before = sys.gettrace(), sys.getprofile()
    sys.settrace(tracer)
    sys.setprofile(profiler)
    try:
        result = plan(snap, cfg, History(), NOW)
    finally:
        sys.setprofile(before[1])
        sys.settrace(before[0])
    assert len(result.decisions) + len(result.skips) == len(snap.workloads)
    return events


def test_planning_ten_times_the_workloads_does_at_most_ten_times_the_work() -> None:
    """On the work the planner does rather than its seconds, so the bound is exact, not
    flaky: a quadratic planner (a scan of the workloads for every workload) does far more."""
    small, large = _work(*_case(1_000)), _work(*_case(10_000))
    assert small > 100 * 1_000, small  # the count sees per-workload work
    assert 5 * small <= large <= 10 * small, (small, large, large / small)
