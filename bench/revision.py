"""A git revision's `gpuscaler` package unpacked into a directory, for benches that time
a baseline revision against the working tree in the same run (bench/windows.py,
bench/corecost.py)."""

from __future__ import annotations

import subprocess
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
