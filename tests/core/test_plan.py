"""The planner as a whole: composition, unconfigured targets, history, purity."""

from __future__ import annotations

from dataclasses import replace

from builders import NOW, config, pool_obs, signal, workload_obs

from gpuscaler.core.decisions import target_key
from gpuscaler.core.model import History, Snapshot, record_applied
from gpuscaler.core.plan import plan
from gpuscaler.core.snapshot import Observations, RawPool, RawWorkload, build_snapshot

CONFIG = config(
    """
fragments: {sustain: 0s}
node_pools:
  - {name: a100, selector: {label: nvidia.com/gpu.product, value: A100}, gpu_memory_gib: 80}
workloads:
  - {namespace: ml, kind: ScaledObject, name: chat, node_pool: a100}
"""
)
SNAP = Snapshot(
    NOW, (pool_obs(signal(90, 95), stall=20),), (workload_obs(signal(280, 490), floor=2),)
)


def test_a_plan_holds_one_outcome_per_configured_target() -> None:
    p = plan(SNAP, CONFIG, History(), NOW)
    kinds = sorted(d.kind for d in p.decisions)
    assert kinds == ["fragments", "replica_floor", "time_slice"]
    assert p.skips == ()


def test_targets_not_in_the_config_are_never_touched() -> None:
    stranger = replace(pool_obs(signal(90, 95), stall=20), name="not-configured")
    snap = Snapshot(
        NOW, (stranger,), (replace(workload_obs(signal(280, 490)), key="x/ScaledObject/y"),)
    )
    p = plan(snap, CONFIG, History(), NOW)
    assert p.decisions == ()
    assert {s.target for s in p.skips} == {"a100", "ml/ScaledObject/chat"}  # configured, unseen


def test_configured_targets_with_no_observation_are_skipped_with_a_reason() -> None:
    p = plan(Snapshot(NOW), CONFIG, History(), NOW)
    assert p.decisions == ()
    assert len(p.skips) == 3 and all(s.invalid_input for s in p.skips)
    assert all("no observation" in s.reason for s in p.skips)


def test_planning_is_deterministic_and_leaves_its_inputs_alone() -> None:
    history = History()
    a, b = plan(SNAP, CONFIG, history, NOW), plan(SNAP, CONFIG, history, NOW)
    assert [d.as_record() for d in a.decisions] == [d.as_record() for d in b.decisions]
    assert dict(history.targets) == {}


def test_only_applied_decisions_start_a_cooldown() -> None:
    p = plan(SNAP, CONFIG, History(), NOW)
    frag = next(d for d in p.decisions if d.kind == "fragments")
    after = record_applied(p.history, (frag,))
    assert after.get(target_key("fragments", "a100")).last_change_at == NOW
    assert after.get(target_key("fragments", "a100")).last_direction == -1
    assert after.get(target_key("replica_floor", "ml/ScaledObject/chat")).last_change_at is None


def test_a_source_problem_reaches_the_plan_as_a_reason_and_no_action() -> None:
    down = "Prometheus: connection refused"
    pool = RawPool("a100", None, None, 4, "medium", problem=down)
    raw = Observations(
        NOW, (pool,), (RawWorkload("ml/ScaledObject/chat", None, 4, 4, problem=down),)
    )
    p = plan(build_snapshot(raw, CONFIG, NOW)[0], CONFIG, History(), NOW)
    assert p.decisions == ()
    assert all("connection refused" in s.reason or "stall" in s.reason for s in p.skips)
    assert all(s.invalid_input for s in p.skips)


def _fragments_outcome(floor: int, share: float, load: float) -> str:
    """The fragment decision's text for a pool of 4 GPUs at 4 fragments (demand 15 % of
    each), whose workload's floor of `floor` replicas on `share` of a GPU each is sized
    for `load` percent of a GPU this tick."""
    pool = replace(pool_obs(signal(10, 15), fragments=4, stall=5), gpus_held=4)
    work = workload_obs(signal(load, load), floor=floor, share=share)
    p = plan(Snapshot(NOW, (pool,), (work,)), CONFIG, History(), NOW)
    frag = [d.reason for d in p.decisions if d.kind == "fragments"]
    frag += [s.reason for s in p.skips if s.kind == "fragments"]
    return frag[0]


def test_fragments_do_not_double_while_the_replica_floor_holds_the_pools_gpus() -> None:
    # 16 quarter-GPU replicas sized for 280 % of a GPU (at 70 % each: the reserve or the
    # observed demand): 4 GPUs, which 8 fragments would fill again with 32 replicas.
    assert "the replica floor holds 4 of the 4 GPUs" in _fragments_outcome(16, 0.25, 280)
    # A floor that min_replicas sets (1 replica) moves with the fragments: they double.
    assert "4 -> 8 fragments" in _fragments_outcome(1, 0.25, 10)
