"""What the node agent's parts share: its Kubernetes client, a poll's report, and what
the orphan cleanup reads and writes of the agent (so `cleanup` does not import `runner`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gpuscaler.adapters.host import HostFs
from gpuscaler.adapters.node import NodeView
from gpuscaler.agent.metrics import AgentMetrics
from gpuscaler.core.node_agent import GpuFacts
from gpuscaler.core.orphans import GpuProc, OrphanAction


class NodeClient(Protocol):
    """What the agent needs of the Kubernetes API (gpuscaler.adapters.node.NodeApi)."""

    node: str

    def read(self) -> NodeView: ...
    def pods(self) -> dict[str, frozenset[str]]: ...
    def annotate(self, values: dict[str, str]) -> NodeView: ...
    def lift_quarantine(self) -> NodeView: ...
    def event(self, reason: str, action: str, note: str, type_: str = "Normal") -> None: ...


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

    node: NodeClient
    host: HostFs
    metrics: AgentMetrics
    not_acting: str
    signalled: dict[tuple[int, int], GpuProc]
    sent: set[tuple[tuple[int, int], str]]
    reported: set[tuple[str, tuple[int, int]]]

    def gpu_index(self, uuid: str) -> str: ...
