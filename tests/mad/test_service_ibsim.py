"""The MAD service on ibsim: SMPs to the local SMA and SA queries to OpenSM.

Runs ``service_ibsim_probe.py`` as ``Host`` under umad2sim on the shared
ibsim/OpenSM harness (the ``ibsim_fabric`` fixture: same skip/fail rules as
every ibsim test); ``smpquery nodeinfo`` run in the same test is the
independent check.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ibal.testing.ibsim import Fabric

PROBE = Path(__file__).with_name("service_ibsim_probe.py")
REPO = Path(__file__).resolve().parents[2]


def _field(text: str, name: str) -> str:
    """A field of infiniband-diags' dotted output (``Guid:....0x...``)."""
    m = re.search(rf"^\s*{name}:?\.+\s*(\S+)", text, re.M)
    assert m, (name, text)
    return m.group(1)


@pytest.mark.timeout(180)
def test_smp_and_sa_queries_through_mad_services(ibsim_fabric: Fabric) -> None:
    fabric = ibsim_fabric
    nodeinfo = fabric.run(["smpquery", "nodeinfo", "-D", "0"], "Host").stdout
    portinfo = fabric.run(["smpquery", "portinfo", "-D", "0"], "Host").stdout
    node_guid = int(_field(nodeinfo, "Guid"), 16)
    lid = int(_field(portinfo, "Lid"))
    env = fabric.env_for("Host")
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    env["QUERY_LID"] = str(lid)
    r = subprocess.run([sys.executable, str(PROBE)], env=env, capture_output=True, text=True,
                       timeout=120, cwd=fabric.workdir)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert (got["smp_method"], got["smp_tid_matches"]) == (0x81, True)
    assert got["node_guid"] == node_guid == got["ca_guid"]
    assert (got["sa_send"], got["sa_linked"], got["sa_status"]) == ("SUCCESS", True, 0)
    assert (got["sa_lid"], got["sa_node_guid"]) == (lid, node_guid)
