import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from kubefake import FakeCluster, fake_apiserver
from kubernetes import client
from threadpoolctl import threadpool_limits


@pytest.fixture(autouse=True, scope="session")
def one_blas_thread() -> Iterator[None]:
    """One BLAS thread for the whole suite: multithreaded BLAS on 2 shared cores makes the
    statsmodels reference 10x slower and the suite time out under load (issue 14). The
    limit reaches only libraries already loaded, so statsmodels (and scipy's own BLAS) is loaded first."""
    import statsmodels.tsa.arima.model  # noqa: F401

    with threadpool_limits(limits=1):
        yield


@pytest.fixture
def api() -> Iterator[tuple[client.ApiClient, FakeCluster]]:
    """The official client against a fresh fake API server."""
    with (
        fake_apiserver() as (url, cluster),
        client.ApiClient(client.Configuration(host=url)) as api,
    ):
        yield api, cluster
