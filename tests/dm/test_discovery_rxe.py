"""IOC discovery over RoCE between two userspace rxe devices on loopback: no SA there, the
client asks the configured peer GIDs (paths from ibal.sa.roce), the same DM Gets over QP1.

The devices have addresses of their own (127.0.12.2/3: other rxe tests bind 127.0.0.x and
127.0.9.x). The AL's clock is a ManualClock; the MADs travel through the kernel's UDP, so
the loop waits for the sweep's end (a condition, briefly) before stepping the clock.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ibal.al import AccessLayer, AlManager, PnpClass, PnpEvent, PnpRec
from ibal.clock import ManualClock
from ibal.dm.agent import DmService
from ibal.dm.answer import ExportedIoc
from ibal.dm.discovery import Discovery, RocePeer, SweepHandle
from ibal.dm.iou import IoUnit, io_unit
from ibal.types import Gid, LinkLayer, PortCap, SvcEntry
from ibal.wire.mad import dm, sa

WAIT = 20.0
A, B = "127.0.12.2", "127.0.12.3"


def exported(guid: int, entries: list[tuple[str, int]]) -> ExportedIoc:
    prof = dm.IO_CONTROLLER_PROFILE.encode({
        "guid": guid, "vendor_id": 0x2C9, "io_class": 0x100, "service_entries": len(entries),
        "id_string": b"rxe ioc".ljust(64, b"\0"),
    })  # fmt: skip
    return ExportedIoc(prof, tuple((n.encode().ljust(40, b"\0"), sid) for n, sid in entries))


@dataclass
class Rxe:
    mgr: AlManager
    clock: ManualClock
    al: AccessLayer
    unit: IoUnit  # device A's I/O unit
    ports: dict[str, int]  # device address -> port GUID

    def settle(self) -> None:
        self.mgr.queues.flush(timeout=WAIT)

    def run(self, handle: SweepHandle) -> None:
        for _ in range(2000):
            self.settle()
            if handle.done or handle._done.wait(0.02):
                self.settle()
                return
            self.clock.advance(0.01, settle=self.settle)
        raise AssertionError("the sweep did not end")


@pytest.fixture
def rxe() -> Iterator[Rxe]:
    if os.geteuid() != 0:
        if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
            pytest.fail("rxe needs root (raw sockets) and IBAL_LAB_REQUIRED is set")
        pytest.skip("rxe needs root (raw sockets need CAP_NET_RAW)")
    from ibal.providers.rxe.provider import RxeProvider

    clock = ManualClock()
    mgr = AlManager(clock=clock, subsystems=False)  # the tests start discovery with their settings
    try:
        mgr.add_provider(RxeProvider({"devices": f"rxe_d0={A},rxe_d1={B}"}))
        al = mgr.open_al()
        by_name = {al.open_ca(g).name: g for g in al.get_ca_guids()}
        assert set(by_name) == {"rxe_d0", "rxe_d1"}, f"rxe registered {by_name} (addresses in use?)"
        ports = {addr: al.query_ca_by_guid(by_name[n]).ports[0].port_guid
                 for addr, n in ((A, "rxe_d0"), (B, "rxe_d1"))}  # fmt: skip
        DmService.start(mgr)
        yield Rxe(mgr, clock, al, io_unit(mgr, by_name["rxe_d0"]), ports)
    finally:
        mgr.close(timeout=WAIT)


def test_iocs_over_roce_from_the_configured_peer(
    rxe: Rxe, monkeypatch: pytest.MonkeyPatch
) -> None:
    got: list[PnpRec] = []
    lock = threading.Lock()

    def note(rec: PnpRec) -> None:
        with lock:
            got.append(rec)

    def take() -> list[tuple[str, int, int]]:
        with lock:
            out = [(r.event.name, r.guid, r.port_guid) for r in got
                   if r.event is not PnpEvent.REG_COMPLETE]  # fmt: skip
            got.clear()
            return out

    rxe.al.reg_pnp(PnpClass.IOU, note)
    rxe.al.reg_pnp(PnpClass.IOC, note)
    owner = object()
    slot = rxe.unit.take_slot(owner, exported(0xE5, [("storage", 0xE500), ("admin", 0xE501)]))
    port_a = rxe.al.query_ca_by_guid(rxe.unit.ca_guid).ports[0]
    assert port_a.link_layer is LinkLayer.ETHERNET
    assert port_a.cap & PortCap.IS_DEV_MGMT_SUPPORTED  # the agent advertises it on rxe too
    peer = Gid(f"::ffff:{A}")
    monkeypatch.setenv("IBAL_IOC_PEERS", f"{A}=rxe a")  # the peer as a user configures it
    disc = Discovery.start(rxe.mgr, interval=None, timeout=2.0, retries=3)
    assert disc.roce_peers == (RocePeer(peer, desc="rxe a"),)
    rxe.run(disc.sweep_now())
    with lock:
        recs = list(got)
    events = take()
    iou_guid = int.from_bytes(peer.packed[8:], "big")  # RoCE: the GID's interface ID
    assert events[0] == ("IOU_ADD", iou_guid, 0)
    assert ("IOC_ADD", 0xE5, 0) in events
    assert sorted(p for e, _, p in events if e == "IOC_PATH_ADD") == sorted(rxe.ports.values())
    [add] = [r for r in recs if r.event is PnpEvent.IOC_ADD]
    assert add.ioc is not None and add.ioc.slot == slot and add.ioc.iou_guid == iou_guid
    assert add.ioc.svc_entries == (SvcEntry("storage", 0xE500), SvcEntry("admin", 0xE501))
    [iou] = [r.iou for r in recs if r.event is PnpEvent.IOU_ADD]
    assert iou is not None and iou.desc == "rxe a"
    from_b = next(r for r in recs if r.event is PnpEvent.IOC_PATH_ADD
                  and r.port_guid == rxe.ports[B])  # fmt: skip
    assert from_b.path is not None
    pr = sa.PATH_RECORD.decode(from_b.path)
    assert Gid(pr["dgid"]) == peer and Gid(pr["sgid"]) == Gid(f"::ffff:{B}")
    assert disc.last_stats["malformed"] == 0

    rxe.unit.free_slot(slot, owner)  # the IOC goes; the unit still answers (no IOC in it)
    rxe.run(disc.sweep_now())
    events = take()
    assert [e for e, _, _ in events] == ["IOC_PATH_REMOVE", "IOC_PATH_REMOVE", "IOC_REMOVE"]
    assert [i.guid for i in rxe.mgr.io_devices.ious()] == [iou_guid]
