"""How much of issue 20's gate is arithmetic: the share of whatif's CPU spent inside
numpy's (and libc's, libm's, BLAS's) inner loops, sampled by Linux `perf`, as a floor
under any re-layout of the same computation.

bench/whatif_floor.py showed that no cut of the lanes' own work alone meets the gate; the
notes after it proposed holding the controller's state as arrays across targets, so that
a tick costs its arithmetic and little else. This measures what that would leave: with
every interpreter and numpy-dispatch cost gone, the same forecasts, plans and sweeps
still do these floating-point operations, sorts and copies.

Measured here, with `perf record` started disabled and switched on only around the part
timed (`--control` fifos: the workloads' preparation and the imports are not sampled):
- `lockstep_runs` of bench/lockstep.py's workloads for `--hours` at `--small` and
  `--lanes` lanes (as bench/whatif_floor.py): CPU seconds and the share of samples in
  inner loops, so the arithmetic a lane-tick (the slope) and a tick (the intercept);
- `around.around_many` of `--lanes` workloads over `--sweep-hours`, grouped as whatif
  groups it (`replay.freed`), scaled to a week: the sweep's arithmetic a workload-week.

A sample counts as arithmetic when its symbol is one of numpy's typed loops (`DOUBLE_add`,
`DOUBLE_isfinite`, `sort_n_vec`, einsum's `sum_of_products`, ...), libm, BLAS/LAPACK or
pocketfft; as a copy (`copy_share`, not in the floor: a layout could avoid many) when it
is numpy's copy, cast or gather loops or libc's `memmove`, `memset`, `memcpy`; everything
else (libpython, numpy's argument parsing, type resolution, allocation and deallocation,
malloc, the kernel) is overhead that a layout holding state as arrays could remove.

Last line: RESULT numeric_share= (of the lockstep at `--lanes`) copy_share=
numeric_lane_ms_per_tick= numeric_fixed_ms_per_tick= sweep_numeric_share=
sweep_numeric_s_per_workload_week= numeric_floor_s= (100 workload-weeks on `--cores`
cores, arithmetic alone) with_copies_floor_s= (arithmetic and copies) gate_s=120
numeric_floor_over_gate=

Needs `perf` and perf_event_paranoid <= 2 (exit 2 naming which is missing). About 3 min.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lockstep import prepared
from whatif_floor import GATE_S, a_workload_week, gate_seconds, line, options, sweep_around

from gpuscaler.sim.lockstep import lockstep_runs

FREQUENCY = 999
"""Samples a second of CPU."""

INNER_LOOP = re.compile(
    r"^(DOUBLE|FLOAT|HALF|LONG|ULONG|LONGLONG|ULONGLONG|INT|UINT|SHORT|USHORT|BYTE|UBYTE|BOOL)_"
    r"|sort|partition|binsearch|sum_of_products|aradixsort|pocketfft|execute_real|^npyv_|simd_"
)
"""numpy's arithmetic loops: the typed ufunc loops, sorts and searches, einsum's products,
the FFT (see numpy/_core/src/umath/loops*.c.src, npysort/*.cpp,
multiarray/einsum_sumprod.c.src)."""
MOVES = re.compile(
    r"_to_contig|_to_strided|_contig_to|_strided_to|raw_array_assign|mapiter_get|mapiter_set"
    r"|_take|PyArray_Where|copy_and_swap"
)
"""numpy's data movement: the copy, cast and gather loops (lowlevel_strided_loops.c.src,
mapping.c, item_selection.c): a layout could avoid many of them, so not in the floor."""
DISPATCH = re.compile(r"^Py|^_Py|ufunc_generic|promote|Descr|dealloc|Identity|Selector|prepare")
"""numpy's calling machinery that a symbol above could also match."""
COPIES = re.compile(r"memmove|memset|memcpy")
SAMPLE_LINE = re.compile(r"\s+([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)")
"""A line of `perf report --sort dso,sym`: its share, the object, `.` (user) or `k`
(kernel), the symbol."""


def kind(dso: str, sym: str, space: str) -> str:
    """What a sample was spent on: arithmetic, copy (libc's) or overhead."""
    if space == "k" or "libpython" in dso:
        return "overhead"
    if COPIES.search(sym) and "libc" in dso:
        return "copy"
    if ("numpy" in dso or "_multiarray" in dso) and MOVES.search(sym):
        return "copy"
    if "libm" in dso or "openblas" in dso or "lapack" in dso or "gfortran" in dso:
        return "arithmetic"
    if ("numpy" in dso or "_multiarray" in dso or "_pocketfft" in dso) and (
        INNER_LOOP.search(sym) and not DISPATCH.search(sym)
    ):
        return "arithmetic"
    return "overhead"


def tally(report: str) -> dict[str, float]:
    """The share of each kind (arithmetic, copy, overhead) in the text of `perf report
    --no-children --sort dso,sym --stdio` (its lines `  12.25%  dso  [.] symbol`; every
    other line, a header or a call chain, is skipped); all overhead when none is read."""
    found = {"arithmetic": 0.0, "copy": 0.0, "overhead": 0.0}
    for text in report.splitlines():
        m = SAMPLE_LINE.match(text)
        if m:
            found[kind(m[2], m[4].strip(), m[3])] += float(m[1])
    total = sum(found.values())
    if total <= 0:
        return {"arithmetic": 0.0, "copy": 0.0, "overhead": 1.0}
    return {k: v / total for k, v in found.items()}


def shares(data: Path) -> dict[str, float]:
    """`tally` of the samples in `data` (a `perf record` file)."""
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,sym", "--stdio"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    return tally(out)


def child(part: str, lanes: int, hours: float, ctl: str, ack: str) -> None:
    """Prepare, switch perf on, run `part`, switch it off; print the run's CPU seconds."""
    preps = prepared(hours, lanes)
    with open(ctl, "w") as c, open(ack) as a:

        def say(what: str) -> None:
            c.write(what + "\n")
            c.flush()
            a.readline()

        say("enable")
        t0 = time.process_time()
        if part == "lockstep":
            lockstep_runs(preps)
        else:
            sweep_around(preps)
        cpu = time.process_time() - t0
        say("disable")
    print(f"CPU {cpu}")


def measured(part: str, lanes: int, hours: float) -> tuple[float, dict[str, float]]:
    """CPU seconds of `part` (`lockstep` or `sweep`) and its samples' shares."""
    with tempfile.TemporaryDirectory() as tmp:
        ctl, ack, data = Path(tmp, "ctl"), Path(tmp, "ack"), Path(tmp, "perf.data")
        os.mkfifo(ctl)
        os.mkfifo(ack)
        me = [sys.executable, __file__, "--child", part, str(lanes), str(hours), str(ctl), str(ack)]
        record = ["perf", "record", "-q", "-F", str(FREQUENCY), "-D", "-1", "-o", str(data)]
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
        done = subprocess.run(
            [*record, f"--control=fifo:{ctl},{ack}", "--", *me],
            capture_output=True,
            text=True,
            timeout=3600,
            env=env,
        )
        if done.returncode != 0:
            raise SystemExit(f"perf record of {part} failed: {done.stderr.strip()[-400:]}")
        cpu = float(done.stdout.split("CPU ")[-1].split()[0])
        return cpu, shares(data)


def _of(part: dict[str, float], kinds: tuple[str, ...]) -> float:
    return sum(part[k] for k in kinds)


def usable() -> str | None:
    """Why perf cannot sample here (None: it can)."""
    if shutil.which("perf") is None:
        return "perf is not installed (Debian: linux-perf)"
    level = Path("/proc/sys/kernel/perf_event_paranoid")
    if level.exists() and int(level.read_text()) > 2:
        return f"kernel.perf_event_paranoid is {level.read_text().strip()}, above 2"
    return None


def main() -> None:
    ap = options(__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        part, lanes, hours, ctl, ack = args.child
        child(part, int(lanes), float(hours), ctl, ack)
        return
    why = usable()
    if why:
        print(f"whatif_numeric: cannot sample: {why}", file=sys.stderr)
        raise SystemExit(2)
    small_cpu, small = measured("lockstep", args.small, args.hours)
    big_cpu, big = measured("lockstep", args.lanes, args.hours)
    sweep_cpu, sweep = measured("sweep", args.lanes, args.sweep_hours)

    def floor(kinds: tuple[str, ...]) -> tuple[float, float, float, float]:
        """The floor of the samples of `kinds`: (seconds on `--cores` cores, a lane-tick's
        and a tick's CPU seconds, a workload-week's sweep's)."""
        fixed, lane = line(small_cpu * _of(small, kinds), big_cpu * _of(big, kinds), args)
        swept = a_workload_week(sweep_cpu * _of(sweep, kinds), args)
        return gate_seconds(max(0.0, fixed), lane, swept, args), lane, max(0.0, fixed), swept

    numeric, lane, fixed, sweep_week = floor(("arithmetic",))
    with_copies = floor(("arithmetic", "copy"))[0]
    print(
        f"lockstep {args.small} lanes: {small_cpu:.2f} CPU-s, arithmetic {small['arithmetic']:.3f}"
        f" copy {small['copy']:.3f}; {args.lanes} lanes: {big_cpu:.2f} CPU-s, arithmetic"
        f" {big['arithmetic']:.3f} copy {big['copy']:.3f}; sweep of {args.lanes} over"
        f" {args.sweep_hours:g} h: {sweep_cpu:.2f} CPU-s, arithmetic {sweep['arithmetic']:.3f}"
        f" copy {sweep['copy']:.3f}"
    )
    print(
        f"RESULT numeric_share={big['arithmetic']:.3f} copy_share={big['copy']:.3f}"
        f" numeric_lane_ms_per_tick={lane * 1000:.4f} numeric_fixed_ms_per_tick={fixed * 1000:.3f}"
        f" sweep_numeric_share={sweep['arithmetic']:.3f}"
        f" sweep_numeric_s_per_workload_week={sweep_week:.3f} numeric_floor_s={numeric:.0f}"
        f" with_copies_floor_s={with_copies:.0f} gate_s={GATE_S:.0f}"
        f" numeric_floor_over_gate={numeric / GATE_S:.2f}"
    )


if __name__ == "__main__":
    main()
