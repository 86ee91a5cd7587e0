"""Fragments and time slice of a pool shared under DRA, written only into the DeviceClasses
and ResourceClaimTemplates labelled for it (`kubernetes.dra.pool_label`: opt-in), for the
claims allocated after the write; claims already made keep what they were given.

- Time slice: the interval of the class's NVIDIA GpuConfig (TimeSlicing). A class's spec is
  mutable, and the scheduler copies its config into a claim's allocation when it allocates.
- Fragments: each opted-in template's share requests (`capacity.requests.memory` or
  `.shares`) become the device's capacity over the fragments; under MPS also the class's
  defaultActiveThreadPercentage, 100 / fragments. A template's spec is immutable, so it is
  replaced: deleted (preconditions uid and resourceVersion) and created again, same name,
  labels, owners. A pod created in between waits for the claim controller's retry. The new
  body is stored first in a ConfigMap of gpuscaler's namespace (`PENDING_CONFIGMAP`) and
  dropped once created: a create that failed, or a restart between the two halves, is
  carried on by the next tick, so a template is never lost.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from functools import partial
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.adapters.kube.api import KubeError, api_error, json_body, read_json, written
from gpuscaler.adapters.kube.cluster import pool_capacity, pool_nodes
from gpuscaler.adapters.kube.drashare import (
    DECISION,
    STRATEGIES,
    Opted,
    class_body,
    parse_opted,
    template_body,
)
from gpuscaler.adapters.kube.objects import ClusterObjects
from gpuscaler.adapters.kube.reader import DRA_SHARING, ClusterReader
from gpuscaler.adapters.kube.writer import MAX_CONFLICT_RETRIES, Writer, decision_record
from gpuscaler.config import Config, NodePoolConfig
from gpuscaler.core.decisions import FragmentsDecision, TimeSliceDecision

Json = dict[str, Any]
log = logging.getLogger("gpuscaler.kubernetes")
PENDING_CONFIGMAP = "gpuscaler-dra-templates"
"""Templates deleted for a replacement and not created again yet: `<namespace>.<name>` ->
the body to create."""


class KubeDraPools:
    """Writes a pool's sharing decisions into the objects that opted in to it."""

    def __init__(
        self,
        api: client.ApiClient,
        config: Config,
        writer: Writer,
        reader: ClusterReader,
        namespace: str,
    ):
        self.config = config
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.reader = reader
        self.writer = writer
        self.namespace = namespace
        """gpuscaler's own, where `PENDING_CONFIGMAP` lives."""

    def _objects(self) -> ClusterObjects:
        return self.reader.last_objects or self.reader.objects()

    def manages(self, pool: str) -> bool:
        """Whether the pool is shared under DRA: some object opted in to it."""
        return any(o.pool == pool for o in self._objects().dra_sharing)

    def apply_one(self, d: FragmentsDecision | TimeSliceDecision) -> bool:
        pool = next((p for p in self.config.node_pools if p.name == d.target), None)
        if pool is None:
            raise KubeError(f"{d.target} is not a configured node pool")
        return self.roll_out(pool, d.kind, str(d.to_value), decision_record(d)) > 0

    def roll_out(self, pool: NodePoolConfig, kind: str, value: str, record: str) -> int:
        """Write `value` into every object of the pool not carrying it yet; the number written.
        KubeError when the first write fails (later ones resume next tick)."""
        self._recreate_pending()
        objects = self._objects()
        mine = [o for o in objects.dra_sharing if o.pool == pool.name]
        if kind == "time_slice":
            targets = [o for o in mine if o.kind == "DeviceClass"]
            if targets and pool.sharing == "mps":
                raise KubeError(f"pool {pool.name} shares by MPS: GpuConfig has no time slice")
        else:
            targets = [o for o in mine if o.kind == "ResourceClaimTemplate"]
            targets += [o for o in mine if o.kind == "DeviceClass" and pool.sharing == "mps"]
        if not targets:
            raise KubeError(f"pool {pool.name}: no DRA object opted in carries its {kind}")
        capacity = pool_capacity(pool_nodes(objects, pool))
        done = 0
        for o in targets:
            try:
                done += self._write(o, STRATEGIES[pool.sharing], kind, value, record, capacity)
            except KubeError as e:
                if done == 0:
                    raise
                log.warning("pool %s: %s paused after %d object(s): %s", pool.name, kind, done, e)
                break
        return done

    def _write(
        self,
        o: Opted,
        strategy: str,
        kind: str,
        value: str,
        record: str,
        capacity: dict[str, float],
    ) -> int:
        """1 when `o` was written (its decision annotation with it), 0 when it has `value`."""
        template = o.kind == "ResourceClaimTemplate"
        for _ in range(MAX_CONFLICT_RETRIES + 1):
            if o.problem:
                raise KubeError(f"{o.problem}; left as it is")
            try:
                body = (
                    template_body(o, int(value), capacity)
                    if template
                    else class_body(o, strategy, kind, value, self.config)
                )
            except ValueError as e:
                raise KubeError(f"{e}; left as it is") from None
            if body is None:
                return 0
            meta = body["metadata"]
            meta["annotations"] = {**(meta.get("annotations") or {}), DECISION[kind]: record}
            if self._replace_template(o, body) if template else self._patch_class(o, body):
                self.writer.event(
                    client.V1ObjectReference(
                        api_version="resource.k8s.io/v1",
                        kind=o.kind,
                        name=o.name,
                        namespace=o.namespace or None,
                        uid=None if template else (o.doc.get("metadata") or {}).get("uid"),
                    ),
                    o.namespace or self.config.kubernetes.events_namespace,
                    "FragmentsChanged" if kind == "fragments" else "TimeSliceChanged",
                    "ReplaceTemplate" if template else "SetClassConfig",
                    f"{kind} {value} for new claims (pool {o.pool}): "
                    + json.loads(record)["reason"],
                )
                return 1
            o = self._reread(o)
        raise KubeError(f"{o.where}: still conflicting after {MAX_CONFLICT_RETRIES} retries")

    def _patch_class(self, o: Opted, body: Json) -> bool:
        self.writer.gate(f"config of {o.where}")
        g, v, plural = DRA_SHARING["DeviceClass"]
        patch = partial(self.custom.patch_cluster_custom_object, g, v, plural, o.name, body)
        return written(f"patch {o.where}", partial(patch, _preload_content=False))

    def _replace_template(self, o: Opted, body: Json) -> bool:
        """Deleted (only the version read) then created again; False on a conflict."""
        self.writer.gate(f"replace {o.where}")
        self.writer.gate(f"create {o.where} again")
        meta = o.doc.get("metadata") or {}
        g, v, plural = DRA_SHARING["ResourceClaimTemplate"]
        options = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(
                uid=meta.get("uid"), resource_version=meta.get("resourceVersion")
            )
        )
        delete = partial(
            self.custom.delete_namespaced_custom_object, g, v, o.namespace, plural, o.name
        )
        key = f"{o.namespace}.{o.name}"
        self._pending({key: json.dumps(body)})  # before the delete: a restart carries on
        if not written(f"delete {o.where}", partial(delete, body=options, _preload_content=False)):
            self._pending({key: None})  # changed since read: left as it is, re-read
            return False
        self._recreate_pending(gated=True)
        return True

    def _pending(self, data: dict[str, str | None]) -> dict[str, str]:
        """Set (None: drop) keys of `PENDING_CONFIGMAP`; what it holds before (empty: none
        or no change asked)."""
        name, ns = PENDING_CONFIGMAP, self.namespace
        try:
            cm = json_body(self.core.read_namespaced_config_map(name, ns, _preload_content=False))
        except ApiException as e:
            if e.status != 404:
                raise api_error(f"read ConfigMap {ns}/{name}", e) from None
            cm = None
        held: dict[str, str] = dict((cm or {}).get("data") or {})
        if not data or all(held.get(k) == v for k, v in data.items()):
            return held
        if cm is None:
            made = client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name=name, namespace=ns),
                data={k: v for k, v in data.items() if v is not None},
            )
            write = partial(self.core.create_namespaced_config_map, ns, made)
        else:
            body = {
                "metadata": {"resourceVersion": cm["metadata"]["resourceVersion"]},
                "data": data,
            }
            write = partial(self.core.patch_namespaced_config_map, name, ns, body)
        if not written(f"write ConfigMap {ns}/{name}", partial(write, _preload_content=False)):
            raise KubeError(f"ConfigMap {ns}/{name} changed meanwhile; retried next tick")
        return held

    def _recreate_pending(self, gated: bool = False) -> None:
        """Create the templates deleted and not created again (KubeError if one fails),
        through the gate unless the delete's already let it through."""
        g, v, plural = DRA_SHARING["ResourceClaimTemplate"]
        for key, raw in self._pending({}).items():
            body = json.loads(raw)
            ns = body["metadata"]["namespace"]
            if not gated:
                self.writer.gate(f"create ResourceClaimTemplate {key} again")
            create = partial(self.custom.create_namespaced_custom_object, g, v, ns, plural, body)
            try:
                written(
                    f"create ResourceClaimTemplate {key}", partial(create, _preload_content=False)
                )
            except KubeError as e:
                raise KubeError(f"{e}; it is created again next tick") from None
            self._pending({key: None})  # a 409: it exists again (created by its owner)

    def _reread(self, o: Opted) -> Opted:
        g, v, plural = DRA_SHARING[o.kind]
        if o.namespace:
            call = partial(self.custom.get_namespaced_custom_object, g, v, o.namespace, plural)
        else:
            call = partial(self.custom.get_cluster_custom_object, g, v, plural)
        fresh = read_json(f"read {o.where}", partial(call, o.name, _preload_content=False))
        found = parse_opted([{**fresh, "kind": o.kind}], self.config)
        if not found or found[0].pool != o.pool:
            raise KubeError(f"{o.where}: no longer opted in to pool {o.pool}; left alone")
        return found[0]

    def continue_rollouts(self, skip: Iterable[str] = ()) -> int:
        """Carry on what earlier ticks started (templates to create again, objects not yet
        at the newest decision written into their pool's), but kinds:pools in `skip`; the
        objects written. Objects already at the value are not written."""
        done = 0
        try:
            self._recreate_pending()
            objects = self._objects()
        except KubeError as e:
            log.warning("DRA sharing rollouts paused: %s", e)
            return 0
        for pool in self.config.node_pools:
            mine = [o for o in objects.dra_sharing if o.pool == pool.name]
            for kind in DECISION:
                records = [(t, o) for o in mine if (t := o.decision(kind)) is not None]
                if not records or f"{kind}:{pool.name}" in skip:
                    continue
                (_, target), newest = max(records, key=lambda r: r[0][0])
                try:
                    record = newest.doc["metadata"]["annotations"][DECISION[kind]]
                    done += self.roll_out(pool, kind, target, record)
                except (KubeError, ValueError) as e:
                    log.warning("rollout of %s on pool %s paused: %s", kind, pool.name, e)
        return done
