"""Three-tier preemption as pure functions: who is chosen, where, and each tier's step."""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import NOW

from gpuscaler.config import PreemptionConfig, merge_section
from gpuscaler.core.decisions import CheckpointRequest, PreemptionStep, Skip
from gpuscaler.core.preemption import (
    TRANSITIONS,
    NodeView,
    PodView,
    PreemptionObservation,
    TransitionError,
    VictimState,
    check_transition,
    decide_preemption,
)

CFG = PreemptionConfig()


def pod(name: str, node: str | None, gpus: int = 1, priority: int = 0, **kw: object) -> PodView:
    ns = str(kw.pop("namespace", "ml"))
    defaults: dict[str, object] = {
        "phase": "Running" if node else "Pending",
        "start_time": NOW - 3600,
    }
    return PodView(f"{ns}/{name}", ns, node, gpus, priority, **(defaults | kw))  # type: ignore[arg-type]


def critical(gpus: int = 2, **kw: object) -> PodView:
    return pod("critical", None, gpus, 1_000_000, unschedulable_since=NOW - 60, **kw)


def node(name: str, shares: int = 4, memory: float | None = 36.0) -> NodeView:
    return NodeView(name, shares, memory)


def _plan(
    *pods: PodView,
    nodes: tuple[NodeView, ...] = (node("n1"),),
    states: tuple[VictimState, ...] = (),
    cfg: PreemptionConfig = CFG,
    memory: dict[str, bool | None] | None = None,
) -> tuple[tuple[PreemptionStep, ...], tuple[Skip, ...]]:
    obs = PreemptionObservation(pods, nodes, states, memory or {})
    return decide_preemption(obs, cfg, NOW)


def _victims(decisions: tuple[PreemptionStep, ...]) -> list[str]:
    return sorted(d.target for d in decisions if d.to_value == "soft")


# --------------------------------------------------------------------------- who and where

FULL_N1 = (pod("a", "n1", 2, 100), pod("b", "n1", 1, 50), pod("c", "n1", 1, 10))


CHOICES = {
    "the fewest low-priority victims that make room, most important given back first":
        ((critical(), *FULL_N1), (node("n1"),), ["ml/b", "ml/c"], ""),
    "one share needed: only the lowest priority goes":
        ((critical(1), *FULL_N1), (node("n1"),), ["ml/c"], ""),
    "the node whose highest victim priority is lowest": (
        (critical(), pod("a", "n1", 2, 100), pod("b", "n1", 2, 50),
         pod("x", "n2", 2, 10), pod("y", "n2", 2, 20)),
        (node("n1"), node("n2")), ["ml/x"], ""),
    "the node with the fewest PDB violations": (
        (critical(), pod("a", "n1", 2, 10, pdb_blocked=True), pod("b", "n1", 2, 10),
         pod("x", "n2", 2, 10, pdb_blocked=True), pod("y", "n2", 2, 10, pdb_blocked=True)),
        (node("n1"), node("n2")), ["ml/b"], ""),
    "the node with the fewest victims when priorities tie": (
        (critical(), pod("a", "n1", 1, 10), pod("b", "n1", 1, 10), pod("c", "n1", 2, 10),
         pod("x", "n2", 2, 10), pod("y", "n2", 2, 10)),
        (node("n1"), node("n2")), ["ml/c"], ""),
    "the victim with the freshest checkpoint loses least work": (
        (critical(2), pod("old", "n1", 2, 10, checkpoint_at=NOW - 3000),
         pod("new", "n1", 2, 10, checkpoint_at=NOW - 60)),
        (node("n1"),), ["ml/new"], ""),
    "protected namespaces are never victims": (
        (critical(), pod("a", "n1", 2, 10, namespace="kube-system"),
         pod("b", "n1", 2, 10, namespace="gpuscaler")),
        (node("n1"),), [], "would not fit"),
    "pods at or above victim_max_priority are never victims": (
        (critical(), pod("a", "n1", 2, 20_000), pod("b", "n1", 2, 20_000)),
        (node("n1"),), [], "would not fit"),
    "a pod that opted out is spared even when it is the better victim": (
        (critical(), pod("a", "n1", 2, 1, opted_out=True), pod("b", "n1", 2, 10)),
        (node("n1"),), ["ml/b"], ""),
    "freeing everything preemptible would not fit it":
        ((critical(gpus=5), *FULL_N1), (node("n1"),), [], "preemptible < 5"),
    "a multi-GPU pod larger than a NUMA domain": (
        (critical(gpus=3), *FULL_N1), (NodeView("n1", 4, 36.0, numa_domain_shares=2),), [],
        "3 shares do not fit one NUMA domain"),
    "a share too small for its GPU memory":
        ((critical(gpu_memory_gib=40), *FULL_N1), (node("n1"),), [], "36.0 GiB, 40 GiB needed"),
    "a free share already: the scheduler will place it":
        ((critical(), pod("a", "n1", 2, 10)), (node("n1"),), [], "has 2 free share(s) already"),
    "a beneficiary whose PriorityClass never preempts":
        ((critical(preemption_never=True), *FULL_N1), (node("n1"),), [], None),
    "pending for less than pending_for":
        ((replace(critical(), unschedulable_since=NOW - 5), *FULL_N1), (node("n1"),), [], None),
    "below beneficiary_min_priority":
        ((replace(critical(), priority=999_999), *FULL_N1), (node("n1"),), [], None),
}  # fmt: skip


