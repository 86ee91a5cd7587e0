"""The floors' skill over rows (`skill._assess_rows`, and its level floor's bisection)
on steady ticks of a lockstep run, a base revision against this tree.

The lockstep of bench/lockstep.py's workloads runs `--hours` on this tree at each of
`--sizes` lanes, keeping the arguments of the skill's assessment over rows of its last
`--ticks` ticks (every tick's rows: the ticks are alike once the records are full). Then
child processes time `_assess_rows` and the bisection alone on them (CPU, best and median
of `--repeat` passes), with the base revision unpacked first on PYTHONPATH and with this
tree, alternated `--rounds` times; each child prints a digest of the skills and the
bisection's c, which must agree. The children keep freed memory (glibc's
MALLOC_TRIM_THRESHOLD_ and MALLOC_MMAP_THRESHOLD_ raised; `--fresh-pages` leaves them):
passes of the same call would otherwise map and fault fresh pages for their large
temporaries at every pass, which a whole run's heap mostly reuses (a 19-lane lockstep of
3 h: 12,600 page faults in 8.3 CPU-s). Last line: `RESULT lanes=... assess_ms_N=...
assess_ms_N_base=... bisect_ms_N=... bisect_ms_N_base=... same=1`, per tick.

    python bench/skill.py --sizes 19,100 --hours 3 --base ed31a8e --rounds 3
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from revision import ROOT, unpack

KEEP_MEMORY = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")

Args = tuple[Any, float, float, float, int, float]


def capture(lanes: int, hours: float, ticks: int) -> list[Args]:
    """The arguments of `_assess_rows` at the last `ticks` ticks of a lockstep run."""
    from lockstep import prepared

    from gpuscaler.core import skill
    from gpuscaler.sim.lockstep import lockstep_runs

    kept: list[Args] = []
    inner = skill._assess_rows

    def spy(*args: Any) -> Any:
        kept.append((args[0].copy(), *args[1:]))
        del kept[:-ticks]
        return inner(*args)

    skill._assess_rows = spy  # type: ignore[assignment]
    try:
        preps = prepared(hours, lanes)
        lockstep_runs(preps)
    finally:
        skill._assess_rows = inner
    return kept


def bisection_inputs(args: Args) -> tuple[Any, Any, Any] | None:
    """The level floor's (reactive, base, extra) of one call: `_assess_rows`' steps up
    to its bisection (the same in the base and this tree)."""
    import numpy as np

    from gpuscaler.core import pairwise, skill

    means: Any = getattr(pairwise, "window_means_rows", None)  # else the base's
    means = means or getattr(skill, "_window_means_rows")  # noqa: B009 (the base's)
    recs, now, lead, stab, min_origins, span = args
    t = recs[0][:, 0]
    scored = np.flatnonzero((t + lead <= now) & (t > now - span) & np.isfinite(recs[0][:, 2]))
    order = np.argsort(t, kind="stable")
    ts, o = t[order], t[scored]
    after = (np.searchsorted(ts, o, "right"), np.searchsorted(ts, o + lead, "right"))
    ok = after[1] > after[0]
    if int(ok.sum()) < min_origins:
        return None
    scored, o = scored[ok], o[ok]
    start = np.searchsorted(ts, o - stab, "left")
    v = np.ascontiguousarray(recs[:, :, 1])
    reactive = skill.window_max_rows(v[:, order], start, after[0][ok])
    level = means(v, order, start, after[0][ok])
    upper, mean = recs[:, scored, 2], recs[:, scored, 3]
    extra = (np.maximum(reactive, upper) - reactive).sum(axis=1)
    return reactive, level + (upper - mean), extra


def child(path: str, repeat: int) -> None:
    """Time this interpreter's gpuscaler on the pickled arguments; print a RESULT line."""
    from gpuscaler.core import skill

    bisect: Any = getattr(skill, "_bisect_rows", None)  # the base's
    if bisect is None:
        from gpuscaler.core.at_cost import bisect_rows as bisect
    calls: list[Args] = pickle.loads(Path(path).read_bytes())
    inputs = [x for x in map(bisection_inputs, calls) if x is not None]
    digest = hashlib.sha256()
    for args in calls:
        digest.update(repr(skill._assess_rows(*args)).encode())
    for reactive, base, extra in inputs:
        digest.update(bisect(reactive, base, extra).tobytes())
    found = {}
    for name, run in (
        ("assess", lambda: [skill._assess_rows(*args) for args in calls]),
        ("bisect", lambda: [bisect(*x) for x in inputs]),
    ):
        times = []
        for _ in range(repeat):
            t0 = time.process_time()
            run()
            times.append((time.process_time() - t0) / len(calls) * 1e3)
        found[f"{name}_min"], found[f"{name}_med"] = min(times), statistics.median(times)
    fields = " ".join(f"{k}={v:.4f}" for k, v in found.items())
    print(f"RESULT {fields} digest={int(digest.hexdigest()[:12], 16)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="19,100", help="lanes in lockstep")
    ap.add_argument("--hours", type=float, default=3.0)
    ap.add_argument("--ticks", type=int, default=5, help="steady ticks kept")
    ap.add_argument("--repeat", type=int, default=20, help="timed passes a child")
    ap.add_argument("--base", default="ed31a8e", help="the revision timed against the tree")
    ap.add_argument("--rounds", type=int, default=3, help="base/tree alternations")
    ap.add_argument("--fresh-pages", action="store_true", help="leave glibc's trimming on")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.repeat)
        return
    out, same = [f"hours={args.hours:g}"], True
    keep = {} if args.fresh_pages else dict.fromkeys(KEEP_MEMORY, str(2**28))
    with tempfile.TemporaryDirectory() as tmp:
        unpack(args.base, tmp)
        for lanes in (int(s) for s in args.sizes.split(",")):
            pkl = Path(tmp) / f"calls{lanes}.pkl"
            pkl.write_bytes(pickle.dumps(capture(lanes, args.hours, args.ticks)))
            runs: dict[str, list[dict[str, float]]] = {"base": [], "": []}
            for r in range(args.rounds):
                for which, path in (("base", tmp), ("", str(ROOT))):
                    cmd = [
                        sys.executable,
                        __file__,
                        "--child",
                        str(pkl),
                        "--repeat",
                        str(args.repeat),
                    ]
                    env = {**os.environ, "PYTHONPATH": path, **keep}
                    line = (
                        subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
                        .stdout.strip()
                        .splitlines()[-1]
                    )
                    print(f"lanes {lanes} round {r} {which or 'tree'}: {line}", file=sys.stderr)
                    fields = dict(x.split("=") for x in line.removeprefix("RESULT ").split())
                    runs[which].append({k: float(v) for k, v in fields.items()})
            same &= len({x["digest"] for x in runs["base"] + runs[""]}) == 1
            for key in ("assess_min", "assess_med", "bisect_min", "bisect_med"):
                for which, suffix in (("", ""), ("base", "_base")):
                    value = min(x[key] for x in runs[which])
                    out.append(f"{key.replace('_', '_ms_')}_{lanes}{suffix}={value:.3f}")
    print("RESULT " + " ".join(out) + f" same={int(same)}")
    if not same:
        sys.exit("the base and this tree disagree on the skills or the bisection's c")


if __name__ == "__main__":
    main()
