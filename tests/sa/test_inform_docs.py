"""The subscription example of docs/sa.md runs as written, against OpenSM on ibsim.

It runs as ``Host`` under umad2sim after a prelude that takes ibsim's SM flag
for the port (:mod:`ibal.testing.ibsim_sm_flag`: else ibsim hands the SA's
Reports to no one here); once it prints ``subscribed: SUCCESS`` the test takes
Peer's link down, and the example must print Peer's GID, as trap 65 reports it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ibal.testing.ibsim import Fabric

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "sa.md"
HEADING = "### Example: told when a port leaves the subnet"
PRELUDE = """\
import ibal as _ibal
from ibal.testing.ibsim_sm_flag import hold_sm_flag as _hold

_al = _ibal.open_al()
_flag = _hold(next(c for c in map(_al.open_ca, _al.get_ca_guids()) if c.name == "ibsim0"))
"""
POSTLUDE = """
_flag.release()
_al.close()
"""


def example() -> str:
    text = DOC.read_text()
    start = text.index(HEADING)
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, start)
    assert m is not None, f"no python block under {HEADING!r}"
    return m.group(1)


@pytest.mark.timeout(180)
def test_subscription_example_reports_a_port_going_down(ibsim_fabric: Fabric) -> None:
    fabric = ibsim_fabric
    out = fabric.run(["smpquery", "nodeinfo", "-D", "0"], "Peer").stdout
    m = re.search(r"^PortGuid:\.+0x([0-9a-f]+)", out, re.M)
    assert m, out
    peer_gid = (0xFE80 << 112 | int(m.group(1), 16)).to_bytes(16, "big").hex()
    env = fabric.env_for("Host")
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    p = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + example() + POSTLUDE], env=env, cwd=fabric.workdir,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert p.stdout is not None
        first = p.stdout.readline()
        assert first == "subscribed: SUCCESS\n", (first, p.stderr.read() if first == "" else "")
        fabric.unlink("Peer", 1)
        rest, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err[-3000:]
    assert rest == f"out of service: {peer_gid}\n"
    fabric.relink("Peer", 1)
