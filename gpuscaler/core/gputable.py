"""Filter and Score (`gpufit`'s rules) for every node kube-scheduler asks about, as arrays;
the sentences for refused nodes come from `gpufit.fit_problem`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpuscaler.core.gpufit import FRAGMENTATION_WEIGHT, TOPOLOGY_WEIGHT, NodeView, PodRequest
from gpuscaler.core.model import BoolArray, FloatArray, IntArray


@dataclass(frozen=True)
class NodeTable:
    """Row i is node names[i]; GPU columns padded with usable -1 (never fits)."""

    names: tuple[str, ...]
    index: dict[str, int]
    usable: FloatArray  # (nodes, gpus)
    domain: IntArray  # (nodes, gpus): the GPU's NUMA domain, numbered 0.. within its node
    usable_sum: FloatArray
    fragmentation: FloatArray
    sampled_at: FloatArray

    def rows(self, names: Sequence[str]) -> IntArray:
        """Row of each name, -1 for names not in the table."""
        get = self.index.get
        return np.fromiter((get(n, -1) for n in names), dtype=np.int64, count=len(names))


def node_table(views: Mapping[str, NodeView]) -> NodeTable:
    names = tuple(views)
    width = max((len(v.usable_sorted) for v in views.values()), default=1) or 1
    usable = np.full((len(names), width), -1.0)
    domain = np.full((len(names), width), -1, dtype=np.int64)
    for i, name in enumerate(names):
        col = 0
        for d, values in enumerate(views[name].domains):
            usable[i, col : col + len(values)] = values
            domain[i, col : col + len(values)] = d
            col += len(values)
    return NodeTable(
        names=names,
        index={n: i for i, n in enumerate(names)},
        usable=usable,
        domain=domain,
        usable_sum=np.array([views[n].usable_sum for n in names], dtype=np.float64),
        fragmentation=np.array([views[n].fragmentation for n in names], dtype=np.float64),
        sampled_at=np.array([views[n].sampled_at for n in names], dtype=np.float64),
    )


def fits(table: NodeTable, rows: IntArray, req: PodRequest) -> BoolArray:
    """Whether the pod fits each row (`gpufit.fit_problem` is None; rows must be valid)."""
    fitting = (table.usable[rows] >= req.per_gpu_mib).sum(axis=1)
    ok: BoolArray = (table.usable_sum[rows] >= req.memory_mib) & (fitting >= req.gpu_count)
    return ok


def scores(table: NodeTable, rows: IntArray, req: PodRequest) -> FloatArray:
    """0..100 for each row: even memory use weighted 0.6, a one-NUMA-domain fit 0.4 (1-GPU
    pods get no bonus). Rows must be valid."""
    value = FRAGMENTATION_WEIGHT * (100.0 - 100.0 * table.fragmentation[rows])
    if req.gpu_count <= 1:
        return value
    fitting = table.usable[rows] >= req.per_gpu_mib
    domain = table.domain[rows]
    best = np.zeros(len(rows), dtype=np.int64)
    for d in range(table.domain.shape[1]):
        best = np.maximum(best, (fitting & (domain == d)).sum(axis=1))
    bonus = np.where(best >= req.gpu_count, 100.0, 100.0 * best / req.gpu_count)
    return value + TOPOLOGY_WEIGHT * bonus


def extender_scores(values: FloatArray) -> IntArray:
    """0..100 to kube-scheduler's 0..10: /10, rounded half up."""
    return np.clip(np.floor(values / 10.0 + 0.5), 0, 10).astype(np.int64)
