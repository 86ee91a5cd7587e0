"""Three-tier preemption of low-priority GPU pods, as pure functions.

Victims are chosen for a long-pending high-priority pod (`choice`, docs/preemption.md);
each then goes through the tiers:

    none -> soft      ask to checkpoint (annotation, optional HTTP call)
    soft -> hard      checkpoint acknowledged, or soft_grace over: evict (evidence first)
    soft -> cleanup   the pod exited by itself
    soft -> aborted   the beneficiary no longer needs it (scheduled elsewhere, gone)
    hard -> hard      retry an eviction a PDB refused; force-delete a pod stuck Terminating
    hard -> given_up  a PDB kept refusing (another victim is chosen next tick)
    hard -> cleanup   the pod is gone
    cleanup -> done         its GPU memory was seen released (or cannot be measured)
    cleanup -> quarantined  memory stays held on a GPU with no pod: taint the node

`TRANSITIONS` is the whole table; every step is checked against it here and by the adapter
before acting, so a restart resumes, never repeats.
"""

from __future__ import annotations

from gpuscaler.core.preemption.decide import (
    decide_preemption,
    forecast_beneficiaries,
    fragments_beneficiaries,
)
from gpuscaler.core.preemption.tiers import (
    IN_FLIGHT,
    TRANSITIONS,
    TransitionError,
    check_transition,
)
from gpuscaler.core.preemption.views import (
    DeviceHold,
    NodeView,
    PodView,
    PreemptionObservation,
    VictimState,
)

__all__ = [
    "IN_FLIGHT",
    "TRANSITIONS",
    "DeviceHold",
    "NodeView",
    "PodView",
    "PreemptionObservation",
    "TransitionError",
    "VictimState",
    "check_transition",
    "decide_preemption",
    "forecast_beneficiaries",
    "fragments_beneficiaries",
]
