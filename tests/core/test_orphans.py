"""Which GPU processes are orphans: the cgroup parser (kubelet's naming, both drivers, both
cgroup versions) and the grace / SIGTERM / SIGKILL decisions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuscaler.core.orphans import (
    CgroupOwner,
    GpuProc,
    OrphanMemory,
    OrphanPolicy,
    orphan_actions,
    pod_uid_from_cgroup,
    trusted_pods,
)

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
ESC = UID.replace("-", "_")
STATIC = "6c8b8ed0a3e04d1c0c5f8b6c5b5c0b9b"  # a static pod: the manifest hash

# Path forms from kubelet (kubernetes/kubernetes pkg/kubelet/cm/cgroup_manager_linux.go,
# ToSystemd / escapeSystemdCgroupName; pod_container_manager_linux.go, "pod" + UID).
CASES = [
    ("cgroup v2, systemd, burstable", "pod", UID,
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{ESC}.slice/cri-containerd-abc.scope"),
    ("cgroup v2, systemd, guaranteed", "pod", UID,
     f"0::/kubepods.slice/kubepods-pod{ESC}.slice/crio-abc.scope"),
    ("cgroup v2, systemd, besteffort", "pod", UID,
     f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{ESC}.slice/docker-abc.scope"),
    ("cgroup v2, cgroupfs, burstable", "pod", UID, f"0::/kubepods/burstable/pod{UID}/abc"),
    ("cgroup v2, cgroupfs, guaranteed", "pod", UID, f"0::/kubepods/pod{UID}/abc"),
    ("cgroup v1, cgroupfs", "pod", UID,
     f"12:memory:/kubepods/besteffort/pod{UID}/abc\n11:devices:/kubepods/besteffort/pod{UID}/abc\n1:name=systemd:/kubepods/besteffort/pod{UID}/abc"),
    ("cgroup v1, systemd", "pod", UID,
     f"4:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{ESC}.slice/cri-containerd-abc.scope\n2:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{ESC}.slice/cri-containerd-abc.scope"),
    ("cgroup v2 seen from a private cgroup namespace", "pod", UID,
     f"0::/../../kubepods-besteffort-pod{ESC}.slice/cri-containerd-abc.scope"),
    ("a runtime cgroupsPath slice:prefix:id, not a kubelet path: reported", "unknown", None,
     f"0::/system.slice/containerd.service/kubepods-burstable-pod{ESC}.slice:cri-containerd:abc"),
    ("a static pod's hash UID", "pod", STATIC, f"0::/kubepods/burstable/pod{STATIC}/abc"),
    ("persistenced, a host service", "host", None, "0::/system.slice/nvidia-persistenced.service"),
    ("the MPS control daemon", "host", None, "0::/system.slice/nvidia-mps.service"),
    ("a login shell", "host", None, "0::/user.slice/user-1000.slice/session-3.scope"),
    ("init", "host", None, "0::/init.scope"),
    ("the root cgroup", "host", None, "0::/"),
    ("a plain docker container", "host", None, "0::/docker/0123456789abcdef"),
    ("kubepods but no pod segment", "unknown", None, "0::/kubepods/burstable/abc"),
    ("kubepods with a malformed UID", "unknown", None, "0::/kubepods/burstable/pod1234/abc"),
    ("two pods in one file", "unknown", None,
     f"12:memory:/kubepods/pod{UID}/a\n11:devices:/kubepods/pod{STATIC}/a"),
    ("empty file", "unknown", None, ""),
    ("not cgroup lines", "unknown", None, "hello world"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "kind", "uid", "text"), CASES, ids=[c[0] for c in CASES])
def test_a_cgroup_file_gives_the_pod_uid_or_says_why_not(
    name: str, kind: str, uid: str | None, text: str
) -> None:
    owner = pod_uid_from_cgroup(text)
    assert (owner.kind, owner.pod_uid) == (kind, uid), owner.reason
    if kind == "unknown":
        assert owner.reason


uids = st.uuids().map(str)
forms = st.sampled_from(
    [
        lambda u: (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u.replace('-', '_')}.slice/cri-containerd-1.scope"
        ),
        lambda u: f"0::/kubepods/besteffort/pod{u}/1",
        lambda u: f"3:cpu:/kubepods/pod{u}/1\n2:memory:/kubepods/pod{u}/1",
        lambda u: f"0::/../kubepods-pod{u.replace('-', '_')}.slice/crio-1.scope",
    ]
)


@given(uids, forms)
def test_every_kubelet_form_of_any_uid_parses_back_to_that_uid(uid: str, form: object) -> None:
    assert callable(form)
    assert pod_uid_from_cgroup(form(uid)) == CgroupOwner("pod", pod_uid=uid)


@given(st.text(max_size=300))
def test_no_text_makes_the_parser_raise_or_invent_a_uid(text: str) -> None:
    owner = pod_uid_from_cgroup(text)
    assert owner.kind in ("pod", "host", "unknown")
    if owner.kind == "pod":
        assert owner.pod_uid is not None and owner.pod_uid in text.replace("_", "-")


# --------------------------------------------------------------------------- decisions

POLICY = OrphanPolicy(grace=60, kill_timeout=10)
GONE = "99999999-0000-0000-0000-000000000000"


def proc(pid: int, uid: str | None, kind: str = "pod", start: int = 100) -> GpuProc:
    owner = CgroupOwner(kind, pod_uid=uid, reason="test")  # type: ignore[arg-type]
    return GpuProc(pid, start, "GPU-0", 2048.0, "python3", owner)


def test_an_orphan_waits_out_its_grace_then_gets_sigterm_then_sigkill() -> None:
    p = proc(10, GONE)
    steps = []
    memory = OrphanMemory()
    for now in (0, 30, 59, 60, 65, 70):
        (action,), memory = orphan_actions([p], frozenset({UID}), memory, now, POLICY)
        steps.append((now, action.kind))
    assert steps == [
        (0, "wait"),
        (30, "wait"),
        (59, "wait"),
        (60, "sigterm"),
        (65, "wait"),
        (70, "sigkill"),
    ]


@pytest.mark.parametrize(
    ("name", "p", "live", "kind"),
    [
        ("a live pod's process", proc(1, UID), frozenset({UID}), "keep"),
        ("a host process", proc(2, None, "host"), frozenset(), "keep"),
        ("an unknown cgroup", proc(3, None, "unknown"), frozenset(), "report"),
        ("any process when the pod list is unknown", proc(4, GONE), None, "keep"),
        ("a process of a static pod, by its mirror's config UID", proc(5, STATIC), frozenset({STATIC}), "keep"),
    ],
)  # fmt: skip
def test_never_a_candidate(name: str, p: GpuProc, live: frozenset[str] | None, kind: str) -> None:
    memory = OrphanMemory()
    for now in (0, 1000, 2000):
        (action,), memory = orphan_actions([p], live, memory, now, POLICY)
        assert action.kind == kind, name
    assert memory == OrphanMemory()


def test_a_reused_pid_starts_its_own_grace() -> None:
    memory = OrphanMemory()
    _, memory = orphan_actions([proc(10, GONE, start=100)], frozenset(), memory, 0, POLICY)
    (action,), memory = orphan_actions(
        [proc(10, GONE, start=555)], frozenset(), memory, 100, POLICY
    )
    assert action.kind == "wait"


def test_an_orphan_whose_pod_reappears_is_forgotten() -> None:
    memory = OrphanMemory()
    _, memory = orphan_actions([proc(10, UID)], frozenset(), memory, 0, POLICY)
    (action,), memory = orphan_actions([proc(10, UID)], frozenset({UID}), memory, 30, POLICY)
    assert action.kind == "keep" and memory == OrphanMemory()
    (action,), _ = orphan_actions([proc(10, UID)], frozenset(), memory, 70, POLICY)
    assert action.kind == "wait"  # the grace starts again


SELF = "5e1f5e1f-0000-4000-8000-000000000001"
ME = {"a/me": {SELF}}
LACKS = (None, (), f"the pod list lacks the agent's own pod {SELF}: not trusted")
TRUST = {
    "trusted": (ME | {"ml/x": {UID}}, {"a/me"}, SELF, (frozenset({SELF, UID}), (), "")),
    "empty": ({}, set(), SELF, LACKS),
    "own pod missing": ({"ml/x": {UID}}, set(), SELF, LACKS),
    "own uid unknown": (ME, set(), None, (None, (), "the agent's own pod UID is unknown (POD_UID unset)")),
    "kubelet unread": (ME, None, SELF, (None, (), "the kubelet's pods are unknown (pod-resources unread)")),
    "kubelet runs more": (ME, {"a/me", "kube-system/etcd-n"}, SELF, (frozenset({SELF}), ("kube-system/etcd-n",), "")),
}  # fmt: skip


@pytest.mark.parametrize(("api", "kubelet", "own", "expected"), TRUST.values(), ids=list(TRUST))
def test_the_pod_lists_are_trusted_only_with_the_agents_own_pod_and_the_kubelets_answer(
    api: dict[str, set[str]], kubelet: set[str] | None, own: str | None, expected: object
) -> None:
    assert trusted_pods(api, kubelet, own) == expected


def test_while_the_kubelet_runs_a_pod_the_api_lacks_no_unlisted_process_is_a_candidate() -> None:
    memory = OrphanMemory()
    for now in (0, 100, 200):
        actions, memory = orphan_actions(
            [proc(1, STATIC), proc(2, UID)],
            frozenset({UID}),
            memory,
            now,
            POLICY,
            ("kube-system/etcd-n",),
        )
        assert [a.kind for a in actions] == ["report", "keep"]
        assert "kube-system/etcd-n" in actions[0].reason
    assert memory == OrphanMemory()
