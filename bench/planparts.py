"""The planner's per-lane parts on a steady tick of a lockstep (issue 20): the skills,
reserves and remembered rows (`plan._skills`, `_reserves`, `_remembered`), the pools'
fragments and time slice deciders, and the whole plan, a base revision against this
tree on the same arguments.

A lockstep of N of bench/lockstep.py's workloads (10 s slots, from day 4 at noon) runs
`--hours` on this tree, and its last tick's `make_plan` arguments are kept (the records
full after ~2 h). Child processes then time `core.plan.plan` on them `--repeat` times
(CPU, each part by a wrapper: its minimum and median), with the base revision unpacked
first on PYTHONPATH and with this tree, alternated `--rounds` times; each child prints a
digest of the plan (its decisions, skips and histories), which must agree; the figures
are the medians of the rounds. The children
keep freed memory (glibc's MALLOC_TRIM_THRESHOLD_ and MALLOC_MMAP_THRESHOLD_ raised, as
bench/skill.py's: repeated calls would otherwise fault fresh pages for every large
temporary, which a whole run's heap mostly reuses). Last line:
`RESULT lanes=... plan_ms_min_N=... plan_ms_min_N_base=... skills_ms_min_N=... same=1`.

    python bench/planparts.py --sizes 10,40 --hours 6 --base 3ecdbd8 --rounds 2
"""

from __future__ import annotations

import argparse
import copyreg
import hashlib
import os
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from revision import alternated, medians

KEEP_MEMORY = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")
PARTS = ("_skills", "_reserves", "_remembered", "decide_fragments", "decide_time_slice")


def _proxy(items: dict[str, Any]) -> MappingProxyType[str, Any]:
    return MappingProxyType(items)


def capture(lanes: int, hours: float) -> bytes:
    """The pickled `make_plan` arguments of the last tick of a lockstep run."""
    from lockstep import prepared

    import gpuscaler.controller as controller
    from gpuscaler.sim.lockstep import lockstep_runs

    last: list[tuple[Any, ...]] = []
    inner = getattr(controller, "make_plan")  # noqa: B009 (not exported)

    def spy(*args: Any) -> Any:
        last[:] = [args]
        return inner(*args)

    setattr(controller, "make_plan", spy)  # noqa: B010 (not exported)
    try:
        preps = prepared(hours, lanes)
        lockstep_runs(preps)
    finally:
        setattr(controller, "make_plan", inner)  # noqa: B010
    snapshot, cfg, history, now = last[0]
    copyreg.pickle(MappingProxyType, lambda m: (_proxy, (dict(m),)))
    return pickle.dumps((snapshot, cfg, dict(history.targets), now))


def child(path: str, repeat: int) -> None:
    """Time this interpreter's plan and its parts on the pickled arguments."""
    import gpuscaler.core.plan as plan_module
    from gpuscaler.core import model

    setattr_ = model.IssuedInterval.__setattr__
    model.IssuedInterval.__setattr__ = object.__setattr__  # type: ignore[method-assign,assignment]
    try:
        snapshot, cfg, targets, now = pickle.loads(Path(path).read_bytes())
    finally:
        model.IssuedInterval.__setattr__ = setattr_  # type: ignore[method-assign]
    history = model.History(targets=MappingProxyType(targets))
    spent: dict[str, list[float]] = {name: [] for name in PARTS}

    def timed(name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            c0 = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[name][-1] += time.process_time() - c0

        return wrapper

    for name in PARTS:
        setattr(plan_module, name, timed(name, getattr(plan_module, name)))
    for name in PARTS:
        spent[name].append(0.0)
    out = plan_module.plan(snapshot, cfg, history, now)
    for name in PARTS:
        spent[name].clear()
    seen = (out.decisions, out.skips, sorted(out.history.targets.items()))
    digest = int(hashlib.sha256(repr(seen).encode()).hexdigest()[:12], 16)
    whole = []
    for _ in range(repeat):
        for name in PARTS:
            spent[name].append(0.0)
        c0 = time.process_time()
        plan_module.plan(snapshot, cfg, history, now)
        whole.append(time.process_time() - c0)
    found = {"plan": whole}
    found.update((name.strip("_").removeprefix("decide_"), spent[name]) for name in PARTS)
    fields = [
        f"{k}_ms_min={1e3 * min(v):.4f} {k}_ms_med={1e3 * statistics.median(v):.4f}"
        for k, v in found.items()
    ]
    print(f"RESULT {' '.join(fields)} digest={digest}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,40", help="lanes in lockstep")
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--repeat", type=int, default=60, help="timed plans a child")
    ap.add_argument("--base", default="3ecdbd8", help="the revision timed against the tree")
    ap.add_argument("--rounds", type=int, default=2, help="base/tree alternations")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.repeat)
        return
    out, same = [f"hours={args.hours:g}"], True
    with tempfile.TemporaryDirectory() as tmp:
        for lanes in (int(s) for s in args.sizes.split(",")):
            pkl = Path(tmp) / f"plan{lanes}.pkl"
            pkl.write_bytes(capture(lanes, args.hours))
            os.environ.update(dict.fromkeys(KEEP_MEMORY, str(2**28)))  # the children's
            cmd = [sys.executable, __file__, "--child", str(pkl), "--repeat", str(args.repeat)]
            runs = alternated(args.base, args.rounds, {"base": cmd, "": cmd})
            same &= len({x["digest"] for x in runs["base"] + runs[""]}) == 1
            for field in medians(runs):  # KEY=, KEY_base=: KEY_N=, KEY_N_base=
                key, value = field.split("=")
                name = key.removesuffix("_base")
                if name != "digest":
                    out.append(f"{name}_{lanes}{key[len(name) :]}={float(value):.3f}")
    print("RESULT " + " ".join(out) + f" same={int(same)}")
    if not same:
        sys.exit("the base and this tree planned differently")


if __name__ == "__main__":
    main()