@pytest.mark.parametrize(("pods", "nodes", "victims", "why"), CHOICES.values(), ids=list(CHOICES))
def test_victims_and_node_are_chosen_like_kube_scheduler_but_only_where_it_really_fits(
    pods: tuple[PodView, ...], nodes: tuple[NodeView, ...], victims: list[str], why: str | None
) -> None:
    decisions, skips = _plan(*pods, nodes=nodes)
    assert _victims(decisions) == victims
    if why is None:
        assert decisions == () and skips == ()
    elif why:
        assert any(why in s.reason for s in skips), skips
    for d in decisions:
        assert isinstance(d, CheckpointRequest) and d.action == "request_checkpoint"
        assert d.beneficiary == "ml/critical"


def test_limits_bound_victims_in_flight_and_per_hour() -> None:
    busy = tuple(
        VictimState(f"ml/v{i}", "ml/other", "n9", 1, 0, "cleanup", NOW - 10, NOW - 600)
        for i in range(2)
    )
    _, skips = _plan(critical(), *FULL_N1, states=busy)
    assert any("limits leave 0" in s.reason for s in skips)
    done = tuple(
        VictimState(f"ml/v{i}", "ml/other", "n9", 1, 0, "done", NOW - 10, NOW - 600)
        for i in range(10)
    )
    _, skips = _plan(critical(), *FULL_N1, states=done)
    assert any("max_per_hour 10" in s.reason for s in skips)
    old = tuple(replace(s, requested_at=NOW - 4000) for s in done)
    decisions, _ = _plan(critical(), *FULL_N1, states=old)
    assert _victims(decisions) == ["ml/b", "ml/c"]


def test_a_victim_given_up_is_not_chosen_again_and_another_is() -> None:
    gave_up = VictimState("ml/c", "ml/critical", "n1", 1, 10, "given_up", NOW - 10, NOW - 400)
    decisions, _ = _plan(critical(1), *FULL_N1, states=(gave_up,))
    assert _victims(decisions) == ["ml/b"]


def test_a_beneficiary_with_victims_under_way_gets_no_new_ones() -> None:
    state = VictimState("ml/c", "ml/critical", "n1", 1, 10, "soft", NOW - 10, NOW - 10)
    decisions, _ = _plan(critical(), *FULL_N1, states=(state,))
    assert _victims(decisions) == []


# --------------------------------------------------------------------------- tiers

SOFT = VictimState("ml/c", "ml/critical", "n1", 1, 10, "soft", NOW - 30, NOW - 30)
HARD = replace(SOFT, tier="hard", since=NOW - 20)
CLEANUP = replace(SOFT, tier="cleanup", since=NOW - 30, gone_at=NOW - 30)
VICTIM = V = pod("c", "n1", 1, 10)
C = critical()


def tier(
    state: VictimState, pods: tuple[PodView, ...], expect: tuple[str, ...], memory: object = None
) -> tuple[object, ...]:
    return state, pods, memory or {}, expect


