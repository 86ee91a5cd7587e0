"""bench/whatif_given.py's recording of the forecaster (issue 20): a lockstep given its own
recorded forecasts decides as it did, and its check sees a recording that is not its own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
from lockstep import prepared
from whatif_given import Recording, digest

from gpuscaler.core import snapshot
from gpuscaler.sim.lockstep import lockstep_runs

HOURS, LANES = 1.0, 2


def _recorded(monkeypatch: pytest.MonkeyPatch) -> tuple[Recording, str]:
    tape = Recording()
    with monkeypatch.context() as m:
        m.setattr(snapshot, "_forecasts", tape.wrap(snapshot._forecasts, 5))
        m.setattr(snapshot, "_lead", tape.wrap(snapshot._lead, 4))
        runs = lockstep_runs(prepared(HOURS, LANES))
    assert sum(len(r.decisions) for r in runs) > 0
    return tape, digest(runs)


def _given(monkeypatch: pytest.MonkeyPatch, tape: Recording) -> str:
    with monkeypatch.context() as m:
        m.setattr(snapshot, "_forecasts", tape.given(5))
        m.setattr(snapshot, "_lead", tape.given(4))
        runs = lockstep_runs(prepared(HOURS, LANES))
    assert tape.at == len(tape.calls)
    return digest(runs)


def test_a_lockstep_given_its_own_forecasts_decides_as_it_did(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tape, want = _recorded(monkeypatch)
    assert len(tape.calls) > 0
    assert _given(monkeypatch, Recording(tape.calls)) == want


def test_a_lockstep_given_other_forecasts_is_seen_to_decide_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tape, want = _recorded(monkeypatch)
    # every call given the answer its function gave 30 calls later (the last ones their own)
    late = []
    for name in ("_forecasts", "_lead"):
        mine = [i for i, call in enumerate(tape.calls) if call[0] == name]
        assert len(mine) > 30
        late += [(i, tape.calls[mine[min(j + 30, len(mine) - 1)]]) for j, i in enumerate(mine)]
    shifted = [call for _, call in sorted(late, key=lambda pair: pair[0])]
    assert _given(monkeypatch, Recording(shifted)) != want
