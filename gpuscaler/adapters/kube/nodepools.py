"""Node pools: fragments per GPU (the named sharing config added to the device-plugin
ConfigMap, then `nvidia.com/device-plugin.config` relabelled on a few nodes per tick,
skipping nodes whose pods hold more shares than it allows) and the time slice level (a
node label the agent reads), rolled out over ticks.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any

import yaml
from kubernetes import client

from gpuscaler.adapters.kube.api import KubeError, read_json, written
from gpuscaler.adapters.kube.cluster import pool_nodes, shares_held
from gpuscaler.adapters.kube.objects import (
    NODE_DECISION,
    OPT_IN_LABEL,
    PLUGIN_CONFIG_LABEL,
    ClusterObjects,
    ClusterStateError,
    Node,
    parse_objects,
    parse_time,
    rfc3339,
    sharing_config_name,
)
from gpuscaler.adapters.kube.reader import ClusterReader
from gpuscaler.adapters.kube.writer import MAX_CONFLICT_RETRIES, Writer, decision_record
from gpuscaler.config import Config, NodePoolConfig
from gpuscaler.core.decisions import FragmentsDecision, TimeSliceDecision

log = logging.getLogger("gpuscaler.kubernetes")


class ConfigNotReady(KubeError):
    """A sharing config just added, not yet safe to name on a node: try again later."""


CONFIG_ADDED = "gpuscaler.io/config-added-"
"""Annotation on the device-plugin ConfigMap: when gpuscaler added a config."""


def sharing_config(strategy: str, fragments: int) -> str:
    doc: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": "none"}}
    if fragments > 1:  # replicas 1 is no sharing at all: the plain config
        resources = [{"name": "nvidia.com/gpu", "replicas": fragments}]
        if strategy == "mps":
            doc["sharing"] = {"mps": {"renameByDefault": False, "resources": resources}}
        else:
            doc["sharing"] = {
                "timeSlicing": {
                    "renameByDefault": False,
                    "failRequestsGreaterThanOne": False,
                    "resources": resources,
                }
            }
    return yaml.safe_dump(doc, sort_keys=False)


def _config_replicas(text: str) -> tuple[str | None, int]:
    doc = yaml.safe_load(text) or {}
    sharing = doc.get("sharing") or {}
    for key, strategy in (("timeSlicing", "time-slicing"), ("mps", "mps")):
        section = sharing.get(key)
        if section:
            for r in section.get("resources") or []:
                if r.get("name") == "nvidia.com/gpu":
                    return strategy, int(r.get("replicas", 1))
    return None, 1


class KubeNodePools:
    """Fragments and time slice of node pools, through node labels."""

    def __init__(
        self,
        api: client.ApiClient,
        config: Config,
        writer: Writer,
        reader: ClusterReader | None = None,
    ):
        self.config = config
        self.core = client.CoreV1Api(api)
        self.reader = reader or ClusterReader(api, config)
        """Shared with the source: rollouts continue from what this tick already read."""
        self.writer = writer

    def _pool(self, name: str) -> NodePoolConfig:
        for p in self.config.node_pools:
            if p.name == name:
                return p
        raise KubeError(f"{name} is not a configured node pool")

    def ensure_sharing_config(self, pool: NodePoolConfig, fragments: int, now: float) -> str:
        """The name of the config giving `fragments` per GPU, added to the device-plugin
        ConfigMap when missing and usable `kubernetes.config_propagation` after that
        (ConfigNotReady until then); one of that name saying otherwise is never
        overwritten (the operator owns it)."""
        ref = self.config.kubernetes.device_plugin_config_map
        name = sharing_config_name(pool, fragments, self.config)
        where = f"ConfigMap {ref.namespace}/{ref.name}"
        for _ in range(MAX_CONFLICT_RETRIES + 1):
            cm = read_json(
                f"read {where}",
                lambda: self.core.read_namespaced_config_map(
                    ref.name, ref.namespace, _preload_content=False
                ),
            )
            data = cm.get("data") or {}
            meta = cm.get("metadata") or {}
            if name in data:
                _check_existing(where, name, data[name], pool, fragments)
                added = parse_time((meta.get("annotations") or {}).get(CONFIG_ADDED + name))
                self._propagated(name, added, now)
                return name
            if (meta.get("labels") or {}).get(OPT_IN_LABEL) != "true":
                raise KubeError(
                    f"{where}: config {name} is missing and the ConfigMap has no label "
                    f"{OPT_IN_LABEL}=true, so gpuscaler may not add it"
                )
            self.writer.gate(f"add {name} to {where}")
            body = {
                "metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "annotations": {CONFIG_ADDED + name: rfc3339(now)},
                },
                "data": {name: sharing_config(pool.sharing, fragments)},
            }
            patch = partial(self.core.patch_namespaced_config_map, ref.name, ref.namespace, body)
            if not written(f"patch {where}", partial(patch, _preload_content=False)):
                continue
            self.writer.event(
                client.V1ObjectReference(
                    api_version="v1",
                    kind="ConfigMap",
                    name=ref.name,
                    namespace=ref.namespace,
                    uid=meta.get("uid"),
                ),
                ref.namespace,
                "SharingConfigAdded",
                "AddSharingConfig",
                f"added device-plugin config {name} ({pool.sharing}, {fragments} per GPU)",
            )
            self._propagated(name, now, now)
            return name
        raise KubeError(f"patch {where}: still conflicting after {MAX_CONFLICT_RETRIES} retries")

    def _propagated(self, name: str, added: float | None, now: float) -> None:
        """ConfigNotReady while a config gpuscaler added may not have reached every node."""
        wait = self.config.kubernetes.config_propagation
        if added is not None and now - added < wait:
            raise ConfigNotReady(
                f"config {name} was added {now - added:.0f}s ago; nodes are relabelled "
                f"{wait:.0f}s after (kubernetes.config_propagation), once the kubelet has "
                "synced it to every device plugin"
            )

    def _label_for(self, kind: str, pool: NodePoolConfig, value: str) -> tuple[str, str]:
        if kind == "fragments":
            return PLUGIN_CONFIG_LABEL, sharing_config_name(pool, int(value), self.config)
        return self.config.kubernetes.time_slice_label, value

    def _relabel(self, node: Node, kind: str, label: str, value: str, record: str) -> bool:
        current = node
        for _ in range(MAX_CONFLICT_RETRIES + 1):
            if current.labels.get(label) == value:
                return False
            self.writer.gate(f"label {label} on node {node.name}")
            body = {
                "metadata": {
                    "resourceVersion": current.resource_version,
                    "labels": {label: value},
                    "annotations": {NODE_DECISION[kind]: record},
                }
            }
            patch = partial(self.core.patch_node, node.name, body, _preload_content=False)
            if written(f"patch node {node.name}", patch):
                return True
            fresh = read_json(
                f"read node {node.name}",
                lambda: self.core.read_node(node.name, _preload_content=False),
            )
            current = parse_objects([{**fresh, "kind": "Node"}], self.config).nodes[0]
        raise KubeError(f"patch node {node.name}: still conflicting")

    def roll_out(
        self,
        kind: str,
        pool: NodePoolConfig,
        value: str,
        record: str,
        objects: ClusterObjects | None = None,
    ) -> int:
        """Relabel up to max_nodes_per_tick nodes of the pool toward `value`; the number
        relabelled. KubeError when the pool may not be touched at all."""
        objects = objects or self.reader.objects()
        nodes = pool_nodes(objects, pool)
        if not nodes:
            raise KubeError(f"pool {pool.name}: no nodes")
        refused = [n.name for n in nodes if not n.opted_in]
        if refused:
            raise KubeError(
                f"pool {pool.name}: node(s) {', '.join(refused[:3])} lack {OPT_IN_LABEL}=true; "
                "a pool is changed whole or not at all"
            )
        label, label_value = self._label_for(kind, pool, value)
        pending = [n for n in nodes if n.labels.get(label) != label_value]
        if kind == "fragments":  # lowering below what pods hold needs preemption first
            held = {n.name: shares_held(n, objects.pods) for n in pending}
            for n in pending:
                if held[n.name] > int(value):
                    log.info(
                        "node %s keeps its fragments: its pods hold %d shares per GPU > %s",
                        n.name,
                        held[n.name],
                        value,
                    )
            pending = [n for n in pending if held[n.name] <= int(value)]
        done = 0
        for node in pending[: self.config.kubernetes.max_nodes_per_tick]:
            try:
                written = self._relabel(node, kind, label, label_value, record)
            except KubeError as e:
                if done == 0:
                    raise
                # Each node is whole (label and annotation in one patch); the nodes done
                # carry the decision, so the next tick resumes the rollout from them.
                log.warning("rollout on pool %s paused after %d node(s): %s", pool.name, done, e)
                break
            if written:
                done += 1
                self.writer.event(
                    client.V1ObjectReference(
                        api_version="v1", kind="Node", name=node.name, uid=node.uid or None
                    ),
                    self.config.kubernetes.events_namespace,
                    "FragmentsChanged" if kind == "fragments" else "TimeSliceChanged",
                    "SetNodeLabel",
                    f"{label}={label_value} (pool {pool.name}): {json.loads(record)['reason']}",
                )
        return done

    def apply_one(self, d: FragmentsDecision | TimeSliceDecision) -> bool:
        pool = self._pool(d.target)
        if isinstance(d, FragmentsDecision):
            self.ensure_sharing_config(pool, d.to_value, d.time)
        return self.roll_out(d.kind, pool, str(d.to_value), decision_record(d)) > 0

    def continue_rollouts(self, skip: set[str] | frozenset[str] = frozenset()) -> int:
        """Carry on rollouts earlier ticks started (nodes lagging behind the newest decision
        on their pool's nodes), but those in `skip`; the nodes relabelled."""
        try:
            objects = self.reader.last_objects or self.reader.objects()
        except (KubeError, ClusterStateError) as e:
            log.warning("rollouts paused: %s", e)
            return 0
        done = 0
        for pool in self.config.node_pools:
            nodes = pool_nodes(objects, pool)
            for kind in NODE_DECISION:
                if f"{kind}:{pool.name}" in skip:
                    continue
                records = [
                    n.annotations[NODE_DECISION[kind]]
                    for n in nodes
                    if NODE_DECISION[kind] in n.annotations
                ]
                if not records:
                    continue
                newest = max(records, key=_record_time)
                try:
                    target = str(json.loads(newest)["to"])
                    label, value = self._label_for(kind, pool, target)
                    if any(n.labels.get(label) != value for n in nodes):
                        done += self.roll_out(kind, pool, target, newest, objects)
                except (KubeError, ValueError, KeyError) as e:
                    log.warning("rollout of %s on pool %s paused: %s", kind, pool.name, e)
        return done


def _check_existing(where: str, name: str, text: str, pool: NodePoolConfig, fragments: int) -> None:
    try:
        strategy, replicas = _config_replicas(text)
    except (yaml.YAMLError, AttributeError, TypeError, ValueError):
        raise KubeError(f"{where}: config {name} is not a device-plugin config") from None
    expected = pool.sharing if fragments > 1 else None
    if (strategy, replicas) != (expected, fragments):
        raise KubeError(
            f"{where}: config {name} sets {strategy or 'no sharing'} with "
            f"{replicas} replicas, not {pool.sharing} with {fragments}; "
            "left as it is, fix or rename it"
        )


def _record_time(record: str) -> float:
    try:
        return float(json.loads(record)["time"])
    except (ValueError, KeyError, TypeError):
        return 0.0
