"""A git revision's `gpuscaler` package unpacked into a directory, for benches that time
a baseline revision against the working tree in the same run (bench/windows.py,
bench/corecost.py)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def unpack(revision: str, dest: str) -> None:
    """Extract `revision`'s gpuscaler/ into `dest` (git archive | tar)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "gpuscaler"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)


def alternated(
    base: str, rounds: int, commands: dict[str, list[str]]
) -> dict[str, list[dict[str, float]]]:
    """`commands["base"]` run with `base` unpacked first on PYTHONPATH and `commands[""]`
    with this tree, alternated `rounds` times in child processes: each run's RESULT
    fields, by which ("base" or "") (bench/lockstep.py, bench/lanes.py)."""
    rows: dict[str, list[dict[str, float]]] = {"base": [], "": []}
    with tempfile.TemporaryDirectory() as tmp:
        unpack(base, tmp)
        for r in range(rounds):
            for which, path in (("base", tmp), ("", str(ROOT))):
                env = {**os.environ, "PYTHONPATH": path}
                done = subprocess.run(
                    commands[which], env=env, check=True, capture_output=True, text=True
                )
                line = done.stdout.strip().splitlines()[-1]
                print(f"round {r} {which or 'tree'}: {line}", file=sys.stderr, flush=True)
                fields = dict(x.split("=") for x in line.removeprefix("RESULT ").split())
                rows[which].append({k: float(v) for k, v in fields.items()})
    return rows


def medians(rows: dict[str, list[dict[str, float]]]) -> list[str]:
    """The RESULT fields of `alternated`'s rows: each field's median over the rounds of
    this tree, then the base's under `KEY_base` where the base printed it."""
    out = []
    for key in rows[""][0]:
        out.append(f"{key}={statistics.median(x[key] for x in rows['']):g}")
        if key != "hours" and key in rows["base"][0]:
            out.append(f"{key}_base={statistics.median(x[key] for x in rows['base']):g}")
    return out