TIERS = {
    "soft: waiting for the checkpoint":
        tier(SOFT, (C, V), ("hold", "soft tier, 270s left")),
    "soft: grace over, evict":
        tier(replace(SOFT, since=NOW - 301), (C, V), ("hard", "evict", "soft grace 300s over")),
    "soft: checkpoint acknowledged early, evict now": tier(
        SOFT, (C, replace(V, checkpoint_done_at=NOW - 5)),
        ("hard", "evict", "checkpoint acknowledged after 25s")),
    "soft: an acknowledgement older than the request does not count":
        tier(SOFT, (C, replace(V, checkpoint_done_at=NOW - 100)), ("hold", "soft tier")),
    "soft: the victim exited by itself":
        tier(SOFT, (C,), ("cleanup", "record_gone", "exited during the soft tier")),
    "soft: the beneficiary was scheduled elsewhere":
        tier(SOFT, (replace(C, node="n2"), V), ("aborted", "abort", "was scheduled on n2")),
    "soft: the beneficiary is gone":
        tier(SOFT, (V,), ("aborted", "abort", "is gone")),
    "hard: evict":
        tier(HARD, (C, V), ("hard", "evict", "attempt 1")),
    "hard: terminating, wait": tier(
        replace(HARD, evicted_at=NOW - 5), (C, replace(V, terminating_since=NOW - 5)),
        ("hold", "terminating for 5s")),
    "hard: stuck terminating, force-delete": tier(
        replace(HARD, evicted_at=NOW - 400), (C, replace(V, terminating_since=NOW - 301)),
        ("hard", "force_delete", "stuck Terminating for 301s")),
    "hard: a PDB refused, wait before retrying":
        tier(replace(HARD, attempts=1, last_attempt_at=NOW - 10), (C, V), ("hold", "retry in 20s")),
    "hard: retry the eviction":
        tier(replace(HARD, attempts=1, last_attempt_at=NOW - 31), (C, V), ("hard", "evict", "attempt 2")),
    "hard: a PDB kept refusing, give up": tier(
        replace(HARD, attempts=4, last_attempt_at=NOW - 31), (C, V),
        ("given_up", "give_up", "refused 4 times")),
    "hard: gone, check memory":
        tier(replace(HARD, evicted_at=NOW - 5), (C,), ("cleanup", "record_gone", "victim is gone")),
    "cleanup: memory released":
        tier(CLEANUP, (C,), ("done", "confirm_released", "GPU memory released"), {"ml/c": True}),
    "cleanup: memory held, still within the timeout":
        tier(CLEANUP, (C,), ("hold", "30s for GPU memory release"), {"ml/c": False}),
    "cleanup: memory held past the timeout, quarantine": tier(
        replace(CLEANUP, since=NOW - 121), (C,), ("quarantined", "quarantine", "node n1 tainted"),
        {"ml/c": False}),
    "cleanup: a missing metric never quarantines": tier(
        replace(CLEANUP, since=NOW - 121), (C,), ("done", "confirm_released", "not verified"),
        {"ml/c": None}),
}  # fmt: skip


@pytest.mark.parametrize(("state", "pods", "memory", "expect"), TIERS.values(), ids=list(TIERS))
def test_each_tier_takes_its_next_step(
    state: VictimState,
    pods: tuple[PodView, ...],
    memory: dict[str, bool | None],
    expect: tuple[str, ...],
) -> None:
    decisions, skips = _plan(*pods, states=(state,), memory=memory)
    mine = [d for d in decisions if d.target == "ml/c"]
    if expect[0] == "hold":
        assert mine == []
        assert any(expect[1] in s.reason for s in skips if s.target == "ml/c"), skips
        return
    (d,) = mine
    assert d.from_value == state.tier and d.to_value == expect[0]
    assert d.action == expect[1]
    assert expect[2] in d.reason, d.reason


def test_a_pdb_refusal_leads_to_escalation_only_when_configured() -> None:
    state = replace(HARD, attempts=4, last_attempt_at=NOW - 31)
    decisions, _ = _plan(
        critical(), VICTIM, states=(state,), cfg=replace_cfg(escalate_to_delete=True)
    )
    assert [(d.to_value, d.action) for d in decisions] == [("hard", "delete")]


def replace_cfg(**kw: object) -> PreemptionConfig:
    return merge_section(CFG, kw, PreemptionConfig)


def test_the_transition_table_allows_no_way_back() -> None:
    for old, new in [("hard", "soft"), ("cleanup", "hard"), ("done", "soft"), ("none", "hard")]:
        with pytest.raises(TransitionError):
            check_transition(old, new)
    assert all(not TRANSITIONS[t] for t in ("done", "aborted", "given_up", "quarantined"))


