"""Preemption for pods waiting on DRA GPU claims: whole devices are freed, a device
shared by several claims only when all its holders go, and a victim's devices count as
free only once its claims released them."""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import NOW

from gpuscaler.config import PreemptionConfig
from gpuscaler.core.decisions import CheckpointRequest
from gpuscaler.core.preemption import (
    DeviceHold,
    NodeView,
    PodView,
    PreemptionObservation,
    VictimState,
    decide_preemption,
)

CFG = PreemptionConfig()
DEVICES = tuple(f"gpu.nvidia.com/d1/gpu-{i}" for i in range(2))


def holder(name: str, priority: int, *gpus: int, share: float = 1.0, **kw: object) -> PodView:
    holds = tuple(
        DeviceHold("gpu.nvidia.com", "d1", f"gpu-{i}", f"ml/{name}-c", "d1", share) for i in gpus
    )
    ns = str(kw.pop("namespace", "ml"))
    return PodView(
        f"{ns}/{name}", ns, "d1", len(holds), priority, "Running", NOW - 3600,
        devices=holds, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def waiting(devices: int = 1) -> PodView:
    return PodView(
        "ml/critical", "ml", None, devices, 1_000_000, "Pending",
        unschedulable_since=NOW - 60, wanted_devices=devices,
    )  # fmt: skip


def dra_node(allocated: tuple[int, ...]) -> NodeView:
    return NodeView(
        "d1", 2, 36.0, devices=DEVICES, allocated=frozenset(DEVICES[i] for i in allocated)
    )


BOTH = (0, 1)
CHOICES = {
    "the lowest priority holder of one device goes":
        ((holder("a", 10, 0), holder("b", 50, 1)), BOTH, 1, ["ml/a"], "gpu.nvidia.com/d1/gpu-0"),
    "two devices wanted: both holders go":
        ((holder("a", 10, 0), holder("b", 50, 1)), BOTH, 2, ["ml/a", "ml/b"], "gpu-1"),
    "a shared device is freed only when every sharer goes": (
        (holder("x", 10, 0, share=0.5), holder("y", 5, 0, share=0.5, opted_out=True),
         holder("z", 20, 1)), BOTH, 1, ["ml/z"], "gpu-1"),
    "the sharers of one device go together when they are the better victims": (
        (holder("x", 10, 0, share=0.5), holder("y", 10, 0, share=0.5), holder("z", 20, 1)),
        BOTH, 1, ["ml/x", "ml/y"], "gpu-0"),
    "a PDB-protected holder is spared for another":
        ((holder("a", 10, 0, pdb_blocked=True), holder("b", 10, 1)), BOTH, 1, ["ml/b"], "gpu-1"),
    "a protected namespace's holder is never chosen": (
        (holder("a", 10, 0, namespace="kube-system"), holder("b", 10, 1, namespace="kube-system")),
        BOTH, 1, [], "0 free + 0 freeable DRA device(s) < 1"),
    "a device allocated to no pod seen is neither free nor freeable":
        ((holder("b", 10, 1),), BOTH, 2, [], "0 free + 1 freeable DRA device(s) < 2"),
    "a device nobody holds: the scheduler can place it":
        ((holder("b", 10, 1),), (1,), 1, [], "1 free DRA device(s) already"),
}  # fmt: skip


@pytest.mark.parametrize(
    ("pods", "allocated", "wanted", "victims", "why"), CHOICES.values(), ids=list(CHOICES)
)
def test_victims_free_whole_devices_matching_the_waiting_claim(
    pods: tuple[PodView, ...], allocated: tuple[int, ...], wanted: int, victims: list[str], why: str
) -> None:
    obs = PreemptionObservation((waiting(wanted), *pods), (dra_node(allocated),))
    decisions, skips = decide_preemption(obs, CFG, NOW)
    assert sorted(d.target for d in decisions) == victims
    for d in decisions:
        assert isinstance(d, CheckpointRequest)
        assert f"{wanted} DRA GPU device(s)" in d.reason
    reasons = [d.reason for d in decisions] + [s.reason for s in skips]
    assert any(why in r for r in reasons), reasons


def test_a_share_beneficiary_on_a_plugin_node_is_unaffected_by_dra_fields() -> None:
    pods = (
        PodView("ml/critical", "ml", None, 2, 1_000_000, "Pending", unschedulable_since=NOW - 60),
        PodView("ml/a", "ml", "n1", 2, 10, "Running", NOW - 3600),
        PodView("ml/b", "ml", "n1", 2, 100, "Running", NOW - 3600),
    )
    decisions, _ = decide_preemption(
        PreemptionObservation(pods, (NodeView("n1", 4, 36.0),)), CFG, NOW
    )
    assert [d.target for d in decisions] == ["ml/a"]
    assert "frees room" in decisions[0].reason


CLEANUP = VictimState("ml/a", "ml/critical", "d1", 1, 10, "cleanup", NOW - 30, NOW - 60, uid="u-a")
RELEASE = {
    "its claim still reserved for it: wait":
        (CLEANUP, {"u-a"}, None, ("hold", "DRA claim still holds its GPU(s), 30s")),
    "still reserved past the timeout: closed, not verified": (
        replace(CLEANUP, since=NOW - 121), {"u-a"}, True,
        ("done", "DRA claim still holds its GPU(s) 121s after it left: not verified")),
    "released and its memory too: done":
        (CLEANUP, {"u-other"}, True, ("done", "GPU memory released")),
    "a record without a UID is not held back by others' claims":
        (replace(CLEANUP, uid=""), {""}, True, ("done", "GPU memory released")),
}  # fmt: skip


@pytest.mark.parametrize(
    ("state", "holders", "memory", "expect"), RELEASE.values(), ids=list(RELEASE)
)
def test_a_victims_devices_count_as_free_only_once_its_claims_are_released(
    state: VictimState, holders: set[str], memory: bool | None, expect: tuple[str, str]
) -> None:
    obs = PreemptionObservation(
        (waiting(),), (dra_node(()),), (state,), {"ml/a": memory}, frozenset(holders)
    )
    decisions, skips = decide_preemption(obs, CFG, NOW)
    if expect[0] == "hold":
        assert decisions == ()
        assert any(expect[1] in s.reason for s in skips if s.target == "ml/a"), skips
        return
    (d,) = decisions
    assert (d.to_value, d.action) == ("done", "confirm_released")
    assert expect[1] in d.reason


def test_a_mixed_cluster_plans_shares_on_the_plugin_node_and_devices_on_the_dra_node() -> None:
    """One tick, two beneficiaries: a pod asking for plugin shares and one waiting on a DRA
    claim; each gets victims on the node of its own kind (the DRA node's holder of priority
    50 would rank before the plugin node's 60, were a plugin pod able to use its GPUs)."""
    plugin_waiting = PodView(
        "ml/shares", "ml", None, 1, 1_000_000, "Pending", unschedulable_since=NOW - 60
    )
    pods = (
        waiting(),
        plugin_waiting,
        holder("a", 10, 0),
        holder("b", 50, 1),
        PodView("ml/p", "ml", "n1", 4, 60, "Running", NOW - 3600),
    )
    nodes = (replace(dra_node(BOTH), plugin=False), NodeView("n1", 4, 36.0))
    decisions, _ = decide_preemption(PreemptionObservation(pods, nodes), CFG, NOW)
    assert sorted((d.beneficiary, d.target, d.node) for d in decisions) == [
        ("ml/critical", "ml/a", "d1"),
        ("ml/shares", "ml/p", "n1"),
    ]


GIB = float(1 << 30)
SHARED = {DEVICES[0]: {"memory": 40 * GIB}}
SHARERS = (holder("x", 10, 0, share=0.5), holder("y", 20, 0, share=0.5), holder("z", 50, 1))
SHARES = {
    "a share fits beside the sharer left: one sharer goes": (SHARED, 20, ["ml/x"]),
    "a share too large beside either sharer: both go": (SHARED, 30, ["ml/x", "ml/y"]),
    "a device that does not allow sharing is freed whole even for a share": ({}, 20, ["ml/x", "ml/y"]),
}  # fmt: skip


@pytest.mark.parametrize(("shared", "gib", "victims"), SHARES.values(), ids=list(SHARES))
def test_a_claim_asking_for_part_of_a_device_frees_only_that_part(
    shared: dict[str, dict[str, float]], gib: int, victims: list[str]
) -> None:
    beneficiary = replace(waiting(), wanted_capacity={"memory": gib * GIB})
    node = replace(dra_node(BOTH), shared=shared)
    decisions, _ = decide_preemption(
        PreemptionObservation((beneficiary, *SHARERS), (node,)), CFG, NOW
    )
    assert sorted(d.target for d in decisions) == victims
    assert all("gpu.nvidia.com/d1/gpu-0" in d.reason for d in decisions)
