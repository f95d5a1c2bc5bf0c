"""The examples in docs/mad.md run as written.

Every ``python`` block of the page is classified by the heading it sits under:
run here (on the mock, or pure marshaling), run on ibsim as a host under
umad2sim (the MAD client's query, compared with ``smpquery`` in the same
test), or a fragment of a larger program (named below with why).  A new block
fails :func:`test_every_example_is_run_or_named_a_fragment` until it is
classified.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ibal.testing.ibsim import Fabric

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "mad.md"

RUN_HERE = {
    "## Marshaling": "a query built, answered by header.respond, decoded and dumped",
    "### Example: an agent that answers a class, and a request with its response":
        "an agent serving Get of a vendor class, and a request linked to its response",
    "### Example: an RMPP transfer": "a 2,000-byte Set in segments between two services",
    "## CM and DM messages": "a CM REQ built and parsed",
}  # fmt: skip
RUN_ON_IBSIM = "### The MAD client (`ibal.mad.rpc`)"
FRAGMENTS = {
    "## IBMF alternate QPs": "needs a registered service and a peer QP (tests/mad/test_altqp.py)",
    "## RMPP": "the driver's calls inside a MAD service (tests/mad/test_rmpp_io.py)",
}


def _blocks() -> dict[str, str]:
    """Each python block by the heading above it (one block per heading)."""
    out: dict[str, str] = {}
    heading = ""
    for part in re.split(r"(```python\n.*?```)", DOC.read_text(), flags=re.S):
        if part.startswith("```python"):
            assert heading not in out, f"two examples under {heading!r}: give one a heading"
            out[heading] = part[len("```python\n") : -3]
        else:
            heads = re.findall(r"^#{2,4} .*$", part, re.M)
            heading = heads[-1] if heads else heading
    return out


def test_every_example_is_run_or_named_a_fragment() -> None:
    assert set(_blocks()) == {*RUN_HERE, RUN_ON_IBSIM, *FRAGMENTS}


@pytest.mark.parametrize("heading", sorted(RUN_HERE))
def test_example_runs(heading: str) -> None:
    exec(compile(_blocks()[heading], f"{DOC}: {heading}", "exec"), {})


@pytest.mark.timeout(300)
def test_the_query_example_prints_what_smpquery_prints(ibsim_fabric: Fabric) -> None:
    """The MAD client's example as ``Host`` of the small ibsim fabric: its NodeInfo dump of
    the switch behind the port is ``smpquery nodeinfo -D 0,1``'s, line for line."""
    env = ibsim_fabric.env_for("Host")
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    r = subprocess.run([sys.executable, "-c", _blocks()[RUN_ON_IBSIM]], env=env,
                       capture_output=True, text=True, timeout=120,
                       cwd=ibsim_fabric.workdir)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    theirs = ibsim_fabric.run(["smpquery", "nodeinfo", "-D", "0,1"], "Host").stdout
    assert "NodeType:........................Switch" in theirs.splitlines()
    assert r.stdout.splitlines() == theirs.splitlines()
