"""OpenSM matches a PortInfoRecord's CapabilityMask bitwise when the attribute modifier's
bit 31 is set, and by equality otherwise: what IOC discovery's query (and the mock SA)
rely on.  Checked on ibsim with IsSM, the one bit a port of ibsim has that we know of,
against ``saquery -s`` (libibnetdisc's "ports with IsSM", the same enhanced query)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from ibal.testing.ibsim import Fabric

REPO = Path(__file__).resolve().parents[2]

CODE = """
import json, sys
import ibal
from ibal.dm.discovery import ENHANCED_COMP_MASK
from ibal.wire.mad import sa
from ibal.wire.mad.consts import Method, SaAttr
from ibal.wire.mad.smp import CapabilityMask
from ibal.sa import SaPort

al = ibal.open_al()
ca = next(g for g in al.get_ca_guids() if al.open_ca(g).name == "ibsim0")
port = SaPort.open(al, al.query_ca_by_guid(ca).ports[0].port_guid)
data = sa.PORT_INFO_RECORD.encode(capability_mask=int(CapabilityMask.IS_SM))
mask = sa.component_mask(sa.PORT_INFO_RECORD, ["capability_mask"])
out = {}
for name, mod in (("bitwise", ENHANCED_COMP_MASK), ("equal", 0)):
    a = port.request(Method.GET_TABLE, SaAttr.PORT_INFO_RECORD, data, mask, attr_mod=mod).wait(60)
    recs = [sa.PORT_INFO_RECORD.decode(r[: sa.PORT_INFO_RECORD.size]) for r in a.records]
    out[name] = [a.status.name, [r["endport_lid"] for r in recs],
                 [r["capability_mask"] for r in recs]]
print(json.dumps(out))
al.close()
"""


def test_opensm_matches_the_capability_mask_bitwise_with_bit_31(
    ibsim_module_fabric: Fabric,
) -> None:
    fabric = ibsim_module_fabric
    env = fabric.env_for("Host")
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    r = subprocess.run([sys.executable, "-c", CODE], env=env, cwd=fabric.workdir,
                       capture_output=True, text=True, timeout=240)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    s = fabric.run(["saquery", "-s"], "Host", timeout=60)
    assert s.returncode == 0, s.stderr
    issm = s.stdout.split("IsSMdisabled ports")[0]  # saquery -s: IsSM, then IsSMdisabled
    lids = sorted(int(x) for x in re.findall(r"EndPortLid\.+(\d+)", issm))
    status, found, caps = got["bitwise"]
    assert status == "SUCCESS" and sorted(found) == lids and len(lids) == 1
    assert caps[0] & 0x2 and caps[0] != 0x2  # IsSM, among other bits
    assert got["equal"] == ["SUCCESS", [], []]  # no port has IsSM alone
