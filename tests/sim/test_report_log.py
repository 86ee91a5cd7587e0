"""The simulator's report on a fresh machine: matplotlib's own INFO lines (it builds its
font cache on its first import) stay out of the text report and the log."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from builders import CLI


def test_a_first_run_of_matplotlib_puts_no_log_line_in_the_report(tmp_path: Path) -> None:
    cache = tmp_path / "matplotlib"  # empty: matplotlib builds its font cache in this run
    out = subprocess.run(
        [*CLI, "simulate", "--hours", "1", "--no-baselines", "--report", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "MPLCONFIGDIR": str(cache)},
    )
    assert out.returncode == 0, out.stderr
    assert any(cache.iterdir()), "the font cache was built in this run"
    assert "matplotlib." not in out.stdout + out.stderr  # its loggers' names
    assert (tmp_path / "r" / "simulation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
