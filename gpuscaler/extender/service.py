"""The three verbs: Filter and Prioritize read one snapshot; Bind is the commit point, its
steps and why in docs/scheduling.md ("Bind is the commit point"): the reservation is
written on the pod and counted in the ledger before the Binding is created.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gpuscaler.adapters.kube.api import KubeError
from gpuscaler.adapters.kube.objects import rfc3339
from gpuscaler.config import SchedulerConfig
from gpuscaler.core.gpufit import (
    STALE_REASON,
    AnnotationError,
    PodRecord,
    PodRequest,
    Reservation,
    fit_problem,
    freshness,
    place,
    pod_request,
    refusal,
    request_problem,
    reservation_annotations,
    with_reservations,
)
from gpuscaler.core.gputable import extender_scores, fits, scores
from gpuscaler.extender.protocol import ExtenderArgs, ExtenderBindingArgs, Pod
from gpuscaler.extender.state import GpuState, Snapshot

log = logging.getLogger("gpuscaler.extender")


__all__ = ["KubeError"]  # the adapters' own error type: one KubeError in the project


class Binder(Protocol):
    def get_pod(self, namespace: str, name: str) -> PodRecord: ...

    def annotate(self, namespace: str, name: str, uid: str, values: dict[str, str | None]) -> None:
        """Merge `values` into the pod's annotations (None removes), only if its UID is `uid`."""

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...


FIT_REASONS = ("insufficient_memory", "insufficient_gpus")
"""Failed nodes (preemption could help); every other kind is unresolvable."""
NODE_REASONS = {
    "insufficient_memory": "not enough free GPU memory",
    "insufficient_gpus": "too few GPUs with the memory per GPU the pod asks for",
    "stale": STALE_REASON,
    "unknown_node": "node unknown to the GPU extender",
    "no_gpu_data": "no GPU metrics (dcgm-exporter)",
}


@dataclass
class FilterAnswer:
    kept: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    reasons: Counter[str] = field(default_factory=Counter)


