"""The replica floors of a tick decided together (issues 18 and 20): the planner assesses
every workload's skill at once (`skill.assess_chunk`, rows of histories that share their
record times: `floor_rows.remember_rows`' chunks) and keeps per-config floor rows, and the result is exactly what deciding
each workload alone gives (`assess`, `decide_replica_floor`, and the generator
`observed_peak` of tests/floor_reference.py): the same skill to the last bit, the same
decisions, skips and histories."""

from __future__ import annotations

import math
from dataclasses import fields, replace

import numpy as np
import pytest
from builders import NOW, config, forecast, workload_obs
from floor_reference import observed_peak as old_observed_peak

from gpuscaler.config import Config, ReplicasConfig
from gpuscaler.core import skill
from gpuscaler.core.decisions import target_key
from gpuscaler.core.model import History, Signal, Snapshot, TargetHistory
from gpuscaler.core.plan import floor_rows, plan
from gpuscaler.core.replicas import decide_replica_floor, observed_peak
from gpuscaler.core.skill import Skill, assess, assess_chunk, floor_history, records, remember

KEEP = 7500.0


@pytest.fixture(autouse=True)
def _rows_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every group of histories through the row path, however small (by default groups
    of fewer than `skill._MIN_ROWS` are assessed one by one)."""
    monkeypatch.setattr(skill, "_MIN_ROWS", 1)


def lanes(seed: int, width: int, ticks: int) -> list[tuple[float, list[TargetHistory]]]:
    """`width` workloads' floor histories ticked together (one schedule: a missed tick
    now and then, forecasts from tick 10): bursts, ties, lane 1 without a forecast at
    some ticks (its records then differ in which are scored), lane 2 with NaN values."""
    rng = np.random.default_rng(seed)
    hs = [TargetHistory() for _ in range(width)]
    bases = rng.uniform(5, 500, width)
    now, out = NOW, []
    for i in range(ticks):
        now += 30.0 * (2 if rng.random() < 0.05 else 1)
        for j in range(width):
            value = float(bases[j] * rng.gamma(2 + j % 4, 0.5) * (3 if rng.random() < 0.04 else 1))
            if rng.random() < 0.1:
                value = float(round(value))
            if j == 2 and i % 50 == 7:
                value = math.nan
            has = i >= 10 and not (j == 1 and rng.random() < 0.1)
            upper = float(value * rng.uniform(0.6, 1.6)) if has else math.nan
            mean = upper / rng.uniform(1.0, 1.4) if has else math.nan
            hs[j] = remember(hs[j], now, value, upper, mean, KEEP)
        out.append((now, list(hs)))
    return out


def chunk(hs: list[TargetHistory]) -> np.ndarray:
    """The records of histories on one schedule as `remember_rows` keeps them."""
    return np.stack([records(h) for h in hs])


def same(a: Skill, b: Skill) -> bool:
    if a.origins != b.origins or (a.score is None) != (b.score is None):
        return False
    return a.score is None or np.float64(a.score).tobytes() == np.float64(b.score).tobytes()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    ("lead", "stab", "span"), [(120.0, 300.0, 3900.0), (90.0, 60.0, math.inf), (30.0, 0.0, 600.0)]
)
def test_skills_assessed_together_are_each_workloads_skill_to_the_last_bit(
    seed: int, lead: float, stab: float, span: float
) -> None:
    for now, hs in lanes(seed, 9, 300)[::7]:
        together = assess_chunk(chunk(hs), now, lead, stab, 5, span)
        assert all(
            same(assess(h, now, lead, stab, 5, span), s) for h, s in zip(hs, together, strict=True)
        )


def test_chunks_on_other_schedules_short_or_out_of_order_give_each_historys_skill() -> None:
    a = lanes(0, 4, 200)[-1][1]
    b = lanes(1, 3, 230)[-1][1]  # other record times: a chunk of their own
    now = max(a[0].seen[-1][0], b[0].seen[-1][0])
    shuffled = TargetHistory(seen=tuple(reversed(a[3].seen)))  # out of time order, no array
    one = TargetHistory(seen=a[0].seen[-1:])
    for hs in (a, b, [shuffled], [one, one]):
        together = assess_chunk(chunk(hs), now, 120.0, 300.0, 5, 3900.0)
        alone = [assess(h, now, 120.0, 300.0, 5, 3900.0) for h in hs]
        assert all(same(x, y) for x, y in zip(alone, together, strict=True))
    assert assess_chunk(np.zeros((3, 0, 4)), now, 120.0, 300.0, 5) == [Skill(None, 0)] * 3
    assert assess_chunk(chunk([one]), now, 120.0, 300.0, 5) == [Skill(None, 0)]


def test_too_few_origins_give_no_score_for_every_row() -> None:
    hs = lanes(2, 3, 14)[-1][1]
    now = hs[0].seen[-1][0]
    assert assess_chunk(chunk(hs), now, 120.0, 300.0, 500, 3900.0) == [
        assess(h, now, 120.0, 300.0, 500, 3900.0) for h in hs
    ]


def test_the_observed_peak_is_the_records_highest_in_the_window_as_before() -> None:
    for now, hs in lanes(3, 3, 120)[::5]:
        for h in hs:
            for window in (0.0, 30.0, 300.0, 1e9):
                new, old = observed_peak(h, now, window), old_observed_peak(h, now, window)
                assert np.float64(new).tobytes() == np.float64(old).tobytes()


def test_a_floor_history_keeps_every_field_it_is_not_given() -> None:
    sentinels = {f.name: object() for f in fields(TargetHistory)}
    h = TargetHistory(**sentinels)  # type: ignore[arg-type]
    given = {"recommendations": (), "fallback": True}
    out = floor_history(h, **given)  # type: ignore[arg-type]
    for f in fields(TargetHistory):
        assert getattr(out, f.name) is given.get(f.name, sentinels[f.name]), f.name
    rows = np.zeros((0, 4))
    out = floor_history(h, seen=(), seen_rows=rows)
    assert out.seen == () and out.seen_rows is rows and out.fallback is sentinels["fallback"]


def _case(n: int) -> tuple[list[Snapshot], Config]:
    """n workloads (every 4th with its own replica section) over 40 ticks: loads that
    wander, a stale one, one without a forecast."""
    lines = [
        f"  - {{namespace: ml, kind: ScaledObject, name: w{i}, node_pool: p{i % 2}"
        + (
            ", overrides: {replicas: {max_replicas: 9, skill_min_origins: 3}}}"
            if i % 4 == 0
            else "}"
        )
        for i in range(n)
    ]
    pools = "\n".join(
        f"  - {{name: p{k}, selector: {{label: x, value: v{k}}}, gpu_memory_gib: 80,"
        " workload_type: inference}"
        for k in range(2)
    )
    cfg = config("node_pools:\n" + pools + "\nworkloads:\n" + "\n".join(lines) + "\n")
    rng = np.random.default_rng(5)
    snaps = []
    for k in range(40):
        now = NOW + 30.0 * k
        obs = []
        for i in range(n):
            peak = float(rng.uniform(100, 900))
            f = replace(forecast(peak, peak * rng.uniform(1.0, 1.5)), origin=now)
            age = 900.0 if i == 1 and k % 9 == 3 else 1.0
            sig = Signal(last_sample_time=now - age, forecast=None if i == 2 else f)
            o = replace(workload_obs(sig, floor=1 + (i + k) % 7), key=f"ml/ScaledObject/w{i}")
            obs.append(replace(o, recent_peak=peak * rng.uniform(0.7, 1.1)))
        snaps.append(Snapshot(now, (), tuple(obs)))
    return snaps, cfg


def plans_are_each_floor_alone(n: int) -> tuple[bool, list[str]]:
    """Plans `_case(n)` tick after tick, checking every floor's decision, skip and history
    against `decide_replica_floor` of that workload alone; (whether the last tick
    decided anything, the reasons of every floor decision and skip)."""
    snaps, cfg = _case(n)
    history = History()
    rows = floor_rows(cfg)
    reasons: list[str] = []
    for snap in snaps:
        out = plan(snap, cfg, history, snap.time)
        alone = [
            decide_replica_floor(
                w,
                rows[w.key][2],
                cfg.metrics.staleness,
                history.get(target_key("replica_floor", w.key)),
                snap.time,
            )
            for w in snap.workloads
        ]
        assert out.decisions == tuple(o.decision for o in alone if o.decision is not None)
        floors = tuple(s for s in out.skips if s.kind == "replica_floor")
        assert floors == tuple(o.skip for o in alone if o.skip is not None)
        for w, o in zip(snap.workloads, alone, strict=True):
            assert out.history.get(target_key("replica_floor", w.key)) == o.history
        reasons += [d.reason for d in out.decisions] + [s.reason for s in floors]
        history = out.history
    return any(o.decision is not None for o in alone), reasons


def test_a_plan_of_many_floors_is_each_floor_decided_alone_tick_after_tick() -> None:
    decided, _ = plans_are_each_floor_alone(12)
    assert decided


def test_floor_rows_are_built_once_per_config_and_a_copy_builds_its_own() -> None:
    _, cfg = _case(3)
    first = floor_rows(cfg)
    assert floor_rows(cfg) is first
    assert first["ml/ScaledObject/w0"][0] == "replica_floor:ml/ScaledObject/w0"
    assert first["ml/ScaledObject/w0"][2].max_replicas == 9
    assert first["ml/ScaledObject/w1"][1:] == ("p1", cfg.replicas)
    copy = cfg.model_copy(update={"workloads": cfg.workloads[:1]})
    assert list(floor_rows(copy)) == ["ml/ScaledObject/w0"]
    assert isinstance(first["ml/ScaledObject/w0"][2], ReplicasConfig)


def test_small_groups_are_assessed_one_by_one_and_large_ones_as_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(skill, "_MIN_ROWS", 12)
    rows: list[int] = []
    inner = skill._assess_rows

    def spy(recs: np.ndarray, *args: float) -> list[Skill]:
        rows.append(len(recs))
        return inner(recs, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(skill, "_assess_rows", spy)
    now, hs = lanes(4, 14, 150)[-1]
    wide = [h for i, h in enumerate(hs) if i != 1]  # lane 1 may be on its own
    together = assess_chunk(chunk(hs[:11] + wide), now, 120.0, 300.0, 5, 3900.0)
    alone = [assess(h, now, 120.0, 300.0, 5, 3900.0) for h in hs[:11] + wide]
    assert all(same(a, b) for a, b in zip(alone, together, strict=True))
    assert rows and max(rows) >= 12 and all(r >= 12 for r in rows)
