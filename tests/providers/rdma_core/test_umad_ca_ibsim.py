"""The rdma_core provider's MAD-only CA on ibsim, against OpenSM and infiniband-diags.

``umad_ca_probe.py`` runs as ``Host`` under umad2sim: ``ibal.open_al()`` must
find ``ibsim0`` as a MAD-only CA; its port attributes must equal what
``smpquery portinfo`` and ``sminfo`` say; a SubnGet(NodeInfo) on a QP0 alias
must equal ``smpquery nodeinfo``, and a SubnAdmGet(NodeRecord) on a QP1 alias
(answered by OpenSM) ``saquery NR``.  Then the link of ``Host`` goes down on
ibsim's console, which must bring PORT_DOWN to the probe's PnP client, and up
again, which must bring PORT_ACTIVE (OpenSM re-activates the port).
"""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

import pytest

from ibal.testing.ibsim import Fabric

PROBE = Path(__file__).with_name("umad_ca_probe.py")
REPO = Path(__file__).resolve().parents[3]
NODE = "Host"
WAIT = 60.0


def _field(text: str, name: str) -> str:
    m = re.search(rf"^\s*{name}:?\.+\s*(\S+)", text, re.M)
    assert m, (name, text)
    return m.group(1)


class _Lines:
    """The probe's JSON lines, read on a thread so waits have a deadline."""

    def __init__(self, stream: TextIO) -> None:
        self.q: queue.Queue[str | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: TextIO) -> None:
        for line in stream:
            self.q.put(line)
        self.q.put(None)

    def wait_for(self, key: str, value: object = None) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no {key}={value} from the probe; saw {self.seen}"
            try:
                line = self.q.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, f"the probe ended before {key}={value}; saw {self.seen}"
            if not line.startswith("{"):
                continue
            rec = json.loads(line)
            self.seen.append(rec)
            if key in rec and (value is None or rec[key] == value):
                return rec


