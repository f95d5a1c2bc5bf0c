"""Subscriptions against OpenSM on ibsim: InformInfo Set, Reports on link down/up, unsubscribe.

``inform_ibsim_probe.py`` runs as ``Host`` under umad2sim and holds ibsim's
SM flag for its port (:mod:`ibal.testing.ibsim_sm_flag`: ibsim hands the
SA's Reports to no other client).  ``saquery IIR`` run in the same test is
the independent check that OpenSM holds (then no longer holds) the
subscription; ``Unlink``/``ReLink`` of Peer's link on ibsim's console must
bring the Reports of traps 128 (the switch's port state changed), 65 and 64
(Peer's GID out of and back in service).
"""

from __future__ import annotations

import ipaddress
import json
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ibal.testing.ibsim import DATA_DIR, Fabric

PROBE = Path(__file__).with_name("inform_ibsim_probe.py")
REPO = Path(__file__).resolve().parents[2]
WAIT = 60.0


def _field(text: str, name: str) -> str:
    m = re.search(rf"^\s*{name}:?\.+\s*(\S+)", text, re.M)
    assert m, (name, text)
    return m.group(1)


class Probe:
    """The probe process: commands on stdin, one JSON event per stdout line."""

    def __init__(self, fabric: Fabric, node: str) -> None:
        env = fabric.env_for(node)
        env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
        self.p = subprocess.Popen(
            [sys.executable, str(PROBE)], env=env, cwd=fabric.workdir, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.stderr = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))
        self.events.put(None)

    def send(self, cmd: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def next(self, event: str, seen: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The next event of that kind (others go to ``seen``), within the deadline."""
        deadline = time.monotonic() + WAIT
        while True:
            try:
                ev = self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no {event!r} from the probe: {self.errors()}") from None
            if ev is None:
                raise AssertionError(f"the probe ended before {event!r}: {self.errors()}")
            if ev["event"] == event:
                return ev
            if seen is not None:
                seen.append(ev)

    def status(self) -> dict[str, Any]:
        self.send("status")
        return self.next("status")

    def errors(self) -> str:
        if self.p.poll() is None:
            return "(still running)"
        assert self.p.stderr is not None
        return self.p.stderr.read()[-3000:]

    def close(self) -> int:
        if self.p.poll() is None:
            with_stdin = self.p.stdin
            if with_stdin is not None and not with_stdin.closed:
                with_stdin.close()
            try:
                return self.p.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                self.p.kill()
        return self.p.wait()


def _iir(fabric: Fabric, gid: str, via: str = "Peer") -> list[str]:
    """``saquery IIR <gid>`` (run on ``via``): the trap numbers of that subscriber's
    InformInfoRecords."""
    r = fabric.run(["saquery", "IIR", gid], via)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("SubscriberGID") == len(re.findall(rf"SubscriberGID\.+{gid}\b",
                                                              r.stdout))  # fmt: skip
    return re.findall(r"trap_num\.+(\d+)", r.stdout)


@pytest.mark.timeout(300)
def test_link_down_up_delivers_trap_reports_and_unsubscribe_removes_the_records(
    ibsim_fabric: Fabric,
) -> None:
    fabric = ibsim_fabric
    peer_guid = int(_field(fabric.run(["smpquery", "nodeinfo", "-D", "0"], "Peer").stdout,
                           "PortGuid"), 16)  # fmt: skip
    switch_lid = int(_field(fabric.run(["smpquery", "portinfo", "-D", "0,1", "0"],
                                       "Host").stdout, "Lid"))  # fmt: skip
    probe = Probe(fabric, "Host")
    try:
        ready = probe.next("ready")
        assert ready["subs"] == {"64": "SUCCESS"}
        gid = str(ipaddress.IPv6Address(bytes.fromhex(ready["gid"])))
        assert _iir(fabric, gid) == ["64"]  # OpenSM holds it, as saquery shows
        probe.send("dup 64")  # a second one alike: OpenSM keeps one record for both
        assert probe.next("ready")["subs"] == {"64": "SUCCESS", "64+": "SUCCESS"}
        assert _iir(fabric, gid) == ["64"]

        probe.send("add 65")
        probe.next("ready")
        probe.send("add 128")
        ready = probe.next("ready")
        assert ready["subs"] == {"64": "SUCCESS", "64+": "SUCCESS", "65": "SUCCESS",
                                 "128": "SUCCESS"}  # fmt: skip

        reports: list[dict[str, Any]] = []
        fabric.unlink("Peer", 1)
        out = _wait_report(probe, reports, 65)
        fabric.relink("Peer", 1)
        back = _wait_report(probe, reports, 64)
        peer_gid = (0xFE80 << 112 | peer_guid).to_bytes(16, "big").hex()
        assert (out["gid"], back["gid"]) == (peer_gid, peer_gid)
        assert out["context"] == 65 and back["context"] == 64
        twin = _wait_report(probe, reports, 64)  # the same Report, to each of the two
        assert twin == back
        link = [r for r in reports if r["trap"] == 128]
        assert len(link) >= 2, reports  # the switch's port went down, then up
        assert all((r["issuer_lid"], r["lid"], r["context"]) == (switch_lid, switch_lid, 128)
                   for r in link)  # fmt: skip
        assert {r["trap"] for r in reports} <= {64, 65, 128}
        assert all(r["context"] == r["trap"] for r in reports)  # each to its subscription

        probe.send("unsubscribe")
        gone = probe.next("unsubscribed")
        assert gone["destroyed"] is True
        assert gone["status"] == {"64": "SUCCESS", "64+": "SUCCESS", "65": "SUCCESS",
                                  "128": "SUCCESS"}  # fmt: skip
        assert gone["late_reports"] == 0
        assert _iir(fabric, gid) == []  # removed from OpenSM's table

        probe.send("quit")
        bye = probe.next("bye")
        # OpenSM polled the port (IsSM set) in its sweeps and got its SMInfo answers
        assert bye["late_reports"] == 0 and bye["answered_sminfo"] >= 1
        assert probe.close() == 0, probe.errors()
    finally:
        probe.close()
    fabric.check_alive()
    log = fabric.opensm_log.read_text(errors="replace")
    assert "GID out of service" in log and "GID in service" in log


def _wait_report(probe: Probe, reports: list[dict[str, Any]], trap: int) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []
    while True:
        ev = probe.next("report", seen)
        reports.append(ev)
        if ev["trap"] == trap:
            return ev


def _until(what: str, fn: Callable[[], bool]) -> None:
    """Poll ``fn`` with a deadline (each look asks OpenSM afresh: not a sleep as a wait)."""
    deadline = time.monotonic() + WAIT
    while not fn():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT} s: {what}")
        time.sleep(0.2)


@pytest.mark.timeout(300)
def test_a_new_sm_gets_the_subscription_again(ibsim_fabric: Fabric) -> None:
    """OpenSM restarted on another node knows no subscription; the ports see a new SM
    LID (PnP SM_CHANGE) and the subscriber sends its InformInfo again: saquery IIR
    shows it, and a link change brings the report.  (ibsim's ports do not support
    ClientReregister, so a new OpenSM on the same node would not ask for it: the
    CLIENT_REREGISTER path is tested on the mock, test_inform_mock.py.)"""
    fabric = ibsim_fabric
    sm_guid = int(_field(fabric.run(["smpquery", "nodeinfo", "-D", "0"], "SmHca").stdout,
                         "PortGuid"), 16)  # fmt: skip
    sm_gid = (0xFE80 << 112 | sm_guid).to_bytes(16, "big").hex()
    probe = Probe(fabric, "Host")
    try:
        probe.next("ready")
        probe.send("add 65")
        ready = probe.next("ready")
        assert ready["subs"] == {"64": "SUCCESS", "65": "SUCCESS"}
        gid = str(ipaddress.IPv6Address(bytes.fromhex(ready["gid"])))
        assert sorted(_iir(fabric, gid, via="SmHca")) == ["64", "65"]
        fabric.start_sm("Peer")  # SmHca becomes a plain host
        _until("the subscriptions are back in OpenSM",
               lambda: sorted(_iir(fabric, gid, via="SmHca")) == ["64", "65"])  # fmt: skip
        _until("the renewals were answered",
               lambda: min(probe.status()["renewals"].values()) >= 1)  # fmt: skip
        reports: list[dict[str, Any]] = []
        fabric.unlink("SmHca", 1)
        assert _wait_report(probe, reports, 65)["gid"] == sm_gid
        fabric.relink("SmHca", 1)
        assert _wait_report(probe, reports, 64)["gid"] == sm_gid
        probe.send("quit")
        probe.next("bye")
        assert probe.close() == 0, probe.errors()
    finally:
        probe.close()


@pytest.mark.timeout(300)
def test_the_subscriber_port_down_and_up_renews_what_opensm_dropped(
    ibsim_factory: Callable[..., Fabric], tmp_path: Path
) -> None:
    """With ``drop_event_subscriptions`` OpenSM drops the subscriptions of a port that
    leaves the subnet (by default it keeps them); when the port is ACTIVE again (PnP
    PORT_ACTIVE) the subscriber sends its InformInfo again."""
    conf = tmp_path / "opensm.conf"
    conf.write_text("drop_event_subscriptions TRUE\n")
    # -D 0x0B: OpenSM's debug level logs the drop ("Removed event subscriptions")
    fabric = ibsim_factory(DATA_DIR / "small.net", opensm_args=["-F", str(conf), "-D", "0x0B"])
    probe = Probe(fabric, "Host")
    try:
        gid = str(ipaddress.IPv6Address(bytes.fromhex(probe.next("ready")["gid"])))
        assert _iir(fabric, gid) == ["64"]
        fabric.unlink("Host", 1)
        # the port watch looks every second: the probe must have seen the port down
        _until("the subscriber saw its port go down", lambda: probe.status()["port"] == "DOWN")
        guid = int(ipaddress.IPv6Address(gid)) & (1 << 64) - 1
        _until("OpenSM dropped the subscription", lambda: f"Removed event subscriptions for port "
               f"0x{guid:016x}" in fabric.opensm_log.read_text(errors="replace"))  # fmt: skip
        fabric.relink("Host", 1)
        _until("the subscription is back in OpenSM", lambda: _iir(fabric, gid) == ["64"])
        # OpenSM stores the record before its answer reaches the subscriber
        _until("the renewal was answered", lambda: probe.status()["renewals"]["64"] >= 1)
        probe.send("quit")
        probe.next("bye")
        assert probe.close() == 0, probe.errors()
    finally:
        probe.close()
