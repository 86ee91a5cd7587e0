"""The image's pinned dependencies (requirements.lock, made by `make lock` with uv) agree
with pyproject.toml, and the Dockerfile installs exactly them: every dependency of the
project is pinned at a version its specifier allows, every pin is needed (pulled in by
the project or by another pin), every pin carries hashes, and the project itself is
installed without resolving anything else."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "gpuscaler (pyproject.toml)"


@dataclass
class Pin:
    version: Version
    marker: str | None
    hashes: int = 0
    via: set[str] = field(default_factory=set)


def parse_lock(text: str) -> dict[str, Pin]:
    """uv's requirements format: `name==version [; marker] \\`, `--hash=` lines, then
    `# via X` or `# via` followed by `#   X` lines."""
    pins: dict[str, Pin] = {}
    current: Pin | None = None
    in_via = False
    for line in text.splitlines():
        head = re.match(
            r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$", line
        )
        if head:
            current = Pin(Version(head.group(2)), head.group(3))
            pins[canonicalize_name(head.group(1))] = current
            in_via = False
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped.startswith("--hash=sha256:"):
            current.hashes += 1
        elif stripped == "# via":
            in_via = True
        elif stripped.startswith("# via "):
            current.via.add(stripped.removeprefix("# via "))
            in_via = False
        elif in_via and stripped.startswith("#   "):
            current.via.add(stripped.removeprefix("#   "))
        elif line and not line.startswith(" "):
            raise AssertionError(f"requirements.lock: unexpected line {line!r}")
    return pins


def _name(via: str) -> str:
    return via if via == PROJECT else canonicalize_name(via.split(" ")[0])


LOCK = parse_lock((ROOT / "requirements.lock").read_text())
DEPENDENCIES = [
    Requirement(r)
    for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
]


@pytest.mark.parametrize("requirement", DEPENDENCIES, ids=str)
def test_every_dependency_of_the_project_is_pinned_within_its_specifier(
    requirement: Requirement,
) -> None:
    pin = LOCK.get(canonicalize_name(requirement.name))
    assert pin is not None, f"{requirement.name} is not in requirements.lock: run make lock"
    assert requirement.specifier.contains(pin.version, prereleases=True), (
        f"{requirement.name}=={pin.version} is outside {requirement.specifier}: run make lock"
    )
    assert PROJECT in pin.via
    if requirement.marker is not None:  # the same platforms as pyproject says
        assert pin.marker is not None and str(requirement.marker) == pin.marker.replace("'", '"')


def test_every_pin_is_needed_and_carries_hashes() -> None:
    direct = {canonicalize_name(r.name) for r in DEPENDENCIES}
    for name, pin in LOCK.items():
        assert pin.hashes > 0, f"{name} has no --hash"
        if PROJECT in pin.via:
            assert name in direct, f"{name}: the lock says the project needs it, pyproject does not"
        assert pin.via, f"{name}: pinned for nothing"
        for via in pin.via:
            assert _name(via) == PROJECT or _name(via) in LOCK, f"{name} via {via}: not pinned"


def test_every_pin_is_reachable_from_the_project() -> None:
    reached, frontier = set(), {PROJECT}
    while frontier:
        reached |= frontier
        frontier = {n for n, p in LOCK.items() if {_name(v) for v in p.via} & reached} - reached
    assert set(LOCK) <= reached, sorted(set(LOCK) - reached)


def test_the_parser_reads_the_formats_uv_writes_and_refuses_others() -> None:
    pins = parse_lock(
        "a==1.0 ; sys_platform != 'win32' \\\n    --hash=sha256:00\n    # via gpuscaler (pyproject.toml)\n"
        "b==2.0 \\\n    --hash=sha256:11 \\\n    --hash=sha256:22\n    # via\n    #   a\n    #   c\n"
    )
    assert pins["a"].marker == "sys_platform != 'win32'" and pins["a"].via == {PROJECT}
    assert pins["b"].hashes == 2 and pins["b"].via == {"a", "c"}
    with pytest.raises(AssertionError, match="unexpected line"):
        parse_lock("a==1.0 \\\n    --hash=sha256:00\nb>=2\n")


def test_the_dockerfile_installs_the_lock_with_hashes_and_then_only_the_project() -> None:
    build = (ROOT / "Dockerfile").read_text().split("\nFROM ")[1]  # the build stage
    assert "COPY requirements.lock" in build
    assert "--require-hashes -r requirements.lock" in build
    installs = re.findall(r"pip install ([^\n\\&]*)", build)
    assert all("--require-hashes" in i or "--no-deps" in i for i in installs), installs
    assert build.index("--require-hashes") < build.index("--no-deps .")
