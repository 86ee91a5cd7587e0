"""A simulated batch GPU pool for the preemption tiers: full of low-priority training pods
when a burst of high-priority pods arrives.

The model (stated wherever results are shown):
- `nodes` nodes of `gpus_per_node` whole GPUs, every GPU held by a batch pod (priority 10)
  of 1 or 2 GPUs; half of them checkpointed in the last 10 minutes.
- At `burst_after` into the replay, `burst_pods` pods of priority 1,000,000 asking for 2
  GPUs each arrive; the scheduler finds no room (they are Unschedulable).
- A victim asked to checkpoint acknowledges after `checkpoint_seconds` if it supports
  checkpoints (every fourth pod does), else ignores the request until evicted.
- An evicted pod terminates after its grace period; its GPU memory is released 10 s
  later, except for one pod in eight (the 3rd, 11th, ...) whose process leaks it:
  tier 3 must catch that.
- A pending pod binds as soon as a node has its GPUs free and not quarantined.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpuscaler.config import PreemptionConfig
from gpuscaler.core.decisions import CheckpointRequest, Eviction, PreemptionStep
from gpuscaler.core.preemption import NodeView, PodView, PreemptionObservation, VictimState

BATCH_PRIORITY = 10
CRITICAL_PRIORITY = 1_000_000
CHECKPOINT_SECONDS = 45.0
"""A checkpointing victim saves its state this long after being asked."""
MEMORY_RELEASE_SECONDS = 10.0


@dataclass
class SimPod:
    view: PodView
    supports_checkpoint: bool = False
    leaks_memory: bool = False
    asked_at: float | None = None
    gone_at: float | None = None


@dataclass
class SimulatedPreemption:
    start: float
    cfg: PreemptionConfig
    nodes: int = 2
    gpus_per_node: int = 8
    burst_after: float = 1800.0
    burst_pods: int = 2
    grace: float = 30.0
    pods: dict[str, SimPod] = field(default_factory=dict)
    states: dict[str, VictimState] = field(default_factory=dict)
    quarantined: set[str] = field(default_factory=set)
    steps: list[PreemptionStep] = field(default_factory=list)
    scheduled: dict[str, float] = field(default_factory=dict)
    """Beneficiary -> when it bound to a node."""
    _gone: dict[str, SimPod] = field(default_factory=dict)

    def __post_init__(self) -> None:
        i = 0
        for n in range(self.nodes):
            used = 0
            while used < self.gpus_per_node:
                gpus = 2 if (i % 3 == 0 and used + 2 <= self.gpus_per_node) else 1
                key = f"batch/train-{i}"
                fresh = i % 2 == 0
                self.pods[key] = SimPod(
                    PodView(
                        key,
                        "batch",
                        f"batch-{n}",
                        gpus,
                        BATCH_PRIORITY,
                        "Running",
                        start_time=self.start - 7200 + 60 * i,
                        checkpoint_at=self.start - 300 if fresh else self.start - 7200,
                    ),
                    supports_checkpoint=i % 4 == 0,
                    leaks_memory=i % 8 == 2,
                )
                used += gpus
                i += 1

    def _arrive(self, now: float) -> None:
        at = self.start + self.burst_after
        if now < at:
            return
        for j in range(self.burst_pods):
            key = f"serving/critical-{j}"
            if key not in self.pods and key not in self.scheduled:
                self.pods[key] = SimPod(
                    PodView(
                        key,
                        "serving",
                        None,
                        2,
                        CRITICAL_PRIORITY,
                        "Pending",
                        unschedulable_since=at,
                    )
                )

    def _free(self, node: str) -> int:
        held = sum(p.view.gpus for p in self.pods.values() if p.view.node == node)
        return self.gpus_per_node - held

    def advance(self, now: float) -> None:
        """Victims checkpoint, terminate and release memory; pending pods bind."""
        self._arrive(now)
        for key, p in list(self.pods.items()):
            v = p.view
            acknowledges = p.supports_checkpoint and v.checkpoint_done_at is None
            if acknowledges and p.asked_at is not None and now - p.asked_at >= CHECKPOINT_SECONDS:
                p.view = replace(v, checkpoint_done_at=p.asked_at + CHECKPOINT_SECONDS)
            if v.terminating_since is not None and now - v.terminating_since >= self.grace:
                p.gone_at = v.terminating_since + self.grace
                del self.pods[key]
                self._gone[key] = p
        for key, p in list(self.pods.items()):
            if p.view.node is None:
                for n in range(self.nodes):
                    node = f"batch-{n}"
                    if node not in self.quarantined and self._free(node) >= p.view.gpus:
                        p.view = replace(p.view, node=node, phase="Running")
                        self.scheduled[key] = now
                        break

    def observe(self, now: float) -> PreemptionObservation:
        names = [f"batch-{n}" for n in range(self.nodes)]
        gpus = [0 if name in self.quarantined else self.gpus_per_node for name in names]
        nodes = tuple(NodeView(name, g, 72.0) for name, g in zip(names, gpus, strict=True))
        released: dict[str, bool | None] = {}
        for key, s in self.states.items():
            if s.tier == "cleanup":
                gone = self._gone.get(key)
                if gone is not None and gone.gone_at is not None:
                    if gone.leaks_memory:
                        released[key] = False
                    elif now - gone.gone_at >= MEMORY_RELEASE_SECONDS:
                        released[key] = True
        pods = tuple(p.view for p in self.pods.values())
        return PreemptionObservation(pods, nodes, tuple(self.states.values()), released)

    def apply(self, d: PreemptionStep) -> None:
        now = d.time
        s = self.states.get(d.target)
        match d:
            case CheckpointRequest():
                s = VictimState(
                    d.target, d.beneficiary, d.node, d.gpus, d.priority, "soft", now, now, d.reason
                )
                self.pods[d.target].asked_at = now
                self.states[d.target] = s
                self.steps.append(d)
                return
        assert s is not None
        pod = self.pods.get(d.target)
        match d:
            case Eviction() if pod is not None:
                pod.view = replace(pod.view, terminating_since=now)
                s = replace(s, evicted_at=now, attempts=s.attempts + 1, last_attempt_at=now)
            case PreemptionStep(action="force_delete" | "delete") if pod is not None:
                del self.pods[d.target]
                pod.gone_at = now
                self._gone[d.target] = pod
            case PreemptionStep(action="quarantine"):
                self.quarantined.add(s.node)
        if d.to_value != s.tier:
            s = replace(s, tier=d.to_value, since=now)
            if d.action == "record_gone":
                s = replace(s, gone_at=now)
        self.states[d.target] = s
        self.steps.append(d)

    def summary(self) -> dict[str, object]:
        tiers = [d.to_value for d in self.steps]
        waits = [t - (self.start + self.burst_after) for t in self.scheduled.values()]
        evictions = [d for d in self.steps if isinstance(d, Eviction)]
        return {
            "victims_asked_to_checkpoint": tiers.count("soft"),
            "evicted_after_a_checkpoint": sum("acknowledged" in d.reason for d in evictions),
            "evicted_after_the_grace": sum("grace" in d.reason for d in evictions),
            "memory_released": tiers.count("done"),
            "quarantined_nodes": len(self.quarantined),
            "high_priority_pods_placed": f"{len(self.scheduled)}/{self.burst_pods}",
            "seconds_to_place": round(max(waits), 1) if waits else None,
        }
