"""The query examples of docs/sa.md run as written, as ``Host`` on ibsim (OpenSM answers)."""

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
    "### Example: node and path records (blocking, callback, await)": [
        r"^me True True$",
        r"^path True True [1-5]$",
        r"^sm True$",
        r"^awaited True 1$",
        r"^all: ERROR$",
    ],
    "### Example: the IBAL shape (`ib_query_req_t`, `IB_FLAGS_SYNC`)": [
        r"^ctx SUCCESS PATH_REC_BY_LIDS 1$",
        r"^True True$",
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
def test_example_runs_against_opensm(ibsim_module_fabric: Fabric, heading: str) -> None:
    env = ibsim_module_fabric.env_for("Host")
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    r = subprocess.run([sys.executable, "-c", _block(heading)], env=env, capture_output=True,
                       text=True, timeout=240, cwd=ibsim_module_fabric.workdir)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert len(lines) == len(EXPECTED[heading]), r.stdout
    for line, pattern in zip(lines, EXPECTED[heading], strict=True):
        assert re.match(pattern, line), (line, pattern)