@pytest.mark.timeout(300)
def test_mad_only_ca_attributes_mads_and_port_events(ibsim_fabric: Fabric) -> None:
    fabric = ibsim_fabric
    portinfo = fabric.run(["smpquery", "portinfo", "-D", "0"], NODE).stdout
    sminfo = fabric.run(["sminfo"], NODE).stdout
    nodeinfo = fabric.run(["smpquery", "nodeinfo", "-D", "0"], NODE).stdout
    sm_lid = int(re.search(r"sminfo: sm lid (\d+)", sminfo).group(1))  # type: ignore[union-attr]
    noderec = fabric.run(["saquery", "NR", str(sm_lid)], NODE).stdout

    env = fabric.env_for(NODE)
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    # `ibal info` lists the CA with its port as the SMA reports it.
    info = subprocess.run([sys.executable, "-c", "from ibal.cli import main; main()", "info"],
                          env={**env, "COLUMNS": "200"}, cwd=fabric.workdir, text=True,
                          capture_output=True, timeout=WAIT)  # fmt: skip
    assert "CA 'ibsim0' (rdma_core)" in info.stdout, info.stderr
    lid = int(_field(portinfo, "Lid"))
    assert re.search(rf"LID / LMC / SM LID\s+0x{lid:x} / 0 / 0x{sm_lid:x}", info.stdout)
    assert "MAD-only CA" in info.stdout
    env["SA_LID"] = str(sm_lid)
    pipe = subprocess.PIPE
    p = subprocess.Popen([sys.executable, str(PROBE)], env=env, cwd=fabric.workdir, text=True,
                         stdin=pipe, stdout=pipe, stderr=pipe)  # fmt: skip
    try:
        assert p.stdout is not None and p.stdin is not None
        lines = _Lines(p.stdout)
        attrs = lines.wait_for("attrs")["attrs"]
        # The CA: MAD-only, from the rdma_core provider, verbs refused with the reason.
        assert attrs["provider"] == "rdma_core"
        assert (attrs["qp_types"], attrs["mad_agents"]) == (0, True)
        assert "MAD-only CA" in attrs["create_cq_refused"]
        # Port 1 as the port's SMA and the SM report it.
        assert attrs["lid"] == int(_field(portinfo, "Lid"))
        assert attrs["sm_lid"] == int(_field(portinfo, "SMLid")) == sm_lid
        assert attrs["lmc"] == int(_field(portinfo, "LMC"))
        assert attrs["state"] == "ACTIVE" == _field(portinfo, "LinkState").upper()
        assert attrs["gid0"].startswith("fe80::")
        assert attrs["node_guid"] == int(_field(nodeinfo, "Guid"), 16)
        assert attrs["port_guid"] == int(_field(nodeinfo, "PortGuid"), 16)
        # SubnGet(NodeInfo) on a QP0 alias: the same node as smpquery sees.
        smp = lines.wait_for("smp")["smp"]
        assert (smp["method"], smp["status"]) == (0x81, "SUCCESS")
        assert smp["node_guid"] == int(_field(nodeinfo, "Guid"), 16)
        assert smp["sys_guid"] == int(_field(nodeinfo, "SystemGuid"), 16)
        assert smp["port_guid"] == int(_field(nodeinfo, "PortGuid"), 16)
        assert smp["num_ports"] == int(_field(nodeinfo, "NumPorts"))
        assert smp["local_port"] == int(_field(nodeinfo, "LocalPort"))
        # SubnAdmGet(NodeRecord) on a QP1 alias, answered by OpenSM as saquery prints it.
        sa = lines.wait_for("sa")["sa"]
        assert (sa["method"], sa["mad_status"], sa["status"]) == (0x81, 0, "SUCCESS")
        assert sa["lid"] == int(_field(noderec, "lid"), 0) == sm_lid
        assert sa["node_guid"] == int(_field(noderec, "node_guid"), 16)
        assert sa["port_guid"] == int(_field(noderec, "port_guid"), 16)
        assert sa["desc"] == _field(noderec, "NodeDescription")
        # PnP: the link goes down on ibsim's console, then comes back.
        lines.wait_for("ready")
        fabric.unlink(NODE, 1)
        down = lines.wait_for("pnp", "PORT_DOWN")
        assert down["state"] == "DOWN"
        fabric.relink(NODE, 1)
        up = lines.wait_for("pnp", "PORT_ACTIVE")
        assert (up["state"], up["lid"]) == ("ACTIVE", attrs["lid"])
        p.stdin.close()
        assert p.wait(timeout=WAIT) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        err = p.stderr.read() if p.stderr is not None else ""
        if p.returncode:
            print(err[-4000:])


@pytest.mark.timeout(300)
def test_open_close_with_mads_in_flight_many_times(ibsim_fabric: Fabric) -> None:
    """umad2sim crashed (SIGSEGV in its receive thread) on an answer for a class whose agent
    had gone; a process must survive opening and closing the CA with answers in flight."""
    fabric = ibsim_fabric
    nodeinfo = fabric.run(["smpquery", "nodeinfo", "-D", "0"], NODE).stdout
    sm_lid = int(_field(fabric.run(["smpquery", "portinfo", "-D", "0"], NODE).stdout, "SMLid"))
    env = fabric.env_for(NODE)
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    env["PYTHONFAULTHANDLER"] = "1"
    rounds = 12  # past umad2sim's 8 descriptors and 32 agent registrations per device
    env["ROUNDS"] = str(rounds)
    r = subprocess.run([sys.executable, str(PROBE.with_name("umad_churn_probe.py"))], env=env,
                       cwd=fabric.workdir, text=True, capture_output=True, timeout=240)  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    recs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert recs[-1] == {"done": rounds}
    guid = int(_field(nodeinfo, "Guid"), 16)
    assert [(x["round"], x["node_guid"], x["sa_lid"]) for x in recs[:-1]] == [
        (n, guid, sm_lid) for n in range(rounds)
    ]