def test_nothing_is_decided_when_the_cluster_could_not_be_read() -> None:
    obs = PreemptionObservation((critical(), *FULL_N1), (node("n1"),), problem="HTTP 500")
    decisions, skips = decide_preemption(obs, CFG, NOW)
    assert decisions == () and skips[0].invalid_input


def _forecast_plan(floor: int, replicas: int, trigger: bool = True) -> tuple[PreemptionStep, ...]:
    """plan() on a workload whose floor asks for replicas that do not exist yet, on a full
    pool of low-priority pods."""
    from builders import config as make_config
    from builders import signal, workload_obs

    from gpuscaler.core.model import History, Snapshot
    from gpuscaler.core.plan import plan

    config = make_config(
        f"""
preemption: {{forecast_trigger: {str(trigger).lower()}}}
node_pools: [{{name: a100, gpu_memory_gib: 80, selector: {{label: l, value: v}}}}]
workloads: [{{namespace: ml, kind: ScaledObject, name: chat, node_pool: a100, priority: 1000000}}]
"""
    )
    # no replica decision this tick (its load is unreadable): the floor in force counts
    obs = replace(workload_obs(signal(None, problem="x"), floor=floor), replicas=replicas)
    nodes = (NodeView("n1", 4, 36.0, pool="a100"), NodeView("other", 8, 36.0, pool="h100"))
    snapshot = Snapshot(NOW, workloads=(obs,), preemption=PreemptionObservation(FULL_N1, nodes))
    return tuple(
        d for d in plan(snapshot, config, History(), NOW).decisions if isinstance(d, PreemptionStep)
    )


AHEAD = {
    "one replica the floor asks for and the pool cannot hold": (3, 2, True, ["ml/c"]),
    "two such replicas": (4, 2, True, ["ml/b", "ml/c"]),
    "every replica exists: nothing ahead of time": (2, 2, True, []),
    "the forecast trigger switched off": (3, 2, False, []),
}


@pytest.mark.parametrize(
    ("floor", "replicas", "trigger", "victims"), AHEAD.values(), ids=list(AHEAD)
)
def test_the_forecast_trigger_frees_room_ahead_of_time_only_in_the_workloads_pool(
    floor: int, replicas: int, trigger: bool, victims: list[str]
) -> None:
    decisions = _forecast_plan(floor, replicas, trigger)
    assert sorted(d.target for d in decisions) == victims
    for d in decisions:
        assert d.reason.startswith("forecast: ml/ScaledObject/chat needs one more replica")
        assert d.node == "n1"


@pytest.mark.parametrize(("trigger", "victims"), [(True, ["ml/b", "ml/c"]), (False, [])])
def test_the_fragments_trigger_preempts_what_fewer_fragments_cannot_hold(
    trigger: bool, victims: list[str]
) -> None:
    from builders import config as make_config
    from builders import pool_obs, signal

    from gpuscaler.core.model import History, Snapshot
    from gpuscaler.core.plan import plan

    config = make_config(
        f"""
preemption: {{fragments_trigger: {str(trigger).lower()}}}
fragments: {{sustain: 0s}}
node_pools: [{{name: a100, gpu_memory_gib: 80, selector: {{label: l, value: v}}}}]
"""
    )
    # One GPU at 4 fragments holding 4 shares, 92 % busy: 2 fragments need 2 shares freed.
    hot = pool_obs(signal(92.0), fragments=4, held=4)
    pods = (pod("a", "n1", 2, 100), pod("b", "n1", 1, 50), pod("c", "n1", 1, 10))
    nodes = (NodeView("n1", 4, 18.0, pool="a100"),)
    snapshot = Snapshot(NOW, pools=(hot,), preemption=PreemptionObservation(pods, nodes))
    result = plan(snapshot, config, History(), NOW)
    chosen = sorted(d.target for d in result.decisions if d.kind == "preemption")
    assert any("needs preemption first" in s.reason for s in result.skips)
    assert chosen == victims  # priorities 50 and 10 go, 100 keeps its 2 shares
    for d in result.decisions:
        if d.kind == "preemption":
            assert "fewer fragments on n1 (2 shares)" in d.reason
