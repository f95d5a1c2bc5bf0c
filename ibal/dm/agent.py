"""The device-management agent: answers the DM class (0x06) for the I/O units of local CAs.

:class:`DmService` is one per manager, process-wide (IBAL's IOU manager): an
internal AL instance, a PnP client of the PORT class (subsystem order
``PnpOrder.DM``) that keeps one :class:`PortAgent` per port, and the keeper
of each port's IsDeviceManagementSupported capability bit.  It starts on
first use (:meth:`Ioc.register <ibal.dm.ioc.Ioc.register>` starts it; h7's
discovery tests may call :meth:`DmService.start`) and lives until its
manager closes.

A :class:`PortAgent` is a MAD service of class DEV_MGT version 1 on the
port's QP1 alias, registered for unsolicited Get and Set.  Each request is
answered by :func:`ibal.dm.answer.answer` from the current
:meth:`~ibal.dm.iou.IoUnit.view` of the port's CA; a MAD it drops is counted
in :attr:`PortAgent.stats` by reason (the MAD service counts its own drops in
``agent.service.stats``).  Answers go out on the misc queue.

While the CA's I/O unit exports at least one IOC, every port of the CA
advertises IsDeviceManagementSupported (``Ca.modify``); the bit is cleared
when the last IOC goes.  A provider without ``modify_ca`` keeps answering
without the bit (``stats["cap_unsupported"]``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections import Counter
from typing import TYPE_CHECKING

from ibal.al import (
    AccessLayer,
    Ca,
    Dependent,
    PnpClass,
    PnpEvent,
    PnpOrder,
    PnpRec,
    PnpRegistration,
    StashKey,
)
from ibal.dm.answer import Drop, answer
from ibal.dm.iou import IoUnit, io_unit, units_of
from ibal.mad import MadElement, MadService, MadSvc, put_mad, reg_mad_svc
from ibal.status import IbError, InvalidCaHandle, Unsupported
from ibal.types import CaMod, PortAttrMod, PortCap, QpType
from ibal.wire.mad.consts import Method, MgmtClass
from ibal.wire.mad.dm import DM_CLASS_VERSION

if TYPE_CHECKING:
    from ibal.al import AlManager

__all__ = ["DmService", "PortAgent"]

log = logging.getLogger("ibal.dm")

_SERVICES: StashKey[DmService] = StashKey()  # in each manager's stash
_SERVICES_LOCK = threading.Lock()
_METHODS = frozenset({Method.GET, Method.SET})


class PortAgent(Dependent):
    """The DM agent of one port (see the module docstring)."""

    _kind = "DM agent"

    def __init__(self, dm: DmService, ca: Ca, port_num: int, port_guid: int) -> None:
        self.dm = dm
        self.ca = ca
        self.port_guid = port_guid
        self.unit: IoUnit = io_unit(dm.al.manager, ca.guid)
        self.stats: Counter[str] = Counter()
        pd = ca.alloc_pd()
        self._pd = pd
        try:
            alias = pd.get_spl_qp(port_guid, QpType.QP1_ALIAS)
            svc = MadSvc(MgmtClass.DEV_MGT, DM_CLASS_VERSION, self._on_recv, self._on_sent,
                         methods=_METHODS, support_unsol=True)  # fmt: skip
            self.service: MadService = reg_mad_svc(alias, svc)
            super().__init__((ca, port_num))
        except BaseException:
            with contextlib.suppress(IbError):
                pd.dealloc()
            raise

    def __repr__(self) -> str:
        return f"<PortAgent {self.ca.name} port {self.port_num} 0x{self.port_guid:016x}>"

    def _on_recv(self, e: MadElement) -> None:
        """Misc queue: one unsolicited DM request."""
        if e.request is not None:  # a response to a send of ours: the agent sends none
            self.stats["dropped_response"] += 1
            put_mad([e, e.request])
            return
        result = answer(bytes(e.mad), self.unit.view())
        if isinstance(result, Drop):
            self.stats[result.reason] += 1
            put_mad(e)
            return
        e.mad[:] = result.mad
        e.resp_expected = False
        try:
            self.service.send(e)
        except IbError as exc:
            self.stats["send_failed"] += 1
            log.warning("%r: answer not sent: %s", self, exc)
            put_mad(e)
            return
        self.stats["answered" if result.status == 0 else "answered_error"] += 1

    def _on_sent(self, e: MadElement) -> None:
        put_mad(e)

    def set_capability(self, on: bool) -> None:
        """Advertise IsDeviceManagementSupported on the port (or stop)."""
        cap = PortCap.IS_DEV_MGMT_SUPPORTED if on else PortCap.NONE
        try:
            self.ca.modify(self.port_num, CaMod.IS_DEV_MGMT_SUPPORTED, PortAttrMod(cap=cap))
        except Unsupported as exc:
            if not self.stats["cap_unsupported"]:
                log.info("%r: no capability bit (%s); the agent answers anyway", self, exc)
            self.stats["cap_unsupported"] += 1
        except IbError as exc:  # the port or CA went meanwhile
            log.info("%r: capability bit not changed: %s", self, exc)

    def set_capability_if(self, exporting: bool) -> None:
        """The new agent's bit: set if its CA's unit exports, else cleared if it is set (a
        CA withdrawn and registered again keeps the capability mask it had)."""
        if exporting:
            self.set_capability(True)
            return
        try:
            stale = self.ca.query_port(self.port_num).cap & PortCap.IS_DEV_MGMT_SUPPORTED
        except IbError:
            return  # the port went meanwhile
        if stale:
            self.set_capability(False)

    def cleanup(self) -> None:
        with contextlib.suppress(IbError):
            self._pd.dealloc()


class DmService:
    """The DM agents of one manager (see the module docstring)."""

    def __init__(self, mgr: AlManager) -> None:
        self.al: AccessLayer = mgr.open_al()
        self._lock = threading.RLock()
        self._cas: dict[int, Ca] = {}
        self._agents: dict[int, PortAgent] = {}  # port GUID -> agent
        self._watched: weakref.WeakSet[IoUnit] = weakref.WeakSet()
        self._pnp: PnpRegistration | None = None

    @classmethod
    def start(cls, mgr: AlManager) -> DmService:
        """The manager's DM service, started on first call (the PnP replay delivered
        before it returns, except from a PnP callback, where it follows)."""
        with _SERVICES_LOCK:
            svc = mgr.stash.get(_SERVICES, None)
            if svc is not None and not svc.al.closed:
                return svc
            svc = cls(mgr)
            mgr.stash[_SERVICES] = svc
        for unit in units_of(mgr):
            svc.watch(unit)
        sync = not mgr.queues.pnp.is_current()
        flags = PnpClass.FLAG_REG_SYNC if sync else PnpClass(0)
        svc._pnp = svc.al.reg_pnp(PnpClass.PORT | flags, svc._on_pnp, order=PnpOrder.DM)
        return svc

    @classmethod
    def of(cls, mgr: AlManager) -> DmService | None:
        """The manager's running DM service, if started."""
        with _SERVICES_LOCK:
            svc = mgr.stash.get(_SERVICES, None)
        return svc if svc is not None and not svc.al.closed else None

    def agent(self, port_guid: int) -> PortAgent | None:
        """The agent of the local port ``port_guid``."""
        with self._lock:
            a = self._agents.get(port_guid)
        return a if a is not None and a.alive else None

    @property
    def agents(self) -> list[PortAgent]:
        with self._lock:
            return [a for a in self._agents.values() if a.alive]

    def watch(self, unit: IoUnit) -> None:
        """Follow ``unit``'s exports (capability bits); once per unit."""
        with self._lock:
            if unit in self._watched:
                return
            self._watched.add(unit)
        unit.add_listener(self._on_export)

    def _on_export(self, unit: IoUnit, exporting: bool) -> None:
        for a in self.agents:
            if a.ca.guid == unit.ca_guid:
                a.set_capability(exporting)

    # ------------------------------------------------------------------ PnP
    def _ca(self, ca_guid: int) -> Ca:
        ca = self._cas.get(ca_guid)
        if ca is not None:
            try:
                ca.query()
                return ca
            except InvalidCaHandle:
                pass  # closed with its CA: a CA of the same GUID came back
        ca = self._cas[ca_guid] = self.al.open_ca(ca_guid)
        return ca

    def _on_pnp(self, rec: PnpRec) -> None:
        """PnP queue: an agent per port added, gone with the port."""
        if rec.event is PnpEvent.PORT_ADD and rec.port_attr is not None:
            try:
                with self._lock:
                    ca = self._ca(rec.ca_guid)
                    agent = PortAgent(self, ca, rec.port_attr.port_num, rec.guid)
                    self._agents[rec.guid] = agent
            except IbError as exc:
                log.warning("no DM agent on port 0x%016x: %s", rec.guid, exc)
                return
            rec.context = agent
            self.watch(agent.unit)
            agent.unit.apply(agent.set_capability_if)
        elif rec.event is PnpEvent.PORT_REMOVE:
            with self._lock:
                gone = self._agents.pop(rec.guid, None)
                ca = None
                if not any(a.ca.guid == rec.ca_guid for a in self._agents.values()):
                    ca = self._cas.pop(rec.ca_guid, None)  # its last port: let the handle go
            if gone is not None and gone.alive:
                with contextlib.suppress(IbError):
                    gone.destroy()
            if ca is not None:
                with contextlib.suppress(IbError):  # closed already if the CA went
                    ca.close()
