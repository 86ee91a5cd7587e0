"""Config reload without a restart, and workload discovery, on the cluster-backed controller
(the last test against the real kube-apiserver, the ConfigMap projected as the kubelet does)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from builders import CLI, NOW, http_get, run_cli
from controlplane import Kube, wait_until
from kubeobjects import hpa
from kubernetes import client
from promserver import free_port

from gpuscaler.config import Config, ConfigError, load_config
from gpuscaler.controller.assembly import cluster_controller
from gpuscaler.observability import ControllerMetrics
from gpuscaler.reload import ConfigReloader

BASE = """
prometheus: {url: "http://127.0.0.1:1", timeout: 1s, retries: 0}
replicas: {max_replicas: 50}
workloads:
  - {namespace: ml, kind: HorizontalPodAutoscaler, name: embed}
"""


def test_a_changed_valid_config_is_swapped_in_and_the_generation_goes_up(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(BASE)
    seen: list[tuple[Config, int]] = []
    reloader = ConfigReloader(path, lambda c, g: seen.append((c, g)))
    assert reloader.check() is False  # unchanged
    path.write_text(BASE.replace("max_replicas: 50", "max_replicas: 80"))
    assert reloader.check() is False  # changed: applied when the next check reads the same
    assert reloader.check() is True
    assert reloader.generation == 2
    assert seen[0][0].replicas.max_replicas == 80 and seen[0][1] == 2


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("replicas: {max_replicas: -1}", "replicas.max_replicas"),
        ("control: [unclosed", "not valid YAML"),
        (None, "file not found"),
    ],
    ids=["an invalid value", "broken YAML", "the file gone"],
)
def test_an_invalid_new_config_is_refused_once_and_the_running_one_stays(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(BASE)
    reloaded: list[Config] = []
    refused: list[ConfigError] = []
    reloader = ConfigReloader(path, lambda c, g: reloaded.append(c), refused.append)
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    assert reloader.check() is False  # changed: judged when the next check reads the same
    assert reloader.check() is False
    assert reloader.check() is False  # the same broken content is reported once
    assert reloaded == [] and reloader.generation == 1 and reloader.failures == 1
    assert len(refused) == 1 and any(problem in p for p in refused[0].problems)


def test_a_file_being_written_is_applied_only_once_two_checks_read_the_same(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(BASE)
    seen: list[Config] = []
    reloader = ConfigReloader(path, lambda c, g: seen.append(c))
    full = BASE.replace("50", "80") + "preemption: {protected_namespaces: [ml]}\n"
    with path.open("w") as f:  # an in-place edit, valid YAML half-way
        f.write(full[: full.index("preemption")])
        f.flush()
        assert reloader.check() is False
        f.write(full[full.index("preemption") :])
        f.flush()
    assert reloader.check() is False  # it changed since the last check: still being written
    assert seen == [] and reloader.failures == 0
    assert reloader.check() is True
    assert [c.preemption.protected_namespaces for c in seen] == [("ml",)]


def test_a_config_map_volume_update_is_applied_at_the_first_check(tmp_path: Path) -> None:
    volume = _write_volume(tmp_path / "config", {"c.yaml": BASE})
    seen: list[Config] = []
    reloader = ConfigReloader(volume / "c.yaml", lambda c, g: seen.append(c))
    _write_volume(volume, {"c.yaml": BASE.replace("max_replicas: 50", "max_replicas: 80")})
    assert reloader.check() is True
    assert [c.replicas.max_replicas for c in seen] == [80]


@pytest.mark.parametrize(
    ("replace", "problem"),
    [
        (lambda p: p.symlink_to("/dev/zero"), "not a regular file"),
        (lambda p: os.mkfifo(p), "not a regular file"),
        (lambda p: p.mkdir(), "not a regular file"),
        (lambda p: p.write_text("#" * (2 << 20)), "a config is at most 1,048,576 bytes"),
    ],
    ids=["a device", "a FIFO", "a directory", "too large"],
)
def test_a_path_that_is_no_regular_file_or_too_large_is_refused_before_it_is_read(
    tmp_path: Path, replace: Callable[[Path], None], problem: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(BASE)
    refused: list[ConfigError] = []
    reloader = ConfigReloader(path, lambda c, g: None, refused.append)
    path.unlink()
    replace(path)
    metrics = ControllerMetrics()
    metrics.attach_reloader(reloader)
    assert reloader.check() is False  # a FIFO would block the open
    assert reloader.check() is False
    assert reloader.failures == 1 and problem in refused[0].problems[0]
    assert "gpuscaler_config_reload_failures_total 1.0" in metrics.exposition().decode()
    out = run_cli("validate-config", str(path))
    assert out.returncode == 2 and problem in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "prometheus",
    ["", 'prometheus: {url: "http://127.0.0.1:1", timeout: 1s, retries: 0}\n'],
    ids=["simulated", "run --state"],
)
def test_a_refused_reload_is_counted_when_run_has_no_cluster(
    tmp_path: Path, prometheus: str
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(prometheus + "control: {interval: 1s}\nworkloads: []\n")
    port = free_port()
    state = ["--state", "/dev/null"] if prometheus else []
    command = [*CLI, "run", "--config", str(config), "--dry-run", "--metrics-port", str(port)]
    with subprocess.Popen([*command, *state], stderr=subprocess.PIPE, text=True) as proc:
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            failures = "gpuscaler_config_reload_failures_total"
            wait_until("serving", lambda: f"{failures} 0.0" in http_get(url)[1], 60, 0.3)
            config.write_text("replicas: {max_replicas: -1}\n")
            wait_until("a refusal counted", lambda: f"{failures} 1.0" in http_get(url)[1], 30, 0.3)
        finally:
            proc.send_signal(signal.SIGTERM)
            err = proc.communicate(timeout=30)[1]
    assert "new config refused" in err and "replicas.max_replicas" in err


def _project(kube: Kube, ns: str, name: str, volume: Path) -> Path:
    return _write_volume(volume, kube.core.read_namespaced_config_map(name, ns).data or {})


def _write_volume(volume: Path, data: dict[str, str]) -> Path:
    """Write a ConfigMap's data as the kubelet's volume does (kubernetes pkg/volume/util/
    atomic_writer.go): the data in a fresh `..<timestamp>` directory, the `..data` symlink
    swapped to it by a rename, and each key a symlink through `..data`."""
    volume.mkdir(exist_ok=True)
    stamp = volume / f"..{time.time_ns()}"
    stamp.mkdir()
    for key, text in data.items():
        (stamp / key).write_text(text)
    tmp = volume / "..data_tmp"
    tmp.symlink_to(stamp.name)
    tmp.rename(volume / "..data")
    for key in data:
        link = volume / key
        if not link.is_symlink():
            link.symlink_to(f"..data/{key}")
    return volume


def test_the_running_controller_reloads_a_configmap_update_refuses_with_an_event_and_discovers_workloads(
    kube: Kube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    home, ml = kube.namespace(), kube.namespace()
    monkeypatch.setenv("POD_NAME", "gpuscaler-abc")
    monkeypatch.setenv("POD_NAMESPACE", home)
    pod = kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "gpuscaler-abc", "namespace": home},
            "spec": {"containers": [{"name": "gpuscaler", "image": "gpuscaler:0.1.0"}]},
        }
    )
    monkeypatch.setenv("POD_UID", pod["metadata"]["uid"])  # the Deployment's fieldRef
    kube.create(hpa("embed", 1, namespace=ml))
    kube.create(hpa("found", 1, namespace=ml))  # opted in, not in the config
    base = BASE.replace("namespace: ml", f"namespace: {ml}")
    cm = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="gpuscaler-config"), data={"gpuscaler.yaml": base}
    )
    kube.core.create_namespaced_config_map(home, cm)

    def update(text: str) -> None:  # kubectl edit cm, then the kubelet syncs the volume
        kube.core.patch_namespaced_config_map(
            "gpuscaler-config", home, {"data": {"gpuscaler.yaml": text}}
        )
        _project(kube, home, "gpuscaler-config", volume)

    volume = _project(kube, home, "gpuscaler-config", tmp_path / "config")
    path = volume / "gpuscaler.yaml"
    parts = cluster_controller(load_config(path), kube.api, dry_run=True, config_path=str(path))
    request.addfinalizer(parts.stop)  # also when an assertion fails: the cache's threads end
    metrics = ControllerMetrics()
    metrics.attach(parts.controller)
    metrics.attach_cluster(parts)
    controller = parts.controller
    assert parts.elector is not None and parts.elector.step()  # this replica leads

    first = controller.tick(NOW)  # discovery uses this tick's objects: planned at once
    keys = [w.key for w in controller.config.workloads]
    assert keys == [f"{ml}/HorizontalPodAutoscaler/embed", f"{ml}/HorizontalPodAutoscaler/found"]
    assert [w.key for w in first.snapshot.workloads] == keys
    controller.tick(NOW + 30)

    update("replicas: {max_replicas: -1}\n")
    controller.tick(NOW + 60)
    assert controller.config.replicas.max_replicas == 50  # the running config stays
    events = [
        e
        for e in kube.get(f"/apis/events.k8s.io/v1/namespaces/{home}/events")["items"]
        if e["reportingController"] == "gpuscaler.io/controller"  # not kube-scheduler's
    ]
    assert [e["reason"] for e in events] == ["ConfigRefused"]
    assert events[0]["regarding"]["name"] == "gpuscaler-abc"
    assert events[0]["regarding"]["uid"] == pod["metadata"]["uid"]
    assert events[0]["type"] == "Warning"
    assert "replicas.max_replicas" in events[0]["note"]

    update(base.replace("max_replicas: 50", "max_replicas: 80"))
    controller.tick(NOW + 90)
    assert controller.config.replicas.max_replicas == 80
    assert parts.reader.config.replicas.max_replicas == 80
    assert controller.source.prometheus.config.replicas.max_replicas == 80  # type: ignore[attr-defined]
    assert [w.key for w in controller.config.workloads][-1] == f"{ml}/HorizontalPodAutoscaler/found"
    text = metrics.exposition().decode()
    assert "gpuscaler_config_generation 2.0" in text
    assert "gpuscaler_config_reload_failures_total 1.0" in text
    assert 'gpuscaler_source_up{source="kubernetes"} 1.0' in text
    assert "gpuscaler_leader 1.0" in text
    controller.is_leader = lambda: False  # the lease went to another replica
    controller.tick(NOW + 120)
    assert "gpuscaler_leader 0.0" in metrics.exposition().decode()
    parts.stop()
