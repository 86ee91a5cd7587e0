"""The layers are import-linter contracts in pyproject.toml, run by `make lint`; these
tests show they hold and that they guard (a copy with a forbidden import breaks them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_layer_contracts_hold() -> None:
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("core/replicas.py", "from gpuscaler.setup import kube_api", "The core imports nothing"),
        ("core/replicas.py", "import time", "no clock, network"),
        ("core/fragments.py", "import kubernetes", "no clock, network"),
        ("adapters/prometheus/source.py", "from gpuscaler import controller", "Adapters never"),
        ("sim/report.py", "from gpuscaler.adapters import prometheus", "The simulator, the"),
        ("whatif/history.py", "from gpuscaler.adapters import kube", "The simulator, the"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, line: str, broken: str
) -> None:
    shutil.copytree(ROOT / "gpuscaler", tmp_path / "gpuscaler")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "gpuscaler" / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    out = _lint(tmp_path)
    assert out.returncode != 0
    text = " ".join(out.stdout.split())  # contract names wrap across lines
    after = text[text.index(broken) :]
    status = min((after.find(word), word) for word in ("BROKEN", "KEPT") if after.find(word) >= 0)
    assert status[1] == "BROKEN", out.stdout
