"""The service-registration examples of docs/sa.md run as written, as ``Host`` on ibsim
(OpenSM's SA answers them); ``saquery SR`` run afterwards shows the services gone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ibal.testing.ibsim import Fabric

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "sa.md"
EXPECTED = {
    "### Example: register a service, renew its lease, deregister": [
        r"^ibal-demo 0x1000000000000042 fe80::[0-9a-f:]+ 4791$",
        r"^expires 30\.0 s after the renewal goes out$",
        r"^deleted: SUCCESS$",
    ],
    "### Example: the IBAL shape (`ib_reg_svc_req_t`, `IB_FLAGS_SYNC`)": [
        r"^mine SUCCESS 0x0 0xffffffff$",
    ],
}


def _block(heading: str) -> str:
    text = DOC.read_text()
    start = text.index(heading + "\n")
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, start)
    assert m is not None, heading
    return m.group(1)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("heading", sorted(EXPECTED))
def test_example_runs_against_opensm(ibsim_fabric: Fabric, heading: str) -> None:
    env = ibsim_fabric.env_for("Host")
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    r = subprocess.run([sys.executable, "-c", _block(heading)], env=env, capture_output=True,
                       text=True, timeout=240, cwd=ibsim_fabric.workdir)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert len(lines) == len(EXPECTED[heading]), r.stdout
    for line, pattern in zip(lines, EXPECTED[heading], strict=True):
        assert re.match(pattern, line), (line, pattern)
    listed = ibsim_fabric.run(["saquery", "SR"], "Peer", timeout=60)
    assert listed.returncode == 0 and "ServiceRecord dump" not in listed.stdout, listed.stdout
