"""A replica floor's outcome with its reasons made when read (issue 20) is the outcome
3ecdbd8 decided with every reason formatted at once (tests/replicas_reference.py, the
oracle): the same decision, skip (its reason read), history, on a table of edge cases and
on generated floors."""

from __future__ import annotations

import math
import pickle
from dataclasses import replace

import pytest
import replicas_reference as ref
from builders import NOW, forecast, history, signal, workload_obs
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.config import ReplicasConfig
from gpuscaler.core.decisions import Skip
from gpuscaler.core.guards import Outcome, held
from gpuscaler.core.model import Signal, TargetHistory, WorkloadObservation
from gpuscaler.core.replicas import FloorStep, floor_outcome, floor_record
from gpuscaler.core.reserve import Reserve
from gpuscaler.core.skill import Skill


def _step(
    obs: WorkloadObservation,
    cfg: ReplicasConfig,
    h: TargetHistory,
    upper: float,
    observed: float,
    peak: float | None = None,
) -> FloorStep:
    return FloorStep(obs, cfg, h, NOW, upper, observed, peak)


def _same(new: Outcome, old: Outcome) -> None:
    """The same outcome to every reader: fields, `==`, records, repr, a pickle's copy."""
    if new.skip is not None:
        assert "reason" not in new.skip.__dict__  # not made before it is read
        assert pickle.loads(pickle.dumps(new.skip)) == old.skip
    assert new == old
    assert repr(new) == repr(old)
    if new.skip is not None:
        assert old.skip is not None
        assert new.skip.as_record() == old.skip.as_record()
        assert replace(new.skip, time=1.0) == replace(old.skip, time=1.0)
    if new.decision is not None:
        assert old.decision is not None
        assert new.decision.as_record() == old.decision.as_record()


def _both(step: FloorStep, skill: Skill | None, reserve: Reserve | None, peak: float) -> None:
    _same(
        floor_outcome(step, skill, reserve, peak),
        ref.floor_outcome(step, skill, reserve, peak),
    )


def _serving(obs: WorkloadObservation, per_replica: float) -> WorkloadObservation:
    return replace(obs, serving=(per_replica, "req/s"))


