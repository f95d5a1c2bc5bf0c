"""The rdma_core umad backend against OpenSM on the ibsim simulated fabric.

The ``ibsim_fabric`` fixture (:mod:`ibal.testing.ibsim`) starts ibsim on
``tests/data/ibsim/small.net`` with OpenSM on ``SmHca`` and waits until the
subnet is up; ``umad_ibsim_probe.py`` then runs on ``Host`` under umad2sim:
a directed-route SubnGet(PortInfo) answered by ibsim's SMA and a
SubnAdmGetTable(NodeRecord) answered by OpenSM.  The answers are compared
with ``smpquery`` and ``saquery`` run on the same fabric.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ibal.testing.ibsim import Fabric

PROBE = Path(__file__).with_name("umad_ibsim_probe.py")
REPO = Path(__file__).resolve().parents[3]
NODE = "Host"


def _diag(fabric: Fabric, args: list[str]) -> str:
    return fabric.run(args, NODE, timeout=60).stdout


def _field(text: str, name: str) -> str:
    m = re.search(rf"^\s*{name}:?\.+\s*(\S+)", text, re.M)
    assert m, (name, text)
    return m.group(1)


@pytest.mark.timeout(180)
def test_smp_and_sa_query_through_umad_match_infiniband_diags(ibsim_fabric: Fabric) -> None:
    fabric = ibsim_fabric
    env = fabric.env_for(NODE)
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    r = subprocess.run([sys.executable, str(PROBE)], env=env, capture_output=True, text=True,
                       timeout=120, cwd=fabric.workdir)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["cas"] == ["ibsim0"]
    # SMP: the same port as smpquery sees it.
    pi = _diag(fabric, ["smpquery", "portinfo", "-D", "0"])
    assert got["smp_method"] == 0x81 and got["smp_done"] == "SUCCESS"
    assert got["lid"] == int(_field(pi, "Lid"))
    assert got["sm_lid"] == int(_field(pi, "SMLid"))
    assert got["port_state"] == 4  # ACTIVE: OpenSM brought the subnet up
    # SA: OpenSM's first NodeRecord, as saquery prints it.
    nr = _diag(fabric, ["saquery", "-N"])
    assert (got["sa_method"], got["sa_status"], got["sa_done"]) == (0x92, 0, "SUCCESS")
    assert got["rec_lid"] == int(_field(nr, "lid"), 0)
    assert got["rec_node_guid"] == int(_field(nr, "node_guid"), 16)
    assert got["rec_port_guid"] == int(_field(nr, "port_guid"), 16)
    assert got["rec_desc"] in nr
