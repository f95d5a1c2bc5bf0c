"""Helpers of the IOC-discovery tests: a mock fabric of three CAs under one manager on a
ManualClock, the DM agent started, CA 1's I/O unit exporting what a test puts in it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from ibal.al import AccessLayer, AlManager, PnpRec
from ibal.clock import ManualClock
from ibal.dm.agent import DmService
from ibal.dm.answer import ExportedIoc
from ibal.dm.discovery import Discovery, SweepHandle
from ibal.dm.iou import IoUnit, io_unit
from ibal.providers.mock import MockFabric, MockProvider
from ibal.wire.mad import dm

WAIT = 10.0


def exported(guid: int, entries: list[tuple[str, int]], name: str = "ctl") -> ExportedIoc:
    prof = dm.IO_CONTROLLER_PROFILE.encode({
        "guid": guid, "vendor_id": 0x2C9, "device_id": 0x7, "io_class": 0x100,
        "protocol": 0x108, "service_entries": len(entries),
        "id_string": name.encode().ljust(64, b"\0"),
    })  # fmt: skip
    return ExportedIoc(prof, tuple((n.encode().ljust(40, b"\0"), sid) for n, sid in entries))


@dataclass
class Events:
    log: list[tuple[str, int, int]] = field(default_factory=list)  # (event, guid, port_guid)
    recs: list[PnpRec] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, rec: PnpRec) -> None:
        with self.lock:
            self.recs.append(rec)
            self.log.append((rec.event.name, rec.guid, rec.port_guid))

    def take(self) -> list[tuple[str, int, int]]:
        with self.lock:
            out, self.log = self.log, []
            return out


@dataclass
class World:
    fabric: MockFabric
    mgr: AlManager
    clock: ManualClock
    user: AccessLayer
    unit: IoUnit
    iou_guid: int
    ports: list[int]  # every local port GUID

    def settle(self) -> None:
        self.mgr.queues.flush(timeout=WAIT)

    def run(self, handle: SweepHandle) -> None:
        """Step the clock until the sweep ended (answers need no time; time-outs do)."""
        for _ in range(400):
            self.settle()
            if handle.done:
                return
            self.clock.advance(0.05, settle=self.settle)
        raise AssertionError("the sweep did not end")

    def quiet(self, disc: Discovery) -> None:
        """Sweep until no sweep is running or asked for (ports announce themselves as PnP
        events, each asking for one): what is reported then is the fabric's state."""
        self.run(disc.sweep_now())
        for _ in range(20):
            self.settle()
            if disc.idle:
                return
            self.run(disc.sweep_now())
        raise AssertionError("the sweeps did not settle")


def make_world() -> Iterator[World]:
    clock = ManualClock()
    fabric = MockFabric(seed=3)
    for i in range(3):
        fabric.add_ca(description=f"host{i}")
    fabric.use_clock(clock)
    mgr = AlManager(clock=clock, subsystems=False)  # the tests start discovery with their settings
    try:
        mgr.add_provider(MockProvider({"fabric": fabric}))
        user = mgr.open_al()
        guids = user.get_ca_guids()
        DmService.start(mgr)
        ports = [user.query_ca_by_guid(g).ports[0].port_guid for g in guids]
        yield World(fabric, mgr, clock, user, io_unit(mgr, guids[1]), guids[1], ports)
    finally:
        mgr.close(timeout=WAIT)
        fabric.close()