CFG = ReplicasConfig()
NO_SKILL = ReplicasConfig(skill_check=False)
ROWS: list[tuple[str, FloorStep, Skill | None, Reserve | None, float]] = [
    ("a hold within the tolerance", _step(workload_obs(signal(280, 300)), NO_SKILL,
     history(), 300, 280), None, None, 280.0),
    ("a raise on the upper bound", _step(workload_obs(signal(280, 490)), NO_SKILL,
     history(), 490, 280), None, None, 280.0),
    ("a hold by the stabilization window and its margin", _step(workload_obs(signal(50, 60)),
     NO_SKILL, history(recs=((100, 400),)), 60, 50), None, None, 50.0),
    ("a cooldown", _step(workload_obs(signal(280, 900)), NO_SKILL, history(changed_ago=10),
     900, 280), None, None, 280.0),
    ("a step down that frees no GPU", _step(workload_obs(signal(10, 12), floor=4, share=0.25),
     ReplicasConfig(skill_check=False, scale_down_margin=0.0), history(), 12, 10),
     None, None, 10.0),
    ("filled to whole GPUs", _step(workload_obs(signal(100, 200), floor=2, share=0.25),
     NO_SKILL, history(), 200, 100), None, None, 100.0),
    ("no skill yet: the fallback's note", _step(workload_obs(signal(280, 490)), CFG,
     history(), 490, 280), Skill(None, 3), None, 280.0),
    ("a fallback on a low score, upper unused", _step(workload_obs(signal(280, 900)), CFG,
     history(), 900, 280), Skill(0.05, 40), None, 280.0),
    ("a fallback with upper below observed", _step(workload_obs(signal(280, 200)), CFG,
     history(), 200, 280), Skill(-0.5, 40), None, 280.0),
    ("skill shown: the forecast counts", _step(workload_obs(signal(280, 900)), CFG,
     history(), 900, 280), Skill(0.9, 40), None, 280.0),
    ("a reserve that sets the replicas", _step(workload_obs(signal(100, 120)), NO_SKILL,
     history(), 120, 100), None, Reserve(900.0, 1200.0, 3), 100.0),
    ("a reserve and a fallback note", _step(workload_obs(signal(100, 120)), CFG,
     history(), 120, 100), Skill(None, 0), Reserve(900.0, 12.0, 1), 100.0),
    ("a reserve below the formula", _step(workload_obs(signal(900, 990)), NO_SKILL,
     history(), 990, 900), None, Reserve(100.0, 5.0, 1), 900.0),
    ("serving demand", _step(_serving(workload_obs(signal(40, 55)), 7.5), NO_SKILL,
     history(), 55, 40), None, Reserve(80.0, 5.0, 2), 40.0),
    ("a negative demand with a note and no reserve", _step(workload_obs(signal(-50, -40)),
     CFG, history(), -40, -50), Skill(None, 0), None, -50.0),
    ("a negative demand, no note, no reserve", _step(workload_obs(signal(-300, -200)),
     NO_SKILL, history(), -200, -300), None, None, -300.0),
    ("a floor of zero", _step(workload_obs(signal(0, 0), floor=0), NO_SKILL, history(), 0,
     0), None, None, 0.0),
    ("at the object's maximum", _step(workload_obs(signal(280, 9000), max_replicas=6),
     NO_SKILL, history(), 9000, 280), None, None, 280.0),
    ("a step down limited in GPUs", _step(workload_obs(signal(10, 12), floor=20),
     ReplicasConfig(skill_check=False, max_step_down_gpus=2, scale_down_margin=0.0),
     history(), 12, 10), None, None, 10.0),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "step", "skill", "reserve", "peak"), ROWS, ids=[r[0] for r in ROWS]
)
def test_each_edge_case_decides_and_reads_as_the_oracle_did(
    name: str, step: FloorStep, skill: Skill | None, reserve: Reserve | None, peak: float
) -> None:
    _both(step, skill, reserve, peak)


def test_a_held_floor_makes_its_reason_only_when_read() -> None:
    out = floor_outcome(*ROWS[0][1:])
    assert out.skip is not None and "reason" not in out.skip.__dict__
    assert out.skip.reason.startswith("hold: forecast upper 300% GPU")
    assert "reason" in out.skip.__dict__ and "_lazy_reason" not in out.skip.__dict__


def test_the_floor_without_a_forecast_is_the_oracles() -> None:
    """No forecast yet: the floor on the observed demand alone, its note a text."""
    load = Signal(last_sample_time=NOW - 1.0, forecast=None)
    for seen, floor in ((300.0, 4), (90.0, 4), (280.0, 4), (2000.0, 1)):
        obs = replace(workload_obs(load, floor=floor), recent_peak=seen)
        new = floor_record(obs, CFG, 120.0, history(), NOW)
        old = ref.floor_record(obs, CFG, 120.0, history(), NOW)
        assert isinstance(new, Outcome) and isinstance(old, Outcome)
        _same(new, old)


FINITE = st.floats(-50.0, 3000.0, allow_nan=False)


