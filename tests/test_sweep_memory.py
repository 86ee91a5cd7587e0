"""What a sweep holds a run and a slot (`gpuscaler.sim.sweep`, `gpuscaler.sim.around`):
the GPUs held as whole-number sums of each slot's samples (int16, int32 once they may
outgrow it) and not as doubles, the
scalers' signals a workload and not a run, the templates' random streams held once, the
kept runs' records without copies. Each is checked against what it replaces (the old
computation kept here), to the bit."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sweep_many import MIXED, _config, _replay

from gpuscaler.sim import sweep as sweep_module
from gpuscaler.sim import sweep_groups
from gpuscaler.sim.around import SHARED, _template, _templates
from gpuscaler.sim.equal_cost import BASELINES
from gpuscaler.sim.scalers import ScalerKind
from gpuscaler.sim.simulate import Prepared
from gpuscaler.sim.sweep import RUN_SLOT_BYTES, Sweep
from gpuscaler.sim.sweep_groups import group_size, sweep_parts
from gpuscaler.sim.swept import held_gpus


def _old_gpus(held: np.ndarray, fragments: int, sub: int) -> np.ndarray:
    """What `Sweep._pods_at` stored before: each sample's GPUs, their mean over a slot."""
    g = np.ceil(held / fragments)
    if sub > 1:
        g = g.reshape(held.shape[0], -1, sub).mean(axis=2)
    return np.asarray(g, dtype=np.float64)


