"""What a what-if replay holds of a workload while its lane runs: its history only until it
is checked (`Ready` keeps the arrivals, the replicas that ran and the limits' words, not
the demand read), and whatif hands the histories it read over one by one."""

from __future__ import annotations

import gc
import math
import weakref

import numpy as np
import pytest
from builders import workload_history

from gpuscaler.config import Config, WorkloadConfig
from gpuscaler.core.history import WorkloadHistory
from gpuscaler.core.model import Series
from gpuscaler.whatif.command import handed_over
from gpuscaler.whatif.history import Ready, ready, replay_many

W = WorkloadConfig(namespace="ns", kind="ScaledObject", name="chat")
N = 3 * 360 + 3  # 3 h at 10 s, one step of margin each side


def _history(holes: int, replicas: bool, problem: str | None, key: str = W.key) -> WorkloadHistory:
    """3 h of request rate with `holes` gaps of 3 steps (and NaN values in the replicas)."""
    rng = np.random.default_rng(holes)
    rate = rng.uniform(20, 40, N)
    for k in range(holes):
        rate[100 + 200 * k : 103 + 200 * k] = math.nan
    reps = np.where(rng.random(N) < 0.05, math.nan, np.ceil(rate / 8))
    series = [Series(1000.0, 10.0, rate), None, Series(1000.0, 10.0, reps) if replicas else None]
    unmatched = "no series matched"
    return workload_history(
        key, N, *series, problems=(problem, unmatched, None if replicas else unmatched)
    )


@pytest.mark.parametrize(
    ("holes", "replicas", "problem"),
    [
        (0, True, None),
        (1, False, None),
        (4, True, "2 value(s) outside [0, 1e+06]"),  # more than 3 gaps: the line ends in ...
        (2, False, "1 value(s) not finite"),
    ],
)
@pytest.mark.parametrize("actual", [None, {"gpu_hours": 1.0}])
def test_a_ready_replay_words_its_limits_from_the_whole_history(
    holes: int, replicas: bool, problem: str | None, actual: dict[str, float] | None
) -> None:
    r = ready(_history(holes, replicas, problem), Config(workloads=(W,)), W, 1)
    assert isinstance(r, Ready), r
    why = "no kube-state-metrics replica series matched" if replicas else "no series matched"
    said = (
        "the replicas that ran are replayed at the pool's initial fragments"
        if actual is not None
        else f"replicas that ran unknown ({why}): no replay of them"
    )
    dropped = [] if problem is None else [f"workload_requests: {problem} (those samples dropped)"]
    assert r.limits(actual) == [*r.gap_lines, said, *dropped]
    assert [line.split(" in ")[0] for line in r.gap_lines] == ([f"{holes} gap(s)"] if holes else [])
    assert all(line.endswith(" ...") == (holes > 3) for line in r.gap_lines)
    assert (r.replicas.series is not None) == replicas


def test_a_ready_replay_holds_no_array_of_its_demand() -> None:
    history = _history(1, True, None)
    demand = history.requests.series
    assert demand is not None
    r = ready(history, Config(workloads=(W,)), W, 1)
    assert isinstance(r, Ready)
    held = [v for v in vars(r).values() if isinstance(v, np.ndarray)]
    held += [v for v in vars(r.prepared).values() if isinstance(v, np.ndarray)]
    assert held  # the arrivals
    assert not any(np.shares_memory(v, demand.values) for v in held)
    assert not any(isinstance(v, WorkloadHistory | Series) for v in vars(r).values())


def test_histories_handed_over_are_let_go_once_checked() -> None:
    """replay_many drops each history after `ready`: none is alive when the first replay
    comes out (the caller's list handed them over)."""
    workloads = [W.model_copy(update={"name": f"w{i}"}) for i in (0, 1)]
    histories = [(_history(0, True, None, w.key), w) for w in workloads]
    alive = [weakref.ref(h.requests.series) for h, _ in histories]
    config = Config(workloads=tuple(workloads))
    out = replay_many(handed_over(histories), config, 1, baselines=False, lanes=2, plot=False)
    first = next(out)
    gc.collect()
    assert not histories  # all handed over
    assert all(ref() is None for ref in alive)
    assert first is not None


@pytest.mark.parametrize("n", [0, 1, 5])
def test_handed_over_gives_every_item_in_order_and_empties_the_list(n: int) -> None:
    items = list(range(n))
    seen = []
    for x in handed_over(items):
        seen.append(x)
        assert len(items) == n - len(seen)
    assert seen == list(range(n))
