"""What issue 20's gate would cost with the forecasts given: the lockstep with every
forecast of every tick taken from a recording of the same run, so that the plan, the
observation, the tick around them and the lanes' clusters are all it does, with the
decisions bit for bit the same (checked).

bench/whatif_numeric.py showed that the arithmetic alone takes about the gate, most of it
the forecast's; the way out it names is a forecaster whose work a tick does not grow with
its window (bench/forecast_recursive.py's study: 3.7x cheaper a series-tick). This
measures what would be left if the forecast cost nothing at all: the rest of the replay
as it is. Above the gate, the plan (and the rest of the tick) must change too.

Each lockstep runs twice in child processes (no cache of one run's objects reaches the
other): first as whatif runs it, recording what `gpuscaler.core.snapshot._forecasts` and
`_lead` (the forecaster's two entries in a tick: every series' forecast, then each
workload's demand-led load) return and the fit states they keep, to a pickle; then with
both replaced by the recording, timed (CPU seconds, the recording's load left out). The
second run's decisions and figures are compared with the first's: a difference fails the
run. At `--small` and `--lanes` lanes, the line through them (as bench/whatif_floor.py),
plus the sweep around `--lanes` lanes (which forecasts nothing of gpuscaler's).

Last line: RESULT given_fixed_ms_per_tick= given_lane_ms_per_tick= full_lane_ms_per_tick=
(the same runs forecasting) forecast_share= (of the lane's cost) sweep_s_per_workload_week=
given_s= (100 workload-weeks on `--cores` cores with the forecasts free) gate_s=120
given_over_gate=

About 4 min.
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lockstep import prepared
from whatif_floor import GATE_S, a_workload_week, gate_seconds, line, options, sweep_cpu

from gpuscaler.core import snapshot
from gpuscaler.sim.lockstep import lockstep_runs

TIMEOUT_S = 3600.0


class Recording:
    """The forecaster's answers of one run, in call order, each with the name of the
    function that gave it and the fit states the call added to the tick's `states`
    (recorded), or handed back in that order (replayed)."""

    def __init__(self, calls: list[tuple[str, Any, dict[str, Any]]] | None = None):
        self.calls = calls if calls is not None else []
        self.at = 0

    def wrap(self, original: Callable[..., Any], states_at: int) -> Callable[..., Any]:
        """`original` recorded; its `states_at`th argument is the tick's states."""

        def recorded(*args: Any) -> Any:
            states: dict[str, Any] = args[states_at]
            before = dict(states)
            out = original(*args)
            added = {k: v for k, v in states.items() if before.get(k) is not v}
            self.calls.append((original.__name__, out, added))
            return out

        return recorded

    def given(self, states_at: int) -> Callable[..., Any]:
        """The recorded answers in turn, their states added."""

        def replayed(*args: Any) -> Any:
            _, out, added = self.calls[self.at]
            self.at += 1
            args[states_at].update(added)
            return out

        return replayed


def digest(runs: list[Any]) -> str:
    """The lanes' decisions and figures, hashed: equal runs, equal digests."""
    h = hashlib.sha256()
    for run in runs:
        h.update(repr([(type(d).__name__, d.target, repr(d)) for d in run.decisions]).encode())
        for name in ("served", "gpus", "replicas"):
            h.update(getattr(run.cluster.rec, name).tobytes())
    return h.hexdigest()


def child(mode: str, lanes: int, hours: float, path: str) -> None:
    """Run one lockstep (`record` or `given`) and print its CPU seconds and digest."""
    preps = prepared(hours, lanes)
    if mode == "record":
        tape = Recording()
        snapshot._forecasts = tape.wrap(snapshot._forecasts, 5)
        snapshot._lead = tape.wrap(snapshot._lead, 4)
    else:
        tape = Recording(pickle.loads(Path(path).read_bytes()))
        snapshot._forecasts = tape.given(5)
        snapshot._lead = tape.given(4)
    t0 = time.process_time()
    runs = lockstep_runs(preps)
    cpu = time.process_time() - t0
    if mode == "record":
        Path(path).write_bytes(pickle.dumps(tape.calls, protocol=pickle.HIGHEST_PROTOCOL))
    elif tape.at != len(tape.calls):
        raise SystemExit(f"the replay read {tape.at} of {len(tape.calls)} recorded answers")
    count = sum(len(run.decisions) for run in runs)
    print(f"CPU {cpu} DIGEST {digest(runs)} DECISIONS {count} ANSWERS {len(tape.calls)}")


def run_child(mode: str, lanes: int, hours: float, path: Path) -> tuple[float, str]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(lanes), str(hours), str(path)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    if done.returncode != 0:
        raise SystemExit(f"the {mode} run at {lanes} lanes failed: {done.stderr.strip()[-600:]}")
    words = done.stdout.split()
    if int(words[words.index("DECISIONS") + 1]) == 0:
        raise SystemExit(f"the {mode} run at {lanes} lanes decided nothing: nothing to compare")
    return float(words[words.index("CPU") + 1]), words[words.index("DIGEST") + 1]


def both(lanes: int, hours: float) -> tuple[float, float]:
    """CPU seconds of a lockstep of `lanes` workloads over `hours` as whatif runs it and
    with its forecasts given (the same decisions and figures, or the run fails)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "forecasts.pickle")
        full, want = run_child("record", lanes, hours, path)
        given, got = run_child("given", lanes, hours, path)
    if got != want:
        raise SystemExit(f"at {lanes} lanes the run with its forecasts given decided otherwise")
    return full, given


def main() -> None:
    ap = options(__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        mode, lanes, hours, path = args.child
        child(mode, int(lanes), float(hours), path)
        return
    (small_full, small_given), (big_full, big_given) = (
        both(n, args.hours) for n in (args.small, args.lanes)
    )
    fixed, lane = line(small_given, big_given, args)
    full_lane = line(small_full, big_full, args)[1]
    sweep = a_workload_week(sweep_cpu(args.lanes, args.sweep_hours), args)
    given = gate_seconds(max(0.0, fixed), lane, sweep, args)
    print(
        f"lockstep over {args.hours:g} h: {args.small} lanes {small_full:.1f} CPU-s, given"
        f" {small_given:.1f}; {args.lanes} lanes {big_full:.1f}, given {big_given:.1f}"
        " (the same decisions and figures)"
    )
    print(
        f"RESULT given_fixed_ms_per_tick={fixed * 1e3:.2f} given_lane_ms_per_tick={lane * 1e3:.3f}"
        f" full_lane_ms_per_tick={full_lane * 1e3:.3f} forecast_share={1 - lane / full_lane:.2f}"
        f" sweep_s_per_workload_week={sweep:.2f} given_s={given:.0f} gate_s={GATE_S:g}"
        f" given_over_gate={given / GATE_S:.2f}"
    )


if __name__ == "__main__":
    main()
