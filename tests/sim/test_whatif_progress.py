"""whatif's progress bar: the share of the replay done from the workloads done or the
lockstep chunks' ticks, the time taken and left, and the worker processes' reports
through a queue."""

from __future__ import annotations

import io
import queue

import pytest
from builders import Terminal
from threadpoolctl import threadpool_info, threadpool_limits

import gpuscaler.whatif.progress as progress_module
from gpuscaler.whatif.progress import Progress, drain, reporters, worker_init


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _last_line(term: Terminal) -> str:
    return term.getvalue().split("\r")[-1]


@pytest.mark.parametrize(
    ("shares", "done", "filled"),
    [
        ({}, 0, 0),
        ({0: (2, 0.5)}, 0, 3),  # 2 of 10 workloads half ticked: 10 %
        ({0: (5, 0.5), 1: (5, 0.5)}, 0, 15),
        ({0: (5, 1.0), 1: (5, 0.2)}, 5, 18),  # the ticks say more than the workloads done
        ({0: (5, 0.1)}, 5, 15),  # the workloads done say more than the ticks
    ],
)
def test_the_bar_fills_with_the_workloads_done_or_the_chunks_ticks_whichever_is_more(
    shares: dict[int, tuple[int, float]], done: int, filled: int
) -> None:
    term = Terminal()
    bar = Progress(term, total=10)
    bar.done = done
    for chunk, (size, share) in shares.items():
        bar.replayed(chunk, size, share)
    bar.show()
    assert _last_line(term).startswith("[" + "#" * filled + "." * (30 - filled) + "]")


def test_the_time_left_is_estimated_from_the_share_done_once_there_is_enough() -> None:
    term, clock = Terminal(), _Clock()
    bar = Progress(term, total=4, clock=clock)
    clock.now += 5
    bar.replayed(0, 4, 0.01)  # 1 %: too little to estimate from
    assert "left" not in _last_line(term)
    assert "0:05" in _last_line(term)
    clock.now += 55  # a minute in, a quarter done: three more minutes
    bar.replayed(0, 4, 0.25)
    assert "1:00, about 3:00 left" in _last_line(term)
    bar.replayed(0, 4, 1.0)
    assert "left" not in _last_line(term)


def test_the_workers_reports_reach_the_bar_through_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    to: queue.Queue[tuple[object, ...]] = queue.Queue()
    monkeypatch.setattr(progress_module, "_QUEUE", None)
    worker_init(to)  # as a worker process starts
    requests, ticked = reporters(chunk=1, size=3)
    requests(2)
    ticked(0.5)
    term = Terminal()
    bar = Progress(term, total=6)
    drain(to, bar)
    assert bar.requests == 2 and bar.shares == {1: (3, 0.5)}
    assert "2 range queries" in _last_line(term)
    assert to.empty()
    drain(None, bar)  # no queue (not on a terminal): nothing to show
    worker_init(None)  # a worker without a queue: its reports go nowhere
    requests, ticked = reporters(chunk=0, size=1)
    requests(1)
    ticked(1.0)
    assert to.empty()


def test_a_worker_process_runs_blas_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "_QUEUE", None)
    with threadpool_limits(limits=2, user_api="blas"):
        worker_init(None)
        blas = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
        assert blas and set(blas) == {1}


def test_the_bar_shows_on_a_terminal_only() -> None:
    term, plain = Terminal(), io.StringIO()
    for out in (term, plain):
        bar = Progress(out, total=4)
        bar.request(3)
        bar.workload("ns/ScaledObject/chat")
        bar.close()
    assert "[" + "#" * 8 + "." * 22 + "] 1/4 workloads, 3 range queries" in term.getvalue()
    assert term.getvalue().endswith("\n")
    assert plain.getvalue() == ""
