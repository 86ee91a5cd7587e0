"""A victim is its UID, never its name (a StatefulSet recreates a pod under the same name:
records carry the UID, a same-name pod with another is the victim gone, and evictions carry
`preconditions.uid`); every waiting tier has a way out."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from builders import NOW
from kubefake import FakeCluster
from kubeobjects import gpu_pod
from test_kube_preemption import CONFIG, Api, Tick, _evictions, _seed, _state
from test_preemption import CFG, _plan, critical, node, pod

from gpuscaler.adapters.kube.actuator import kube_actuator
from gpuscaler.adapters.kube.eviction import KubePreemption
from gpuscaler.core.decisions import CheckpointRequest, PreemptionStep, Skip
from gpuscaler.core.preemption import VictimState

T0 = 1_800_000_000.0
VICTIM_UID = "11111111-1111-1111-1111-111111111111"


def _record(tier: str, uid: str = VICTIM_UID, **kw: Any) -> VictimState:
    base = VictimState("ml/b", "ml/critical", "n1", 1, 50, tier, NOW - 30, NOW - 400, uid=uid)
    return replace(base, **kw)


def _only(
    decisions: tuple[PreemptionStep, ...], skips: tuple[Skip, ...], target: str = "ml/b"
) -> str:
    for d in decisions:
        if d.target == target:
            return f"{d.to_value}:{d.action}:{d.reason}"
    return "hold:" + next(s.reason for s in skips if s.target == target)


@pytest.mark.parametrize(
    ("record", "step"),
    [
        (_record("soft"), "cleanup:record_gone:victim exited during the soft tier"),
        (_record("hard"), "cleanup:record_gone:victim is gone"),
        (_record("hard", evicted_at=NOW - 5), "cleanup:record_gone:victim is gone"),
    ],
)
def test_a_same_name_pod_with_another_uid_ends_the_record_without_touching_it(
    record: VictimState, step: str
) -> None:
    replacement = pod("b", "n1", 1, 50, uid="22222222-0000-0000-0000-000000000000")
    out = _only(*_plan(critical(1), replacement, states=(record,)))
    assert out.startswith(step) and "UID 22222222" in out, out


def test_a_record_written_before_uids_were_kept_still_matches_by_name() -> None:
    same = pod("b", "n1", 1, 50, uid="whatever")
    out = _only(*_plan(critical(1), same, states=(_record("hard", uid=""),)))
    assert out.startswith("hard:evict:"), out


def test_an_eviction_that_never_starts_terminating_closes_the_record_after_the_timeout() -> None:
    victim = pod("b", "n1", 1, 50, uid=VICTIM_UID)
    timeout = CFG.terminating_timeout
    rows = [
        (timeout - 1, "hold:wait: evicted"),
        (timeout, "given_up:give_up:evicted"),
        (timeout * 20, "given_up:give_up:evicted"),
    ]
    for waited, expect in rows:
        record = _record("hard", evicted_at=NOW - waited, attempts=1)
        out = _only(*_plan(critical(1), victim, nodes=(node("n1"),), states=(record,)))
        assert out.startswith(expect), (waited, out)


def test_new_victims_are_recorded_with_their_uid() -> None:
    victim = pod("b", "n1", 4, 50, uid=VICTIM_UID)
    decisions, _ = _plan(critical(1), victim)
    assert [(d.target, d.uid if isinstance(d, CheckpointRequest) else None) for d in decisions] == [
        ("ml/b", VICTIM_UID)
    ]


def _recreate(fake: FakeCluster) -> str:
    """The StatefulSet controller: a new pod named batch/train, with a new UID."""
    fresh = gpu_pod("train", "gpu-0", 2, namespace="batch", priority=10)
    fresh["metadata"]["labels"] = {"app": "train"}
    added = fake.add("v1", "pods", fresh)
    uid: str = added["metadata"]["uid"]
    return uid


def test_a_replacement_pod_is_not_evicted_after_a_crash_between_eviction_and_record(
    api: Api,
) -> None:
    _, fake = api
    _seed(fake)
    Tick(api)(T0)
    first_uid = _state(fake)["uid"]
    assert first_uid, "the record carries the victim's UID"
    # The eviction goes through, then the controller dies before recording it.
    fake.fail_next("PATCH", "/configmaps/gpuscaler-preemptions$", 500, after=1)
    Tick(api)(T0 + 301)
    assert _state(fake)["evicted_at"] is None
    assert fake.get("v1", "pods", "batch", "train") is None
    new_uid = _recreate(fake)
    assert new_uid != first_uid
    tiers = []
    for t in (T0 + 320, T0 + 350, T0 + 500, T0 + 700):
        Tick(api)(t)
        tiers.append(_state(fake)["tier"])
    assert tiers[0] == "cleanup" and tiers[-1] == "done", tiers
    replacement = fake.get("v1", "pods", "batch", "train")
    assert replacement is not None and replacement["metadata"]["uid"] == new_uid
    # Exactly one eviction of batch/train; the node stays full (the replacement holds the
    # shares), so the still-pending pod rightly goes on to the next victim, batch/keep.
    assert fake.answered("POST", r"/pods/train/eviction$", 201) == 1


def test_a_stale_eviction_reaching_a_replacement_is_refused_by_the_uid_precondition(
    api: Api,
) -> None:
    _, fake = api
    _seed(fake)
    tick = Tick(api)
    tick(T0)
    # Between this tick's read and its eviction the pod is replaced: the decision is stale.
    fake.objects.pop(("v1", "pods", "batch", "train"))
    new_uid = _recreate(fake)
    stored = VictimState(**_state(fake))
    assert stored.uid != new_uid
    preemption = kube_actuator(api[0], CONFIG, "test", may_act=lambda: True).preemption
    assert isinstance(preemption, KubePreemption)
    assert preemption._evict(stored, 30) is True  # 409: not our pod, treated as gone
    replacement = fake.get("v1", "pods", "batch", "train")
    assert replacement is not None and replacement["metadata"]["uid"] == new_uid
    assert fake.answered("POST", r"/eviction$", 409) == 1
    assert len(_evictions(fake)) == 1