@dataclass(eq=False)
class Extender:
    state: GpuState
    binder: Binder
    config: SchedulerConfig
    is_leader: Callable[[], bool]
    wall: Callable[[], float]

    def _request(self, pod: Pod, largest: float | None) -> tuple[PodRequest | None, str, str]:
        """The pod's request, or why there is none: the metric's reason and the sentence."""
        meta, spec, ours = pod.metadata, pod.spec, self.config.scheduler_name
        why = refusal(spec.schedulerName, spec.nodeName, meta.annotations, ours)
        if why is not None:
            return None, "not_ours", why
        try:
            req = pod_request(meta.annotations)
        except AnnotationError as e:
            return None, "bad_annotation", str(e)
        assert req is not None  # refusal() found the memory annotation
        problem = request_problem(req, largest)
        return (None, "bad_annotation", problem) if problem else (req, "", "")

    def filter(self, args: ExtenderArgs) -> FilterAnswer:
        names = args.node_names()
        answer = FilterAnswer()
        snap = self.state.snapshot
        req, kind, why = self._request(args.Pod, snap.largest_total)
        if req is None:  # nothing about a node would change this: unresolvable
            answer.unresolvable = dict.fromkeys(names, why)
            answer.reasons[kind] += len(names)
            return answer
        now = self.wall()
        table = snap.table
        rows = table.rows(names)
        known = rows >= 0
        good = np.zeros(len(names), dtype=bool)
        if known.any():
            at = rows[known]
            fresh = table.sampled_at[at] >= now - 3 * self.config.cache_ttl
            good[known] = fits(table, at, req) & fresh
        for i in np.flatnonzero(~good):
            name = names[i]
            kind, why = self._node_problem(snap, name, req, now)
            answer.reasons[kind] += 1
            (answer.failed if kind in FIT_REASONS else answer.unresolvable)[name] = why
        answer.kept = [names[i] for i in np.flatnonzero(good)]
        return answer

    def _node_problem(
        self, snap: Snapshot, name: str, req: PodRequest, now: float
    ) -> tuple[str, str]:
        """The kind of problem and its short sentence, the same for every node of a kind
        (kube-scheduler counts nodes per sentence; the answer stays proportional)."""
        view = snap.views.get(name)
        if view is None:
            if name in snap.problems:
                return "bad_node_annotation", snap.problems[name]
            kind = "no_gpu_data" if name in snap.meta else "unknown_node"
        elif freshness(now - view.sampled_at, self.config.cache_ttl) == "stale":
            kind = "stale"
        else:
            why = fit_problem(view, req)
            kind = "insufficient_gpus" if why and "GPU(s)" in why else "insufficient_memory"
        return kind, NODE_REASONS[kind]

    def prioritize(self, args: ExtenderArgs) -> list[tuple[str, int]]:
        names = args.node_names()
        req, _, _ = self._request(args.Pod, self.state.snapshot.largest_total)
        if req is None:
            return [(n, 0) for n in names]
        table = self.state.snapshot.table
        rows = table.rows(names)
        out = np.zeros(len(names), dtype=np.int64)
        known = rows >= 0
        if known.any():
            at = rows[known]
            fresh = table.sampled_at[at] >= self.wall() - 3 * self.config.cache_ttl
            out[known] = np.where(fresh, extender_scores(scores(table, at, req)), 0)
        return list(zip(names, out.tolist(), strict=True))

    def bind(self, b: ExtenderBindingArgs) -> str:
        """ "" when bound, else the error for ExtenderBindingResult.Error."""
        where = f"pod {b.PodNamespace}/{b.PodName}"
        if not self.is_leader():
            return "this extender replica is not the leader; the scheduler will retry"
        try:
            pod = self.binder.get_pod(b.PodNamespace, b.PodName)
            if pod.uid != b.PodUID:
                return f"{where} was replaced (UID {pod.uid}, binding asked for {b.PodUID})"
            ours = self.config.scheduler_name
            why = refusal(pod.scheduler_name, pod.node_name, pod.annotations, ours)
            if why is not None:
                return f"{where}: {why}"
            try:
                req = pod_request(pod.annotations)
            except AnnotationError as e:
                return f"{where}: {e}"
            assert req is not None  # refusal() found the memory annotation
            with self.state.node_lock(b.Node):
                return self._commit(b, req, where)
        except KubeError as e:
            return f"{where}: {e}"

    def _commit(self, b: ExtenderBindingArgs, req: PodRequest, where: str) -> str:
        snap = self.state.snapshot
        gpus, view = snap.gpus.get(b.Node), snap.views.get(b.Node)
        if gpus is None or view is None:
            return f"{where}: node {b.Node} has no GPU data"
        now = self.wall()
        if freshness(now - gpus.sampled_at, self.config.cache_ttl) != "fresh":
            return f"{where}: {STALE_REASON} on node {b.Node}"
        why = fit_problem(view, req)
        if why is not None:
            return f"{where}: no longer fits: {why}"
        mine = self.state.reservations_on(b.Node)
        chosen = place(with_reservations(gpus, mine), req, self.config.memory_margin)
        used = {g.uuid: g.used_mib for g in gpus.gpus}
        r = Reservation(
            b.PodUID,
            b.PodNamespace,
            b.PodName,
            b.Node,
            chosen,
            tuple((u, used[u]) for u, _ in chosen),
            now,
        )
        notes: dict[str, str | None] = dict(reservation_annotations(r, rfc3339(now, micro=True)))
        self.binder.annotate(b.PodNamespace, b.PodName, b.PodUID, notes)
        self.state.reserve(r)
        try:
            self.binder.bind(b.PodNamespace, b.PodName, b.PodUID, b.Node)
        except KubeError:
            self.state.release(b.PodUID)
            self._unannotate(b)
            raise
        log.info(
            "%s bound to %s, %d MiB reserved on %s",
            where,
            b.Node,
            req.memory_mib,
            ",".join(u for u, _ in chosen),
            extra={"event": "bound", "uid": b.PodUID, "node": b.Node},
        )
        return ""

    def _unannotate(self, b: ExtenderBindingArgs) -> None:
        keys = reservation_annotations(
            Reservation(b.PodUID, b.PodNamespace, b.PodName, b.Node, (), (), 0.0), ""
        )
        try:
            self.binder.annotate(b.PodNamespace, b.PodName, b.PodUID, dict.fromkeys(keys))
        except KubeError as e:  # the reservation then ends by its TTL
            log.warning("pod %s/%s: reservation not removed: %s", b.PodNamespace, b.PodName, e)