@st.composite
def floors(draw: st.DrawFn) -> tuple[FloorStep, Skill | None, Reserve | None, float]:
    skill_check = draw(st.booleans())
    below = draw(st.sampled_from([-0.2, 0.0, 0.1, 0.3]))
    cfg = ReplicasConfig(
        target_utilization_pct=draw(st.sampled_from([50.0, 70.0, 85.5, 100.0])),
        tolerance=draw(st.sampled_from([0.0, 0.1, 0.3])),
        min_replicas=draw(st.integers(0, 3)),
        max_replicas=draw(st.integers(3, 40)),
        scale_down_stabilization=draw(st.sampled_from(["0s", "60s", "300s"])),
        max_step_up_gpus=draw(st.sampled_from([0.5, 1.0, 4.0])),
        scale_down_margin=draw(st.sampled_from([0.0, 0.05, 0.3])),
        whole_gpus=draw(st.booleans()),
        max_step_down_gpus=draw(st.sampled_from([None, 0.5, 2.0])),
        cooldown=draw(st.sampled_from(["0s", "30s", "600s"])),
        skill_check=skill_check,
        skill_fallback_below=below,
        skill_return_above=below + draw(st.sampled_from([0.0, 0.1])),
    )
    peak, upper, observed = draw(FINITE), draw(FINITE), draw(FINITE)
    obs = workload_obs(
        Signal(last_sample_time=NOW - 1.0, forecast=forecast(max(peak, 0.0), upper)),
        floor=draw(st.integers(0, 30)),
        max_replicas=draw(st.one_of(st.none(), st.integers(1, 40))),
        share=draw(st.sampled_from([1.0, 0.5, 0.25, 1 / 3, 2.0])),
    )
    if draw(st.booleans()):
        obs = _serving(obs, draw(st.sampled_from([0.5, 7.25, 40.0])))
    recs = tuple(
        draw(st.lists(st.tuples(st.floats(0.0, 600.0), st.integers(-10, 3000)), max_size=6))
    )
    h = replace(
        history(changed_ago=draw(st.one_of(st.none(), st.floats(0.0, 900.0))), recs=recs),
        fallback=draw(st.booleans()),
    )
    skill = draw(
        st.one_of(
            st.none(),
            st.builds(Skill, st.one_of(st.none(), st.floats(-1.0, 1.0)), st.integers(0, 200)),
        )
    )
    reserve = draw(
        st.one_of(
            st.none(),
            st.builds(Reserve, FINITE, st.floats(0.0, 7200.0), st.integers(1, 50)),
        )
    )
    figure = draw(st.one_of(st.none(), FINITE))
    return _step(obs, cfg, h, upper, observed, figure), skill, reserve, draw(FINITE)


@settings(max_examples=400, deadline=None)
@given(floors())
def test_generated_floors_decide_and_read_as_the_oracle_did(
    case: tuple[FloorStep, Skill | None, Reserve | None, float],
) -> None:
    _both(*case)


@pytest.mark.parametrize(
    ("peak", "reserve"),
    [
        (math.nan, None),
        (math.nan, Reserve(math.inf, 1.0, 1)),
        (280.0, Reserve(math.inf, 1.0, 1)),
        (math.inf, Reserve(math.nan, 1.0, 1)),
    ],
)
def test_bad_numbers_fail_as_the_oracle_does(peak: float, reserve: Reserve | None) -> None:
    """The same error first, whichever of the demand and the reserve is bad."""
    step = _step(workload_obs(signal(280, 490)), NO_SKILL, history(), 490, 280)
    with pytest.raises((ValueError, OverflowError)) as old:
        ref.floor_outcome(step, None, reserve, peak)
    with pytest.raises(old.type):
        floor_outcome(step, None, reserve, peak)


def test_a_lazy_reason_is_made_once_and_equals_the_eager_skip() -> None:
    calls: list[str] = []

    def make(x: str) -> str:
        calls.append(x)
        return f"hold: {x}"

    out = held("replica_floor", "ml/chat", NOW, TargetHistory(), make, ("a",))
    assert out.skip is not None and calls == []
    eager = Skip(NOW, "replica_floor", "ml/chat", "hold: a", invalid_input=False)
    assert out.skip == eager and hash(out.skip) == hash(eager)
    assert out.skip.reason == "hold: a" and calls == ["a"]
    assert out.skip.as_record() == eager.as_record() and calls == ["a"]
