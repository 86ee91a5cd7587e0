import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from kubefake import FakeCluster, fake_apiserver
from kubernetes import client


@pytest.fixture
def api() -> Iterator[tuple[client.ApiClient, FakeCluster]]:
    """The official client against a fresh fake API server."""
    with (
        fake_apiserver() as (url, cluster),
        client.ApiClient(client.Configuration(host=url)) as api,
    ):
        yield api, cluster
