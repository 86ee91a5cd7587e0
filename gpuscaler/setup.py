"""What every program's assembly shares: the Kubernetes API client, this replica's
identity, the stop signal and the error for a program that cannot be assembled. Nothing
here parses arguments or prints."""

from __future__ import annotations

import os
import signal
import socket
import threading
from typing import Any

from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.config.config_exception import ConfigException

from gpuscaler.adapters.kube.api import BoundedApiClient
from gpuscaler.config import KubernetesConfig
from gpuscaler.errors import InputError


class SetupError(InputError):
    """A program cannot be assembled; the message says what to fix."""


def kube_api(kubeconfig: str | None, limits: KubernetesConfig | None = None) -> BoundedApiClient:
    """In-cluster config inside a pod (unless a kubeconfig is given), else the kubeconfig
    (`--kubeconfig`, $KUBECONFIG, ~/.kube/config); every call bounded in time."""
    configuration = client.Configuration()
    try:
        load: Any = kube_config.load_kube_config
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            load(config_file=kubeconfig, client_configuration=configuration)
    except (ConfigException, OSError) as e:
        raise SetupError(
            f"no Kubernetes API: {e}. Run in a pod, pass --kubeconfig, or plan without a "
            "cluster: --cluster-snapshot FILE (once) or --state FILE"
        ) from None
    k = limits or KubernetesConfig()
    return BoundedApiClient(configuration, k.connect_timeout, k.read_timeout, k.tick_api_budget)


def identity() -> str:
    """This replica's name in the Lease and in Events: the pod name when in a pod."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def one_blas_thread() -> None:
    """BLAS on one thread in this process. The linear algebra here is many tiny systems
    (each series' ARIMA fit), where BLAS threads only spin: they about double the CPU a
    program uses, and what-if's worker processes (one a core) would contend for it. Call
    it in every process (threadpoolctl limits the libraries loaded, so numpy first)."""
    import numpy  # noqa: F401
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def stop_on_signal() -> threading.Event:
    """An event set by SIGTERM or SIGINT."""
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    return done
