"""Lab tests use the fixtures of ibal.lab.pytest_plugin (loaded here, not globally)."""

import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from ibal.lab import LabSession
from ibal.lab.netns import lab_namespaces
from ibal.lab.pytest_plugin import (  # noqa: F401  (fixtures and the marker hook)
    ibal_lab,
    ibal_lab_module_guest,
    ibal_lab_module_net,
    ibal_lab_module_net_guest,
    ibal_lab_module_session,
    ibal_lab_net,
    ibal_lab_session,
    pytest_configure,
)


def lab_leftovers(tmp: Path, netns: str | None) -> list[str]:
    """What a closed session left behind: temp dir, namespace, processes, qemu children."""
    problems = []
    if tmp.exists():
        problems.append(f"temp dir {tmp} still exists")
    if netns is not None:
        listing = subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, check=False
        ).stdout
        if any(line.split()[0] == netns for line in listing.splitlines() if line.strip()):
            problems.append(f"network namespace {netns} still exists")
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if str(tmp) in cmdline:
            problems.append(f"process {entry.name} still runs: {cmdline[:200]}")
        elif ppid == me and "qemu" in cmdline:
            problems.append(f"qemu child {entry.name} still runs: {cmdline[:200]}")
    return problems


@pytest.fixture
def assert_cleaned() -> Callable[[LabSession], None]:
    """Assert that a closed session left nothing behind."""

    def check(session: LabSession) -> None:
        assert lab_leftovers(session.tmp, session.netns_name) == []

    return check


@pytest.fixture
def assert_no_lab_state() -> Callable[[], None]:
    """Assert that this process owns no lab namespace, temp dir or qemu child right now."""

    def check() -> None:
        mine = f"-{os.getpid()}-"
        problems = [f"namespace {n}" for n in lab_namespaces() if mine in n]
        problems += [f"temp dir {p}" for p in Path(tempfile.gettempdir()).glob(f"ibal-lab{mine}*")]
        problems += lab_leftovers(Path("/nonexistent-ibal-lab"), None)
        assert problems == []

    return check
