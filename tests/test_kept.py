"""A finished run released (`simulate.release`: its figures and the PNG's series kept,
its record let go) reports what the whole run reports: the same summary and the same PNG,
to the byte, and holds no per-slot array any more."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_sweep_many import _config, _replay

from gpuscaler.sim.around import around_many
from gpuscaler.sim.cluster import RECORDED
from gpuscaler.sim.report import plot
from gpuscaler.sim.simulate import (
    Prepared,
    RunResult,
    SimulationResult,
    finish,
    gpuscaler_run,
    reactive_run,
    release,
)


@pytest.fixture(scope="module")
def whole() -> tuple[Prepared, SimulationResult]:
    p = _replay("bundled", _config(slot=2.0, fragments=4))
    return p, finish(p, gpuscaler_run(p), True, reactive_run(p))


def _released(p: Prepared, r: SimulationResult, draw: bool) -> SimulationResult:
    g = gpuscaler_run(p)  # fresh runs: release lets go of the cluster's record
    return finish(p, release(p, g, draw), True, release(p, reactive_run(p), draw), r.baselines)


def test_a_released_run_gives_the_same_summary_and_png(
    whole: tuple[Prepared, SimulationResult], tmp_path: Path
) -> None:
    """The PNG of the whole runs drawn from their whole record."""
    p, r = whole
    got = _released(p, r, True)
    assert json.dumps(got.summary()) == json.dumps(r.summary())
    plot(got, tmp_path / "released.png")
    plot(r, tmp_path / "whole.png")
    assert (tmp_path / "whole.png").read_bytes() == (tmp_path / "released.png").read_bytes()
    kept = got.gpuscaler.kept
    assert kept is not None and kept.plotted is not None
    assert kept.plotted.band is not None and kept.plotted.late.size > 0  # drawn, not empty


def test_a_run_released_without_its_plot_reports_its_figures_but_draws_nothing(
    whole: tuple[Prepared, SimulationResult], tmp_path: Path
) -> None:
    p, r = whole
    got = _released(p, r, False)
    assert got.summary() == r.summary()
    with pytest.raises(ValueError, match="released without its plot"):
        plot(got, tmp_path / "x.png")


def _bytes(run: RunResult) -> int:
    c = run.cluster
    arrays = [getattr(c.rec, n) for n in RECORDED] + [c.work, c.noise, c.stall_noise, c.dropped]
    return int(sum(a.nbytes for a in arrays)) + 8 * len(run.track.origin)


def test_a_released_run_holds_no_per_slot_array(whole: tuple[Prepared, SimulationResult]) -> None:
    p, _ = whole
    run = gpuscaler_run(p)
    before = _bytes(run)
    assert before > 12 * 8 * len(p.arrivals)  # the record: a dozen values a slot
    assert _bytes(release(p, run, True)) == 0
    assert run.cluster.arrivals is p.arrivals  # the replay's own arrivals stay


def test_the_runs_around_released_report_what_they_report_whole() -> None:
    replays = [_replay(s, _config()) for s in ("bundled", "bursts")]
    runs = [gpuscaler_run(p) for p in replays]
    whole = around_many(replays, baselines=False)
    for draw in (True, False):
        got = around_many(replays, baselines=False, released=draw)
        for p, g, a, b in zip(replays, runs, whole, got, strict=True):
            assert a.reactive is not None and b.reactive is not None
            assert b.reactive.kept is not None and (b.reactive.kept.plotted is None) is not draw
            assert b.reactive.cluster.rec.served.size == 0
            want = finish(p, g, False, a.reactive).summary()["reactive"]
            assert finish(p, g, False, b.reactive).summary()["reactive"] == want
    assert np.isfinite(want["gpu_hours"])
