"""An example channel driver: attaches to every I/O controller IOC discovery finds.

It registers for IOC events (``reg_pnp(PnpClass.IOC)``).  For each IOC it
attaches once, on the IOC's first path (``IOC_PATH_ADD``: the path says which
local CA and port reach the IOC): it opens that CA, makes a PD, a CQ and an
RC QP initialised on the local port, and logs the IOC's service entries (a
real driver would connect to one of them with the CM along the path).  On
``IOC_REMOVE`` it detaches: the QP, CQ, PD and CA handle go.  The per-IOC
state travels in ``rec.context``, which the access layer presents again with
every later event of the same IOC.

Run it against the mock fabric (an IOC exported on one CA, found from the
others)::

    python3 examples/ioc_channel_driver.py
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ibal.al import AccessLayer, Ca, Cq, Pd, PnpClass, PnpEvent, PnpRec, Qp, QpCreate
from ibal.wire.mad.sa import PATH_RECORD
from ibal.types import AccessFlags, QpMod, QpState, QpType

log = logging.getLogger("ioc_channel_driver")


@dataclass
class Attachment:
    """What the driver holds for one IOC."""

    ioc_guid: int
    ca: Ca
    pd: Pd
    cq: Cq
    qp: Qp
    dlid: int
    services: list[str] = field(default_factory=list)

    def detach(self) -> None:
        """Let go of the IOC: the QP first, then what it used (destroys run asynchronously)."""
        self.qp.destroy()
        self.cq.destroy()
        self.pd.dealloc()
        self.ca.close()


class ChannelDriver:
    """Attaches to every IOC (see the module docstring); ``attached`` maps IOC GUID to it."""

    def __init__(self, al: AccessLayer) -> None:
        self.al = al
        self.attached: dict[int, Attachment] = {}
        self.journal: list[str] = []  # what it did, in order (the tests read it)
        self.reg = al.reg_pnp(PnpClass.IOC, self._on_event)

    def close(self) -> None:
        self.reg.dereg()
        for a in list(self.attached.values()):
            a.detach()
        self.attached.clear()

    def _note(self, text: str) -> None:
        self.journal.append(text)
        log.info("%s", text)

    def _on_event(self, rec: PnpRec) -> Any:
        """PnP thread: one IOC event; returns the context kept for the IOC."""
        if rec.event is PnpEvent.IOC_PATH_ADD and rec.context is None and rec.ioc is not None:
            return self._attach(rec)
        if rec.event is PnpEvent.IOC_REMOVE and isinstance(rec.context, Attachment):
            a = rec.context
            a.detach()
            del self.attached[a.ioc_guid]
            self._note(f"detached 0x{a.ioc_guid:x}")
        return None

    def _attach(self, rec: PnpRec) -> None:
        assert rec.ioc is not None and rec.path is not None
        ca = self.al.open_ca(rec.ca_guid)
        port = next(p for p in ca.query().ports if p.port_guid == rec.port_guid)
        pd = ca.alloc_pd()
        cq = ca.create_cq(16)
        qp = pd.create_qp(QpCreate(QpType.RC, cq, cq))
        qp.modify(QpMod(QpState.INIT, port_num=port.port_num, pkey_index=0,
                        access=AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_READ))  # fmt: skip
        path = PATH_RECORD.decode(rec.path)
        a = Attachment(rec.ioc.ioc_guid, ca, pd, cq, qp, int(path["dlid"]))
        a.services = [f"{e.name}=0x{e.id:x}" for e in rec.ioc.svc_entries]
        self.attached[a.ioc_guid] = a
        rec.context = a
        self._note(f"attached 0x{a.ioc_guid:x} {rec.ioc.profile.id_string!r} via port "
                   f"{port.port_num} of {ca.name} to LID {a.dlid}: {', '.join(a.services)}")


def main() -> None:
    """The demo: three mock CAs, two IOCs exported on one, found from the others."""
    from ibal.al import AlManager
    from ibal.dm.agent import DmService
    from ibal.dm.discovery import Discovery
    from ibal.dm.ioc import create_ioc
    from ibal.providers.mock import MockFabric, MockProvider
    from ibal.types import IocProfile, SvcEntry

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    fabric = MockFabric(seed=1)
    for i in range(3):
        fabric.add_ca(description=f"host{i}")
    mgr = AlManager()
    try:
        mgr.add_provider(MockProvider({"fabric": fabric}))
        target_al = mgr.open_al()
        DmService.start(mgr)
        ca = target_al.open_ca(target_al.get_ca_guids()[1])
        ioc = create_ioc(ca, IocProfile(ioc_guid=0x5A, io_class=0x100, id_string="disk array"))
        ioc.add_svc_entry(SvcEntry("SRP.T10:disk0", 0x0002C90200405A00))
        ioc.register()
        driver = ChannelDriver(mgr.open_al())
        Discovery.start(mgr).sweep_now().wait(30)
        mgr.queues.flush(timeout=30)
        ioc.destroy()
        Discovery.start(mgr).sweep_now().wait(30)
        mgr.queues.flush(timeout=30)
        driver.close()
    finally:
        mgr.close(timeout=30)
        fabric.close()


if __name__ == "__main__":
    main()
