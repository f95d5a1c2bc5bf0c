"""Multicast join, rejoin and leave against OpenSM on ibsim, checked with ``saquery``.

``mcast_ibsim_probe.py`` runs as ``Host`` under umad2sim (the rdma_core
provider's MAD-only CA: no UD QP, so the memberships have no QP to attach;
attach and UD traffic are proved on the mock, test_mcast_mock.py).  After each
step ``saquery MCMR`` (trusted SM_Key, one group and port: ibsim does not
carry RMPP, so a filtered query is the complete one) says which JoinState
OpenSM holds for the port.  OpenSM then moves to another node: the port sees a
new SM LID (PnP ``SM_CHANGE``), the new OpenSM knows none of the groups we
created, and every membership is redone.  Between the two, a join of a group
that does not exist fails with REMOTE_ERROR and the SA's status, and one
while no OpenSM runs with TIMEOUT.  ibsim does not keep PortInfo's
ClientReregister bit (it never reads back as set), so an OpenSM restarted on
the *same* node surfaces nothing a MAD-only CA could see; that path
(``CLIENT_REREGISTER``) is tested on the mock.
"""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ibal.testing.ibsim import Fabric

PROBE = Path(__file__).with_name("mcast_ibsim_probe.py")
REPO = Path(__file__).resolve().parents[2]
NODE = "Host"
NEW_MGID = "ff12:401b:ffff::db8:7"
BCAST_MGID = "ff12:401b:ffff::ffff:ffff"
WAIT = 90.0
ERR_REQ_INSUFFICIENT_COMPONENTS = 0x0600  # SA MAD status: class code 6 in bits 8..14


class Probe:
    def __init__(self, fabric: Fabric) -> None:
        env = fabric.env_for(NODE)
        env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
        env["NEW_MGID"] = NEW_MGID
        self.p = subprocess.Popen([sys.executable, str(PROBE)], env=env, cwd=fabric.workdir,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next(self) -> dict[str, Any]:
        while True:
            try:
                line = self.lines.get(timeout=WAIT)
            except queue.Empty:
                raise AssertionError("the probe said nothing in time") from None
            if line is None:
                assert self.p.stderr is not None
                raise AssertionError(f"the probe ended: {self.p.stderr.read()[-3000:]}")
            if line.startswith("{"):
                rec: dict[str, Any] = json.loads(line)
                assert rec["phase"] != "error", rec
                return rec

    def send(self, line: str) -> dict[str, Any]:
        assert self.p.stdin is not None
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.next()

    def close(self) -> None:
        if self.p.poll() is None:
            assert self.p.stdin is not None
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def member(fabric: Fabric, mgid: str, port_gid: str) -> dict[str, str] | None:
    """OpenSM's MCMemberRecord for (mgid, port), as ``saquery`` prints it; None if absent."""
    r = fabric.run(["saquery", "--smkey", "1", "MCMR", "--mgid", mgid, "--gid", port_gid], NODE)
    fields = dict(re.findall(r"^\s*(\w+)\.+(\S+)\s*$", r.stdout, re.M))
    return fields or None


@pytest.mark.timeout(600)
def test_join_rejoin_after_sm_move_and_leave_against_opensm(ibsim_fabric: Fabric) -> None:
    fabric = ibsim_fabric
    probe = Probe(fabric)
    try:
        joined = probe.next()
        assert joined["phase"] == "joined"
        gid, recs = joined["port_gid"], joined["recs"]
        assert recs["full"]["mgid"] == recs["non"]["mgid"] == NEW_MGID
        assert recs["full"]["mlid"] == recs["non"]["mlid"] >= 0xC000
        assert recs["sendonly"]["mgid"] == BCAST_MGID
        auto = recs["auto"]["mgid"]
        assert auto != "::" and auto.startswith("ff1")  # the SA assigned it
        expected = {NEW_MGID: "0x3", BCAST_MGID: "0x4", auto: "0x1"}  # FULL|NON, SendOnly, FULL
        mlids = {NEW_MGID: recs["full"]["mlid"], BCAST_MGID: recs["sendonly"]["mlid"],
                 auto: recs["auto"]["mlid"]}  # fmt: skip
        for mgid, state in expected.items():
            rec = member(fabric, mgid, gid)
            assert rec is not None, mgid
            assert (rec["JoinState"], int(rec["mlid"], 16)) == (state, mlids[mgid])
            assert rec["PortGid"] == gid
        assert member(fabric, NEW_MGID, gid)["qkey"] == "0xb1b"  # type: ignore[index]

        # no such group, no create: the SA's error status comes with REMOTE_ERROR
        tried = probe.send("try ff12:401b:ffff::db8:99")
        assert (tried["status"], tried["error_status"], tried["alive"]) == (
            "REMOTE_ERROR", ERR_REQ_INSUFFICIENT_COMPONENTS, False)  # fmt: skip
        # no SA at all: TIMEOUT, no error status
        fabric.stop_sm()
        assert probe.send(f"try {NEW_MGID}") == {
            "phase": "tried", "status": "TIMEOUT", "error_status": 0, "alive": False}  # fmt: skip

        # OpenSM comes back on Peer: a new SM LID, no memory of our groups
        fabric.start_sm("Peer")
        rejoined = probe.send("rejoin")
        assert {n for n, st, re_ in rejoined["events"] if st == "SUCCESS" and re_} == set(recs)
        assert rejoined["recs"]["auto"]["mgid"] == auto  # rejoined the group it had
        for mgid, state in expected.items():
            rec = member(fabric, mgid, gid)
            assert rec is not None and rec["JoinState"] == state, (mgid, rec)

        # leaving the NonMember membership leaves the FullMember one
        assert probe.send("leave non") == {"phase": "left", "name": "non", "status": "SUCCESS"}
        assert member(fabric, NEW_MGID, gid)["JoinState"] == "0x1"  # type: ignore[index]
        for name in ("full", "sendonly", "auto"):
            assert probe.send(f"leave {name}")["status"] == "SUCCESS"
        for mgid in expected:
            assert member(fabric, mgid, gid) is None, mgid
    finally:
        probe.close()
