"""IOC discovery's SA phase against OpenSM on ibsim (umad2sim), in a process of its own.

No port of ibsim advertises device management, and ibsim hands QP1 requests to
OpenSM's client only (no DM agent of ours can answer there), so:

* as shipped, the sweep asks OpenSM for the DM ports, gets none, and reports
  nothing, without an SA failure;
* asked for IsSM ports instead (``TargetSearch.capability``), it finds the SM's
  port through OpenSM's PortInfoRecords, NodeRecord and PathRecord (checked
  against ``saquery``), sends its IOUnitInfo Gets there, and, OpenSM not
  answering the DM class, gives the unit up after the retries: unreachable,
  nothing reported.
"""

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
from ibal.dm.discovery import Discovery
from ibal.dm.targets import TargetSearch
from ibal.wire.mad import sa
from ibal.wire.mad.smp import CapabilityMask

al = ibal.open_al()
disc = Discovery.start(al.manager, interval=None, timeout=0.3, retries=1)
out = {}
for name in ("dm", "issm"):
    if name == "issm":
        TargetSearch.capability = CapabilityMask.IS_SM
    found = disc.sweep_now().wait(120)
    out[name] = {
        "ious": len(found.ious), "stats": dict(disc.stats), "last": dict(disc.last_stats),
        "targets": [[t.iou.guid, t.iou.desc, t.iou.ca_guid, sa.PATH_RECORD.decode(t.path)["dlid"],
                     sa.PATH_RECORD.decode(t.path)["slid"]] for t in disc.last_targets],
    }
out["ca"] = al.get_ca_guids()[0]
out["lid"] = al.query_ca_by_guid(out["ca"]).ports[0].lid
print(json.dumps(out))
disc.close()
al.close()
"""


def test_the_sa_phase_against_opensm(ibsim_fabric: Fabric) -> None:
    # Its own fabric: the DM Gets sent to the SM's port reach OpenSM's umad2sim client, which
    # serves no such class, and ibsim then drops that client ("seems to be dead").  So
    # saquery answers first.
    fabric = ibsim_fabric
    s = fabric.run(["saquery", "-s"], "Host", timeout=60)  # the IsSM ports, as saquery asks
    assert s.returncode == 0, s.stderr
    [sm_lid] = [int(x) for x in re.findall(r"EndPortLid\.+(\d+)",
                                           s.stdout.split("IsSMdisabled")[0])]  # fmt: skip
    nr = fabric.run(["saquery", "NR", str(sm_lid)], "Host", timeout=60)
    assert nr.returncode == 0, nr.stderr
    m = re.search(r"node_guid\.+(0x[0-9a-f]+)", nr.stdout, re.I)
    assert m is not None and "SmHca" in nr.stdout, nr.stdout
    sm_guid = int(m.group(1), 16)

    env = fabric.env_for("Host")
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    r = subprocess.run([sys.executable, "-c", CODE], env=env, cwd=fabric.workdir,
                       capture_output=True, text=True, timeout=280)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    dm = got["dm"]
    assert dm["ious"] == 0 and dm["targets"] == [] and dm["last"].get("sent", 0) == 0
    assert not dm["stats"].get("sa_failed") and not dm["stats"].get("sa_malformed")

    issm = got["issm"]
    assert issm["targets"] == [[sm_guid, "SmHca", got["ca"], sm_lid, got["lid"]]]
    last = issm["last"]
    assert last["sent"] == 2 and last["timeouts"] == 1 and last["iou_unreachable"] == 1
    assert issm["ious"] == 0 and not issm["stats"].get("sa_failed")
