"""Service registration against OpenSM on ibsim, checked from another port and by ``saquery``.

``sa_service_probe.py`` runs twice under umad2sim: on ``Host`` it registers
services (``ibal.sa.service``), on ``Peer`` -- another port, another process
-- it queries ServiceRecords by name, by ID and all through ``SaPort`` (all:
a Get with no component, which answers the one record there is; a GetTable
answer arrives cut to one MAD on ibsim, which carries no RMPP);
``saquery SR`` (infiniband-diags) run in the same test must print the record
the peer found, field for field.  Deregistration removes it; a short lease
runs out without renewal and holds with it (OpenSM honours ServiceLease in
seconds).  Waits poll a condition until a deadline; nothing sleeps to
synchronise.  Runs on the shared ibsim/OpenSM harness (skips naming the
missing Debian packages; fails instead under ``IBAL_LAB_REQUIRED=1``).
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ibal.testing.ibsim import Fabric
from ibal.types import Gid
from ibal.wire.mad import dump
from ibal.wire.mad.sa import SERVICE_RECORD

PROBE = Path(__file__).with_name("sa_service_probe.py")
REPO = Path(__file__).resolve().parents[2]
SA_NO_RECORDS = 0x0300  # SA MAD status 3 (ERR_NO_RECORDS) in the class-specific bits
SA_REQ_INVALID = 0x0200  # status 2 (ERR_REQ_INVALID)
LEASE = 6  # seconds: renewals every 3 s leave margin on a loaded machine


class Probe:
    """One probe process on ``node``: commands in, one JSON answer each."""

    def __init__(self, fabric: Fabric, node: str) -> None:
        env = fabric.env_for(node)
        env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
        self.node = node
        self.proc = subprocess.Popen(
            [sys.executable, str(PROBE)], env=env, cwd=fabric.workdir, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def __call__(self, timeout: float = 90.0, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"{self.node}: no answer to {cmd} in {timeout} s") from None
            if line is None:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise AssertionError(f"{self.node} probe exited: {err[-3000:]}")
            if line.startswith("{"):
                answer: dict[str, Any] = json.loads(line)
                return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def _saquery_sr(fabric: Fabric) -> str:
    r = fabric.run(["saquery", "SR"], "Peer", timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _until(what: str, check: Any, deadline_s: float) -> Any:
    """Poll ``check()`` until it returns something truthy (or fail at the deadline)."""
    deadline = time.monotonic() + deadline_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {deadline_s} s: {what}")


@pytest.mark.timeout(600)
def test_registered_service_is_found_from_another_port_and_by_saquery(
    ibsim_fabric: Fabric,
) -> None:
    fabric = ibsim_fabric
    host, peer = Probe(fabric, "Host"), Probe(fabric, "Peer")
    try:
        data = {"data8_0": 7, "data16_1": 0x1234, "data32_3": 0xDEADBEEF,
                "data64_0": 0x55, "data64_1": 0x1122334455667788}  # fmt: skip
        got = host(op="register", key="s", name="ibal-svc", service_id=0x10000000000000AB,
                   data=data)  # fmt: skip
        assert (got["status"], got["resp_status"]) == ("SUCCESS", 0), got
        mine = SERVICE_RECORD.decode(bytes.fromhex(got["record"]))
        assert int(Gid(got["gid"])) & (1 << 64) - 1 == got["port_guid"]  # Host's port GID

        by_name = peer(op="query", by="name", name="ibal-svc")
        by_id = peer(op="query", by="id", service_id=0x10000000000000AB)
        every = peer(op="query", by="all")
        for ans in (by_name, by_id, every):
            assert (ans["status"], len(ans["records"])) == ("SUCCESS", 1), ans
        (raw,) = {ans["records"][0] for ans in (by_name, by_id, every)}
        seen = SERVICE_RECORD.decode(bytes.fromhex(raw))
        assert seen["service_name"].rstrip(b"\0") == b"ibal-svc"  # type: ignore[union-attr]
        assert (seen["service_id"], seen["service_lease"], seen["service_p_key"]) == (
            0x10000000000000AB, 0xFFFFFFFF, 0xFFFF)  # fmt: skip
        assert seen["service_gid"] == mine["service_gid"]
        # OpenSM 3.3.23 on ibsim answers ServiceData64.2 as 0 whatever was Set (seen with
        # a raw umad client too): the other elements must come back as registered.
        kept = [k for k in data if k != "data64_1"]
        assert [mine[f"service_{k}"] for k in kept] == [data[k] for k in kept], got["record"]
        assert [seen[f"service_{k}"] for k in kept] == [data[k] for k in kept], raw
        # saquery, another client of the same SA, prints the very record the peer found.
        ours = dump.saquery_service_record(bytes.fromhex(raw))
        assert ours.splitlines() == _saquery_sr(fabric).splitlines()

        assert host(op="dereg", key="s") == {"deleted": "SUCCESS", "mad_status": 0}
        gone = peer(op="query", by="name", name="ibal-svc")
        assert (gone["status"], gone["mad_status"] & 0x7F00) == ("REMOTE_ERROR", SA_NO_RECORDS)
        assert peer(op="query", by="all")["records"] == []
        assert "ServiceRecord dump" not in _saquery_sr(fabric)
        # A P_Key the port does not have: OpenSM refuses the Set (ERR_REQ_INVALID).
        bad = host(op="register", key="p", name="ibal-pkey", service_id=0xC, p_key=0x1234)
        assert (bad["status"], bad["resp_status"]) == ("REMOTE_ERROR", SA_REQ_INVALID), bad
        # Closing the AL (the host process ends) deregisters what is still registered.
        assert host(op="register", key="c", name="ibal-closed", service_id=0xE)["status"] == (
            "SUCCESS")  # fmt: skip
        assert peer(op="query", by="name", name="ibal-closed")["status"] == "SUCCESS"
        host.close()
        assert host.proc.returncode == 0
        assert peer(op="query", by="name", name="ibal-closed")["status"] == "REMOTE_ERROR"
    finally:
        host.close()
        peer.close()


@pytest.mark.timeout(600)
def test_short_lease_runs_out_without_renewal_and_holds_with_it(ibsim_fabric: Fabric) -> None:
    fabric = ibsim_fabric
    host, peer = Probe(fabric, "Host"), Probe(fabric, "Peer")
    try:
        a = host(op="register", key="a", name="ibal-once", service_id=0xA, lease=LEASE,
                 renew=False)  # fmt: skip
        b = host(op="register", key="b", name="ibal-kept", service_id=0xB, lease=LEASE)
        assert a["status"] == b["status"] == "SUCCESS", (a, b)
        started = time.monotonic()

        def found(name: str) -> bool:
            ans = peer(op="query", by="name", name=name)
            assert ans["status"] in ("SUCCESS", "REMOTE_ERROR"), ans
            return ans["status"] == "SUCCESS"

        def a_gone_b_kept() -> bool:
            kept = found("ibal-kept")
            assert kept, "the renewed registration lapsed"
            return not found("ibal-once")

        _until("OpenSM dropped the unrenewed record", a_gone_b_kept, 10 * LEASE)
        assert time.monotonic() - started > LEASE / 2  # it did live for a while
        # The renewed one outlives three of its leases (each poll must still find it).
        _until("three leases passed with the record kept",
               lambda: found("ibal-kept") and time.monotonic() - started > 3 * LEASE,
               10 * LEASE)  # fmt: skip
        stats = host(op="stats", key="b")
        assert stats["stats"]["set"] >= 4 and stats["alive"], stats  # 1 + renewals every 2 s
        assert host(op="stats", key="a")["stats"]["set"] == 1
        listed = _saquery_sr(fabric)
        assert "ibal-kept" in listed and "ibal-once" not in listed
        # Deleting what the SA already dropped: ERR_NO_RECORDS, and the handle goes.
        assert host(op="dereg", key="a") == {"deleted": "REMOTE_ERROR",
                                             "mad_status": SA_NO_RECORDS}  # fmt: skip
        assert host(op="dereg", key="b") == {"deleted": "SUCCESS", "mad_status": 0}
    finally:
        host.close()
        peer.close()


@pytest.mark.timeout(600)
def test_a_new_sm_gets_the_record_again(ibsim_fabric: Fabric) -> None:
    """OpenSM keeps ServiceRecords in memory: a new SM (on another node) starts without
    them, and the registration Sets its record again on SM_CHANGE / CLIENT_REREGISTER."""
    fabric = ibsim_fabric
    host = Probe(fabric, "Host")
    peer: Probe | None = None
    try:
        got = host(op="register", key="s", name="ibal-again", service_id=0xD)
        assert got["status"] == "SUCCESS", got
        fabric.start_sm("Peer")  # the old OpenSM ends; the new one is on Peer, a new SM LID
        peer = Probe(fabric, "Peer")

        def found() -> bool:
            ans = peer(op="query", by="name", name="ibal-again")
            return bool(ans["status"] == "SUCCESS")

        _until("the new SM has the record", found, 60)
        assert host(op="stats", key="s")["stats"]["set"] >= 2
        assert "ibal-again" in _saquery_sr(fabric)
    finally:
        host.close()
        if peer is not None:
            peer.close()


@pytest.mark.timeout(600)
def test_renewals_failing_while_the_sm_is_down_are_reported_and_recover(
    ibsim_fabric: Fabric,
) -> None:
    """OpenSM stopped: the renewal times out and the callback says so (RENEW, TIMEOUT);
    OpenSM back: a later Set succeeds, the callback says so, and the record is there."""
    fabric = ibsim_fabric
    host = Probe(fabric, "Host")
    peer: Probe | None = None
    try:
        got = host(op="register", key="r", name="ibal-renewed", service_id=0xF, lease=LEASE,
                   timeout_ms=500, retry_cnt=1)  # fmt: skip
        assert got["status"] == "SUCCESS", got
        fabric.stop_sm()

        def outcomes() -> list[list[str]]:
            return list(host(op="stats", key="r")["outcomes"])

        def after_the_first() -> list[list[str]]:
            got = outcomes()
            return got if len(got) > 1 else []

        failed = _until("a renewal failed", after_the_first, 10 * LEASE)
        assert failed[:2] == [["register", "SUCCESS"], ["renew", "TIMEOUT"]], failed
        fabric.start_sm()
        back = _until("a Set succeeded again",
                      lambda: [o for o in outcomes()[2:] if o[1] == "SUCCESS"], 20 * LEASE)
        assert back[0][0] in ("renew", "reregister"), back
        peer = Probe(fabric, "Peer")
        assert peer(op="query", by="name", name="ibal-renewed")["status"] == "SUCCESS"
    finally:
        host.close()
        if peer is not None:
            peer.close()


@pytest.mark.timeout(600)
def test_ats_address_published_by_one_host_resolves_on_another(ibsim_fabric: Fabric) -> None:
    fabric = ibsim_fabric
    host, peer = Probe(fabric, "Host"), Probe(fabric, "Peer")
    try:
        assert peer(op="lookup_address", address="10.1.2.3") == {"gids": []}
        got = host(op="register_address", key="ip", address="10.1.2.3")
        assert (got["status"], got["address"]) == ("SUCCESS", "10.1.2.3"), got
        assert peer(op="lookup_address", address="10.1.2.3") == {"gids": [got["gid"]]}
        assert peer(op="lookup_address", address="10.1.2.4") == {"gids": []}
        listed = _saquery_sr(fabric)
        assert "DAPL Address Translation Service" in listed
        assert "ServiceData8.13.........0xA\n" in listed  # 10 at ServiceData8[12]
        assert host(op="dereg", key="ip")["deleted"] == "SUCCESS"
        assert peer(op="lookup_address", address="10.1.2.3") == {"gids": []}
    finally:
        host.close()
        peer.close()
