"""The KEDA end-to-end test's own control plane: `make test-keda` runs it.

It is not in `make test`: it needs KEDA's operator and adapter, which take over an hour to
build (tests/keda/build.sh), more than CI has beside the control plane and helm. So its
module is collected only when GPUSCALER_KEDA_E2E is set (`make test-keda` sets it), and
then it never skips: a missing binary or KEDA source fails it, naming what is missing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import controlplane as cp
import pytest

from e2e_keda.keda_plane import aggregation_flags, missing

collect_ignore_glob = [] if os.environ.get("GPUSCALER_KEDA_E2E") else ["test_*.py"]


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cp.ControlPlane]:
    """tests/conftest.py's control plane, with the aggregation layer on the apiserver."""
    absent = [str(cp.bin_dir() / b) for b in cp.missing_binaries()] + missing()
    if absent:
        pytest.fail(
            f"missing: {', '.join(absent)}; run tests/controlplane/build.sh and "
            "tests/keda/build.sh (make test-keda does)"
        )
    workdir = tmp_path_factory.mktemp("controlplane")
    (workdir / "pki").mkdir()
    flags = aggregation_flags(workdir / "pki")
    with cp.running(cp.ControlPlane(workdir, apiserver_args=flags)) as plane:
        yield plane
