import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The tests' helpers (builders, kubefake, ...) and the test modules some tests share
# (an e2e test reuses a program test's fixtures) import by name from every folder.
for folder in ("", "core", "forecast", "adapters", "sim", "programs", "e2e"):
    sys.path.insert(0, str(Path(__file__).parent / folder))

from kubefake import FakeCluster, fake_apiserver  # noqa: E402
from kubernetes import client  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def one_blas_thread() -> Iterator[None]:
    """One BLAS thread: multithreaded BLAS on 2 shared cores slows statsmodels tenfold. The
    limit reaches only libraries already loaded, so statsmodels (and scipy's BLAS) goes first."""
    import statsmodels.tsa.arima.model  # noqa: F401

    with threadpool_limits(limits=1):
        yield


@pytest.fixture(autouse=True)
def root_logging_restored() -> Iterator[None]:
    """`cli.main` run in-process points the root logger at that test's captured stderr, at
    INFO: restored, so a later test neither logs to a closed stream nor at INFO."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def api() -> Iterator[tuple[client.ApiClient, FakeCluster]]:
    """The official client against a fresh fake API server."""
    with (
        fake_apiserver() as (url, cluster),
        client.ApiClient(client.Configuration(host=url)) as api,
    ):
        yield api, cluster


# --------------------------------------------------------------------------- real control plane
# tests/controlplane.py says what these give; `make test-fast` leaves their tests out.


import controlplane as cp  # noqa: E402

SLOW_MODULES = frozenset({
    # each test starts a program: the CLI, lint-imports, promtool or a real Prometheus
    "test_agent_cli", "test_agent_mps_memory", "test_cli_errors", "test_cluster_cli",
    "test_entrypoints", "test_extender_live", "test_extender_observability", "test_fault_matrix",
    "test_layers", "test_observability", "test_preemption_memory", "test_prometheus",
    "test_prometheus_invalid", "test_prometheus_live", "test_demand",
    "test_extscaler_live", "test_forecast_leading", "test_helm_chart", "test_prometheus_grouped",
    "test_prometheus_warm", "test_sample_spacing", "test_whatif_live",
    # simulator replays with their baselines, and planning at 10,000 workloads
    "test_simulate", "test_plan_scale", "test_sim_slot",
    # statsmodels, fake servers with real timeouts, leases, gRPC servers, watches
    "test_backtest", "test_agent", "test_kube_faults", "test_kube_preemption",
    "test_extscaler_grpc", "test_kubefake", "test_loop", "test_leader", "test_informer_faults",
})  # fmt: skip
"""Modules whose tests take seconds each: marker `slow`, left out by `make test-fast`."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if {"control_plane", "kube", "scheduler"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.controlplane)
        if Path(str(item.fspath)).stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cp.ControlPlane]:
    """etcd, kube-apiserver (vendored CRDs installed) and kube-controller-manager."""
    missing = cp.missing_binaries()
    if missing:
        why = f"control plane binaries missing in {cp.bin_dir()}: {', '.join(missing)}; run tests/controlplane/build.sh"
        cp.unavailable(why)
    with cp.running(cp.ControlPlane(tmp_path_factory.mktemp("controlplane"))) as plane:
        yield plane


@pytest.fixture
def scheduler(control_plane: cp.ControlPlane) -> Iterator[cp.ControlPlane]:
    """The control plane with kube-scheduler running too, for this test only."""
    control_plane.start_scheduler()
    try:
        yield control_plane
    finally:
        control_plane.stop_scheduler()


@pytest.fixture
def kube(control_plane: cp.ControlPlane) -> Iterator[cp.Kube]:
    """One test's handle on the real control plane; its nodes and namespaces are
    deleted afterwards."""
    handle = cp.Kube(control_plane)
    try:
        yield handle
    finally:
        handle.cleanup()
