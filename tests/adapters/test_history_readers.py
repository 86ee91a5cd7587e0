"""whatif's reader reads several workloads at a time: the same histories, in order."""

from __future__ import annotations

import re
import threading
import time
from typing import Any, ClassVar

import numpy as np
import pytest

from gpuscaler.adapters.prometheus import history as history_module
from gpuscaler.adapters.prometheus.history import HistoryReader
from gpuscaler.adapters.prometheus.transport import Transport
from gpuscaler.config import Config, parse_config
from gpuscaler.core.history import WorkloadHistory

STEP = 10.0
START = 1_700_000_000.0
END = START + 3 * 3600.0  # 1,081 points: one range request a signal


def _config(workloads: int) -> Config:
    lines = [
        "prometheus:",
        '  url: "http://fake:1"',
        "  queries:",
        '    workload_requests: "sum(rate(requests_total{{{matchers}}}[1m]))"',
        "node_pools:",
        "  - {name: p, selector: {label: l, value: v}, gpu_memory_gib: 80,",
        "     workload_type: inference, profile: compute_bound}",
        "workloads:" if workloads else "workloads: []",
    ]
    lines += [
        f"  - {{namespace: ns, kind: ScaledObject, name: w{i:02d}, node_pool: p}}"
        for i in range(workloads)
    ]
    return parse_config("\n".join(lines) + "\n")


class Fake(Transport):
    """Each workload's request rate (its number + the time's minute) and, for even ones,
    its HPA's replicas; records the thread and transport of every request."""

    seen: ClassVar[list[tuple[int, int]]] = []

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Any]:
        Fake.seen.append((threading.get_ident(), id(self)))
        time.sleep(0.002)  # a server's answer takes time: the threads overlap
        number = int(re.findall(r"w(\d\d)", query)[0])
        times = np.arange(start, end + 1e-9, step)
        if "replicas" in query:
            if "deployment" in query or number % 2:
                return []
            values = [[t, f"{number % 5 + 1}"] for t in times.tolist()]
        else:
            values = [[t, f"{number + (t // 60) % 60}"] for t in times.tolist()]
        return [{"metric": {}, "values": values}]


def _same(a: WorkloadHistory, b: WorkloadHistory) -> bool:
    signals = zip((a.requests, a.load, a.replicas), (b.requests, b.load, b.replicas), strict=True)
    for x, y in signals:
        assert (x.name, x.query, x.problem) == (y.name, y.query, y.problem)
        assert (x.series is None) == (y.series is None)
        if x.series is not None and y.series is not None:
            assert np.array_equal(x.series.values, y.series.values, equal_nan=True)
    return a.key == b.key


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> None:
    Fake.seen = []
    monkeypatch.setattr(history_module, "Transport", Fake)


@pytest.mark.usefixtures("fake")
@pytest.mark.parametrize(("workloads", "readers"), [(10, 4), (10, 2), (3, 8), (1, 4), (0, 4)])
def test_several_workloads_at_once_read_what_one_at_a_time_reads(
    workloads: int, readers: int
) -> None:
    config = _config(workloads)
    calls: list[int] = []
    reader = HistoryReader(config, progress=calls.append)
    one_by_one = [reader.workload(w, START, END, STEP) for w in config.workloads]
    asked = len(calls)
    Fake.seen = []
    got = reader.workloads(list(config.workloads), START, END, STEP, readers=readers)
    assert [h.key for h in got] == [w.key for w in config.workloads]
    assert all(_same(a, b) for a, b in zip(one_by_one, got, strict=True))
    assert len(calls) == 2 * asked  # every request counted on the progress bar
    assert len(Fake.seen) == asked
    threads = {t for t, _ in Fake.seen}
    transports = {t for _, t in Fake.seen}
    if workloads > 1:
        assert 1 < len(threads) <= readers
        assert len(transports) == len(threads)  # one transport a thread
    if workloads:
        assert got[0].requests.series is not None and got[0].replicas.series is not None
        assert got[-1].replicas.series is None or workloads % 2


def test_a_reader_on_a_given_transport_reads_one_workload_at_a_time() -> None:
    config = _config(4)
    Fake.seen = []
    given = Fake(config.prometheus)
    reader = HistoryReader(config, transport=given)
    got = reader.workloads(list(config.workloads), START, END, STEP, readers=4)
    assert len(got) == 4
    assert {t for t, _ in Fake.seen} == {threading.get_ident()}
    assert {t for _, t in Fake.seen} == {id(given)}
