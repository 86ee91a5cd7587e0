"""The test control plane itself (tests/controlplane.py): what its helpers promise."""

from __future__ import annotations

from pathlib import Path

import pytest
from controlplane import Kube
from kubemeta import status_of
from kubeobjects import bare_pod
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException


def test_a_gpu_node_is_ready_untainted_and_advertises_its_gpus(kube: Kube) -> None:
    node = kube.add_gpu_node("gpu-x", {"nvidia.com/gpu.product": "NVIDIA-L4"}, gpus=4)
    assert not node["spec"].get("taints")  # the not-ready taint a new node gets is lifted
    status = status_of(kube.core.read_node("gpu-x"))
    assert status.allocatable["nvidia.com/gpu"] == "4"
    assert [c.status for c in status.conditions if c.type == "Ready"] == ["True"]


def test_a_pod_is_made_running_and_ready_as_a_kubelet_would_report(kube: Kube) -> None:
    ns = kube.namespace()
    kube.create(bare_pod("p", ns))
    kube.make_running(ns, "p")
    status = status_of(kube.core.read_namespaced_pod("p", ns))
    assert status.phase == "Running"
    assert [c.status for c in status.conditions if c.type == "Ready"] == ["True"]


def test_rbac_is_enforced_for_a_service_account_token(kube: Kube, tmp_path: Path) -> None:
    ns = kube.namespace()
    kubeconfig = kube.plane.token_kubeconfig(ns, "default", tmp_path / "kubeconfig")
    with kube_config.new_client_from_config(config_file=str(kubeconfig)) as api:  # type: ignore[no-untyped-call]
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(api).list_node()
        assert refused.value.status == 403
        # Its own namespace's ServiceAccounts it may not read either: no grant at all.
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(api).read_namespaced_service_account("default", ns)
        assert refused.value.status == 403
