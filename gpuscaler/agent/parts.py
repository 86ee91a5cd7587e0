"""What the node agent's parts share: a poll's report, and what the orphan cleanup reads
and writes of the agent (so `cleanup` does not import `runner`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gpuscaler.adapters.host import HostFs
from gpuscaler.adapters.node import NodeApi
from gpuscaler.agent.metrics import AgentMetrics
from gpuscaler.core.node_agent import GpuFacts
from gpuscaler.core.orphans import GpuProc, OrphanAction


@dataclass
class PollReport:
    """What one poll saw and did (for logs and tests)."""

    gpus: list[GpuFacts] = field(default_factory=list)
    actions: list[OrphanAction] | None = None
    time_slice_set: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    lifted: bool = False


class CleanupState(Protocol):
    """The agent as the orphan cleanup sees it (`runner.NodeAgent`)."""

    node: NodeApi
    host: HostFs
    metrics: AgentMetrics
    not_acting: str
    signalled: dict[tuple[int, int], GpuProc]
    sent: set[tuple[tuple[int, int], str]]
    reported: set[tuple[str, tuple[int, int]]]

    def gpu_index(self, uuid: str) -> str: ...