def _new_gpus(held: np.ndarray, fragments: int, sub: int) -> np.ndarray:
    g = np.ceil(held / fragments)
    sums = np.zeros((held.shape[0], held.shape[1] // sub), dtype=np.int32)
    sums[:] = g.reshape(held.shape[0], -1, sub).sum(axis=2)
    return np.stack([held_gpus(row, sub) for row in sums])


@pytest.mark.parametrize(
    ("held", "fragments", "sub"),
    [
        ([[0, 0, 0, 0]], 1, 4),  # nothing held
        ([[1, 2, 3, 4, 5, 6]], 1, 3),  # a third: 2/3 is no exact double
        ([[1, 1, 1, 2, 2, 2, 2]], 3, 7),  # 7 samples, shared GPUs
        ([[7, 0, 7, 0, 7, 0, 7, 0, 7, 0]], 2, 10),
        ([[5] * 20, [3] * 19 + [40]], 4, 20),  # a week's 10 s slot of 500 ms samples
        ([[9, 3, 1]], 1, 1),  # 500 ms slots: one sample
        ([[2**20] * 20], 1, 20),  # large counts: still whole numbers in int32
    ],
)
def test_gpus_summed_over_a_slot_give_the_mean_of_its_samples_to_the_bit(
    held: list[list[int]], fragments: int, sub: int
) -> None:
    h = np.asarray(held, dtype=np.float64)
    old, new = _old_gpus(h, fragments, sub), _new_gpus(h, fragments, sub)
    assert new.dtype == np.float64
    assert np.array_equal(old, new) and old.tobytes() == new.tobytes()


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(1, 8),
    st.lists(st.integers(0, 5000), min_size=1, max_size=240),
)
def test_gpus_summed_equal_the_mean_on_any_counts(sub: int, fragments: int, xs: list[int]) -> None:
    held = np.asarray(xs * sub, dtype=np.float64).reshape(1, -1)
    assert _old_gpus(held, fragments, sub).tobytes() == _new_gpus(held, fragments, sub).tobytes()


def test_slots_not_simulated_read_as_nan() -> None:
    got = held_gpus(np.array([20, 7, -1, -1], dtype=np.int32), 20)
    assert got[:2].tolist() == [1.0, 0.35] and np.isnan(got[2:]).all()


def _mixed() -> list[Prepared]:
    return [_replay(source, _config(**bounds)) for source, bounds in MIXED[:3]]


def test_each_run_reads_its_own_workloads_rate_or_forecast_as_the_table_of_runs_did() -> None:
    replays = _mixed()
    templates = _templates(replays)
    runs = [(kind, 60.0) for kind in BASELINES.values()] * len(replays)
    rows = [t for t in templates for _ in BASELINES]
    sweep = Sweep(replays[0].config, templates[0], runs, replays[0].seed, rows)
    sweep.run(replays[0].start, 600.0)  # computes the signals of every tick
    assert sweep.signal is not None
    rates, forecasts = np.split(sweep.signal.T, 2)  # (workloads, ticks) each
    old = np.where(sweep.uses_rate, rates[sweep.member].T, forecasts[sweep.member].T)
    for k in range(len(sweep.signal)):
        assert np.array_equal(sweep.signal[k][sweep.signal_of], old[k])
    assert sweep.signal.shape[1] == 2 * len(replays) < len(runs)  # a workload's, not a run's
    assert len({r.tobytes() for r in rates}) == len(replays)  # the workloads' rates differ


def test_templates_of_one_seed_hold_their_random_streams_once() -> None:
    replays = _mixed()
    first, *rest = _templates(replays)
    for t in rest:
        assert all(getattr(t, a) is getattr(first, a) for a in SHARED)
    alone = _template(replays[1])  # what it draws alone: the same values
    for a in SHARED:
        assert np.array_equal(getattr(alone, a), getattr(rest[0], a))


def test_a_template_of_another_seed_keeps_its_own_streams() -> None:
    a, b = _mixed()[:2]
    other = dataclasses.replace(b, seed=b.seed + 1)
    first, second = _templates([a, other])
    assert not np.array_equal(first.noise, second.noise)
    assert second.noise is not first.noise


def test_a_group_holds_as_many_runs_as_the_budget_buys_at_ten_bytes_a_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = _mixed()[0]
    template = _template(p)
    built: list[int] = []

    class Counted(Sweep):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            built.append(len(self.kinds))
            assert self.gpu_sums.dtype == np.int16 and self.served.dtype == np.float64

    monkeypatch.setattr(sweep_groups, "Sweep", Counted)
    runs: list[tuple[ScalerKind, float]] = [("hpa_util", float(t)) for t in range(40, 95, 5)]
    budget = RUN_SLOT_BYTES * len(p.arrivals) * 4
    assert RUN_SLOT_BYTES == 10
    list(sweep_parts(p.config, template, runs, p.seed, 600.0, budget=budget))
    assert built == [4, 4, 3]


def test_a_sweep_sums_its_gpus_in_int32_once_a_run_may_hold_more_than_int16_sums_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = _mixed()[0]
    runs: list[tuple[ScalerKind, float]] = [(kind, 50.0) for kind in BASELINES.values()]
    narrow = Sweep(p.config, _template(p), runs, p.seed)
    before = narrow.run(p.start, p.seconds)
    assert narrow.gpu_sums.dtype == np.int16
    # int16 "holds" the sums of 8 pods a run at most: the table (8 wide) widens past it
    monkeypatch.setattr(sweep_module, "SUMS_MOST", narrow.sub * 4)
    wide = Sweep(p.config, _template(p), runs, p.seed)
    assert wide.gpu_sums.dtype == np.int16 and wide.pods.created.shape[1] == 8
    after = wide.run(p.start, p.seconds)
    assert wide.gpu_sums.dtype == np.int32 and wide.pods.created.shape[1] > 8
    for a, b in zip(before, after, strict=True):
        assert np.array_equal(a.gpu_sums, b.gpu_sums) and a.gpus.tobytes() == b.gpus.tobytes()
        assert a.served.tobytes() == b.served.tobytes()


def test_a_kept_runs_records_are_rows_of_the_kept_tables_not_copies() -> None:
    p = _mixed()[0]
    template = _template(p)
    runs: list[tuple[ScalerKind, float]] = [
        ("hpa_util", 50.0),
        ("hpa_util", 70.0),
        ("keda_rate", 60.0),
    ]
    sweep = Sweep(p.config, template, runs, p.seed, record=[0, 2])
    results = sweep.run(p.start, 1800.0)
    for j, i in enumerate((0, 2)):
        rec = results[i].recorder
        assert rec is not None
        for name in sweep_module.KEPT:
            assert np.shares_memory(getattr(rec, name), sweep.kept[name])
            assert np.array_equal(getattr(rec, name), sweep.kept[name][j], equal_nan=True)
        assert not np.shares_memory(rec.served, sweep.served)  # its own: not the whole table
    assert results[1].recorder is None


@pytest.mark.parametrize(
    ("runs", "most", "want"),
    [
        (1400, 200, [200] * 7),  # 40 replays of 35 runs: 7 even groups
        (1400, 231, [200] * 7),  # 7 groups either way: even, not 6 x 231 and 14
        (175, 126, [88, 87]),
        (10, 3, [3, 3, 3, 1]),  # 4 groups at least: the last one smaller
        (5, 100, [5]),  # all at once
        (7, 1, [1] * 7),
        (1, 0, [1]),  # a budget below one run: one run a group
    ],
)
def test_a_sweep_runs_in_the_fewest_groups_its_budget_allows_of_even_sizes(
    runs: int, most: int, want: list[int]
) -> None:
    slots = 1000
    size = group_size(runs, slots, most * RUN_SLOT_BYTES * slots)
    got = [min(size, runs - i) for i in range(0, runs, size)]
    assert got == want
