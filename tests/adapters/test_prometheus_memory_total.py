"""A pool's frame-buffer total is read every few minutes, not every tick: kept between
reads, read again for a pool new or changed, GPUs back from silence or a read that found
nothing; a failed refresh keeps it up to `memory_total_every` + `metrics.staleness`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from gpuscaler.adapters.prometheus.source import PoolMetrics, PrometheusMetrics, Totals
from gpuscaler.adapters.prometheus.transport import SourceError, Transport
from gpuscaler.config import Config, parse_config

T0 = 1_800_000_000.0


def _config(
    every: str = "5m", pools: tuple[str, ...] = ("a", "b"), model: str = "M", grouped: bool = True
) -> Config:
    listed = "\n".join(
        f"  - {{name: {p}, selector: {{label: pool, value: {p}}}, gpu_memory_gib: 80, "
        f"metrics_matchers: {{modelName: {model}{p}}}}}"
        for p in pools
    )
    return parse_config(
        f'prometheus: {{url: "http://fake:1", memory_total_every: {every}, '
        f"grouped_queries: {str(grouped).lower()}}}\n"
        "metrics: {window: 10m, step: 500ms, staleness: 2m}\n"
        f"node_pools:\n{listed}\nworkloads: []\n"
    )


class Fake(Transport):
    """Utilization and stall always fine; each pool's frame buffer as `used` and `total`
    say (MiB, None for no sample, "fail" for a failed query, NaN): 1 of 80 GiB at first."""

    def __init__(self, config: Config):
        super().__init__(config.prometheus)
        self.used: dict[str, float | None] = {"a": 1.0, "b": 1.0}
        self.total: dict[str, float | str | None] = {"a": 81_920.0, "b": 81_920.0}
        self.asked: list[str] = []

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Any]:
        times = np.arange(math.floor(start), math.floor(end) + 1e-9, step)
        labels = [{"modelName": m} for m in self._models(query)] if " by " in query else [{}]
        return [{"metric": m, "values": [[t, "50"] for t in times.tolist()]} for m in labels]

    def query(self, query: str, time: float | None = None) -> list[Any]:
        total = "FB_FREE" in query
        self.asked.append("total" if total else "used")
        answer: list[Any] = []
        for model in self._models(query):
            pool = model[1:]
            value = (self.total if total else self.used).get(pool)
            if value == "fail":
                raise SourceError("timed out")
            if value is not None:
                answer.append({"metric": {"modelName": model}, "value": [time, f"{value}"]})
        return answer

    @staticmethod
    def _models(query: str) -> list[str]:
        """The pools' modelName values a query asks for (none: the pool rules' check)."""
        for head in ('modelName=~"', 'modelName="'):
            if head in query:
                start = query.index(head) + len(head)
                return query[start : query.index('"', start)].split("|")
        return []


def _reader(grouped: bool, every: str = "5m") -> tuple[PrometheusMetrics, Fake]:
    config = _config(every, grouped=grouped)
    fake = Fake(config)
    reader = PrometheusMetrics(config, fake)
    return reader, fake


def _pool(reader: PrometheusMetrics, now: float, name: str = "a") -> PoolMetrics:
    return next(p for p in reader.read(now).pools if p.name == name)


READERS = pytest.mark.parametrize("grouped", [False, True], ids=["per_target", "grouped"])


@READERS
def test_the_total_is_read_once_and_kept_until_it_is_due(grouped: bool) -> None:
    reader, fake = _reader(grouped)
    fake.used, fake.total = {"a": 30_000.0, "b": 1.0}, {"a": 81_920.0, "b": 40_960.0}
    assert _pool(reader, T0).memory_total_gib == 80.0
    assert fake.asked.count("total") == (1 if grouped else 2)  # one grouped query, or per pool
    fake.asked.clear()
    fake.total = {"a": 40_960.0, "b": 40_960.0}  # what a re-read would see
    for k in range(1, 10):  # 30 s ticks for 4.5 min: the kept total stands
        pool = _pool(reader, T0 + 30 * k)
        assert (pool.memory_total_gib, pool.problem) == (80.0, None)
    assert "total" not in fake.asked and "used" in fake.asked  # used: fresh every tick
    assert _pool(reader, T0 + 300).memory_total_gib == 40.0  # 5 min: read again


@READERS
def test_every_zero_reads_the_total_every_tick(grouped: bool) -> None:
    reader, fake = _reader(grouped, every="0s")
    for k, mib in enumerate([81_920.0, 40_960.0, 20_480.0]):
        fake.total = {"a": mib, "b": mib}
        assert _pool(reader, T0 + 30 * k).memory_total_gib == mib / 1024
    assert reader.totals.kept == {}


@READERS
@pytest.mark.parametrize(
    ("after", "total", "want"),
    [
        # A refresh that fails keeps the kept total while younger than 5 min + 2 min...
        (300, "fail", (80.0, None)),
        (420, "fail", (80.0, None)),
        # ...past that, the failure is the pool's problem: no action.
        (421, "fail", (None, "timed out")),
        (900, "fail", (None, "timed out")),
        # A refresh that finds nothing forgets it: the config's memory bounds.
        (300, None, (None, None)),
        # A NaN total is a problem.
        (300, float("nan"), (None, "NaN or Inf in the newest samples")),
        # Before it is due, nothing is asked: a failure then is not seen.
        (299, "fail", (80.0, None)),
    ],
)
def test_a_total_older_than_the_limit_is_not_used_and_its_failure_stops_action(
    grouped: bool, after: float, total: float | str | None, want: tuple[Any, Any]
) -> None:
    reader, fake = _reader(grouped)
    assert _pool(reader, T0).memory_total_gib == 80.0
    fake.total = {"a": total, "b": 81_920.0}
    pool = _pool(reader, T0 + after)
    assert (pool.memory_total_gib, pool.problem) == want
    assert reader.health.ok == (total != "fail" or after < 300)  # a failure is still logged


@READERS
def test_a_failed_refresh_is_tried_again_at_the_next_tick(grouped: bool) -> None:
    reader, fake = _reader(grouped)
    _pool(reader, T0)
    fake.total = {"a": "fail", "b": "fail"}
    assert _pool(reader, T0 + 300).memory_total_gib == 80.0
    fake.total = {"a": 40_960.0, "b": 40_960.0}
    fake.asked.clear()
    assert _pool(reader, T0 + 330).memory_total_gib == 40.0
    assert "total" in fake.asked


@READERS
def test_a_pool_whose_gpus_stop_reporting_has_no_total_and_is_read_again_when_they_return(
    grouped: bool,
) -> None:
    reader, fake = _reader(grouped)
    _pool(reader, T0)
    fake.used, fake.total = {"b": 1.0}, {"b": 81_920.0}  # pool a's GPUs gone quiet
    pool = _pool(reader, T0 + 30)
    assert (pool.memory_used_gib, pool.memory_total_gib, pool.problem) == (None, None, None)
    fake.used, fake.total = {"a": 1.0, "b": 1.0}, {"a": 40_960.0, "b": 81_920.0}  # other GPUs
    assert _pool(reader, T0 + 60).memory_total_gib == 40.0
    assert _pool(reader, T0 + 60, "b").memory_total_gib == 80.0  # b's kept one


@READERS
def test_a_new_or_changed_pool_is_read_at_once_the_others_keep_theirs(grouped: bool) -> None:
    reader, fake = _reader(grouped)
    fake.used = {"a": 1.0, "b": 1.0, "c": 1.0}
    fake.total = {"a": 81_920.0, "b": 81_920.0, "c": 81_920.0}
    _pool(reader, T0)
    fake.total = {"a": 40_960.0, "b": 40_960.0, "c": 20_480.0}
    reader.reconfigure(_config(pools=("a", "b", "c"), grouped=grouped))
    got = {p.name: p.memory_total_gib for p in reader.read(T0 + 30).pools}
    assert got == {"a": 80.0, "b": 80.0, "c": 20.0}
    # Other matchers: all anew.
    reader.reconfigure(_config(pools=("a", "b", "c"), model="N", grouped=grouped))
    got = {p.name: p.memory_total_gib for p in reader.read(T0 + 60).pools}
    assert got == {"a": 40.0, "b": 40.0, "c": 20.0}


def test_the_grouped_reader_sends_one_query_less_on_the_ticks_the_total_rests() -> None:
    reader, _ = _reader(True)
    reader.read(T0)
    first = reader.queries_last_tick
    reader.read(T0 + 30)
    assert reader.queries_last_tick == first - 2  # the total and the pool rules' check rest
    reader.read(T0 + 300)
    assert reader.queries_last_tick == first  # both due again (every 5 min)
    reader.read(T0 + 330)
    assert reader.queries_last_tick == first - 2


@pytest.mark.parametrize(
    ("age", "due", "within"),
    [
        (0, False, True),
        (299.9, False, True),
        (300, True, True),
        (420, True, True),
        (420.1, True, False),
        (-1, True, False),
    ],
)
def test_a_kept_total_is_due_at_the_period_and_usable_up_to_period_plus_staleness(
    age: float, due: bool, within: bool
) -> None:
    totals = Totals(_config())
    totals.store("pool:a:fb_total", 80.0, T0)
    assert totals.due("pool:a:fb_total", T0 + age) is due
    assert (totals.kept_within_limit("pool:a:fb_total", T0 + age) == 80.0) is within
    assert totals.due("pool:b:fb_total", T0)  # none kept
