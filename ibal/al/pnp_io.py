"""The I/O device registry: IOUs, IOCs and IOC paths, as PnP events of the IOU and IOC classes.

One registry per manager (``mgr.io_devices``).  An IOC-discovery client (or a
test) reports what it found; the registry keeps it, raises the events to the
IOU and IOC registrations (ADDs in delivery order, REMOVEs in reverse) and
replays it to new registrations.  The hierarchy is kept: an IOC needs its IOU,
a path needs its IOC; an IOC's paths are removed before the IOC and an IOU's
IOCs before the IOU.  Every method runs under the manager lock and only queues
deliveries, so the registry's events are ordered with the CA and port events.

``al.reject_ioc(rec)`` (``ib_reject_ioc``) marks an IOC rejected for that AL:
its registrations get no more events for the IOC (until it is removed and
added again) and the ``on_reject`` listeners run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ibal.al import pnp, pnp_engine
from ibal.al.dispatcher import log
from ibal.al.pnp import PnpClass, PnpEvent, PnpRec, PnpRegistration
from ibal.status import InvalidHandle, InvalidParameter, NotFound
from ibal.types import Gid, IocInfo, IouInfo, is_int

if TYPE_CHECKING:
    from ibal.al.manager import AlManager
    from ibal.al.obj import AlObject

PATH_RECORD_SIZE = 64
_DGID = slice(8, 24)  # PathRecord.DGID (IBA 15.2.5.16)

RejectListener = Callable[[int, Any], object]
"""``fn(ioc_guid, al)``: an AL rejected the IOC (runs on the PnP thread, inside the callback)."""

_PathKey = tuple[int, Gid]  # (local port GUID, DGID)


def _guid(name: str, value: object) -> int:
    if not is_int(value) or not 0 <= value < 1 << 64:
        raise InvalidParameter(f"{name} must be a 64-bit GUID, not {value!r}")
    return value


def _gid(value: object) -> Gid:
    if isinstance(value, Gid):
        return value
    if isinstance(value, (bytes, bytearray)) and len(value) == 16:
        return Gid(bytes(value))
    if isinstance(value, str):
        try:
            return Gid(value)
        except ValueError:
            pass
    raise InvalidParameter(f"dgid must be a Gid or 16 bytes, not {value!r}")


class _Path:
    __slots__ = ("ca_guid", "path", "port_guid")

    def __init__(self, ca_guid: int, port_guid: int, path: bytes) -> None:
        self.ca_guid, self.port_guid, self.path = ca_guid, port_guid, path


class IoDevices:
    """What IOC discovery found, raised as IOU / IOC / IOC-path PnP events (``mgr.io_devices``)."""

    def __init__(self, mgr: AlManager) -> None:
        self._mgr = mgr
        self._lock = mgr._lock
        self._ious: dict[int, IouInfo] = {}
        self._iocs: dict[int, IocInfo] = {}
        self._paths: dict[int, dict[_PathKey, _Path]] = {}
        self._rejected: dict[int, set[AlObject]] = {}  # IOC GUID -> ALs that rejected it
        self._reject_listeners: list[RejectListener] = []

    # ------------------------------------------------------------------ views
    def ious(self) -> list[IouInfo]:
        """The I/O units reported, in the order they were added."""
        with self._lock:
            return list(self._ious.values())

    def iocs(self) -> list[IocInfo]:
        """The I/O controllers reported, in the order they were added."""
        with self._lock:
            return list(self._iocs.values())

    def ioc_paths(self, ioc_guid: int) -> list[tuple[int, int, bytes]]:
        """(CA GUID, port GUID, PathRecord) per path to ``ioc_guid``; ``NotFound`` if unknown."""
        with self._lock:
            if ioc_guid not in self._iocs:
                raise NotFound(f"no IOC 0x{ioc_guid:016x}")
            return [(p.ca_guid, p.port_guid, p.path) for p in self._paths[ioc_guid].values()]

    # ------------------------------------------------------------------ IOUs
    def add_iou(self, iou: IouInfo) -> None:
        """Report an I/O unit: ``IOU_ADD`` to IOU registrations.

        Adding the same record again does nothing; a changed record for a
        known GUID replaces the stored one without an event (IBAL has no IOU
        change event; its IOCs are reported on their own).
        """
        if not isinstance(iou, IouInfo):
            raise InvalidParameter("add_iou takes an IouInfo")
        with self._lock:
            known = iou.guid in self._ious
            self._ious[iou.guid] = iou
            if known:
                return
            for reg in self._regs(PnpClass.IOU):
                self._iou_event(reg, iou, PnpEvent.IOU_ADD)

    def remove_iou(self, guid: int) -> None:
        """The I/O unit went: its IOCs first (paths, then ``IOC_REMOVE``), then ``IOU_REMOVE``."""
        with self._lock:
            iou = self._ious.get(_guid("guid", guid))
            if iou is None:
                raise NotFound(f"no IOU 0x{guid:016x}")
            for ioc in [i for i in self._iocs.values() if i.iou_guid == guid][::-1]:
                self._drop_ioc(ioc)
            del self._ious[guid]
            for reg in reversed(self._regs(PnpClass.IOU)):
                self._iou_event(reg, iou, PnpEvent.IOU_REMOVE)

    # ------------------------------------------------------------------ IOCs
    def add_ioc(self, ioc: IocInfo) -> None:
        """Report an I/O controller of a reported IOU (``NotFound`` otherwise): ``IOC_ADD``.

        The same record again does nothing; a changed record (new service
        entries, say) is a new controller: its paths and the old one are
        removed, then it is added and its paths added again.
        """
        if not isinstance(ioc, IocInfo):
            raise InvalidParameter("add_ioc takes an IocInfo")
        with self._lock:
            if ioc.iou_guid not in self._ious:
                raise NotFound(f"IOC 0x{ioc.ioc_guid:016x}: no IOU 0x{ioc.iou_guid:016x}")
            old = self._iocs.get(ioc.ioc_guid)
            if old == ioc:
                return
            paths = list(self._paths.get(ioc.ioc_guid, {}).items())
            if old is not None:
                self._drop_ioc(old)
            self._iocs[ioc.ioc_guid] = ioc
            self._paths[ioc.ioc_guid] = dict(paths)
            regs = self._regs(PnpClass.IOC)
            for reg in regs:
                self._ioc_event(reg, ioc, PnpEvent.IOC_ADD)
            for _, p in paths:
                for reg in regs:
                    self._path_event(reg, ioc, p, PnpEvent.IOC_PATH_ADD)

    def remove_ioc(self, ioc_guid: int) -> None:
        """The I/O controller went: ``IOC_PATH_REMOVE`` per path, then ``IOC_REMOVE``."""
        with self._lock:
            ioc = self._iocs.get(_guid("ioc_guid", ioc_guid))
            if ioc is None:
                raise NotFound(f"no IOC 0x{ioc_guid:016x}")
            self._drop_ioc(ioc)

    def _drop_ioc(self, ioc: IocInfo) -> None:
        regs = self._regs(PnpClass.IOC)
        for p in reversed(list(self._paths.pop(ioc.ioc_guid, {}).values())):
            for reg in reversed(regs):
                self._path_event(reg, ioc, p, PnpEvent.IOC_PATH_REMOVE)
        del self._iocs[ioc.ioc_guid]
        for reg in reversed(regs):
            self._ioc_event(reg, ioc, PnpEvent.IOC_REMOVE)
        # ALs that rejected it see it again if it comes back (their regs drop the REMOVE).
        self._rejected.pop(ioc.ioc_guid, None)

    # ------------------------------------------------------------------ paths
    def add_ioc_path(self, ioc_guid: int, ca_guid: int, port_guid: int, path: bytes) -> None:
        """A path from local port ``port_guid`` (CA ``ca_guid``) to a known IOC: ``IOC_PATH_ADD``.

        ``path`` is the 64-byte PathRecord; a path is known by (port, DGID):
        the same one again does nothing, a changed one is removed and added.
        """
        _guid("ca_guid", ca_guid)
        _guid("port_guid", port_guid)
        if not isinstance(path, (bytes, bytearray)) or len(path) != PATH_RECORD_SIZE:
            raise InvalidParameter(f"path must be a {PATH_RECORD_SIZE}-byte PathRecord")
        entry = _Path(ca_guid, port_guid, bytes(path))
        key = (port_guid, Gid(entry.path[_DGID]))
        with self._lock:
            ioc = self._iocs.get(_guid("ioc_guid", ioc_guid))
            if ioc is None:
                raise NotFound(f"no IOC 0x{ioc_guid:016x}")
            paths = self._paths[ioc_guid]
            old = paths.get(key)
            if old is not None and (old.ca_guid, old.path) == (ca_guid, entry.path):
                return
            regs = self._regs(PnpClass.IOC)
            if old is not None:
                for reg in reversed(regs):
                    self._path_event(reg, ioc, old, PnpEvent.IOC_PATH_REMOVE)
                del paths[key]
            paths[key] = entry
            for reg in regs:
                self._path_event(reg, ioc, entry, PnpEvent.IOC_PATH_ADD)

    def remove_ioc_path(self, ioc_guid: int, port_guid: int, dgid: Gid | bytes | str) -> None:
        """The path from ``port_guid`` to the IOC at ``dgid`` went: ``IOC_PATH_REMOVE``."""
        key = (_guid("port_guid", port_guid), _gid(dgid))
        with self._lock:
            ioc = self._iocs.get(_guid("ioc_guid", ioc_guid))
            entry = self._paths.get(ioc_guid, {}).pop(key, None)
            if ioc is None or entry is None:
                raise NotFound(f"no path from port 0x{port_guid:016x} to IOC 0x{ioc_guid:016x} "
                               f"at {key[1]}")
            for reg in reversed(self._regs(PnpClass.IOC)):
                self._path_event(reg, ioc, entry, PnpEvent.IOC_PATH_REMOVE)

    # ------------------------------------------------------------------ local losses
    def port_lost(self, port_guid: int) -> None:
        """A local port left ACTIVE or went (manager lock held, before its PnP event).

        Its paths are removed, then each IOC it was the last path to: the seed's
        "a port down produces IOC_REMOVE before PORT_DOWN".  IOUs stay (an IOC
        discovery client removes or re-reports them).
        """
        for guid, paths in list(self._paths.items()):
            gone = [k for k, p in paths.items() if p.port_guid == port_guid]
            if not gone:
                continue
            ioc = self._iocs[guid]
            regs = self._regs(PnpClass.IOC)
            for k in reversed(gone):
                entry = paths.pop(k)
                for reg in reversed(regs):
                    self._path_event(reg, ioc, entry, PnpEvent.IOC_PATH_REMOVE)
            if not paths:
                self._drop_ioc(ioc)

    def ca_lost(self, ca_guid: int, port_guids: list[int]) -> None:
        """A local CA goes (manager lock held, before its PORT_REMOVEs): what was reached
        through it goes first: its ports' paths (and IOCs left without one), then the IOUs
        reported through it with their IOCs."""
        for port_guid in port_guids:
            self.port_lost(port_guid)
        for iou in [i for i in self._ious.values() if i.ca_guid == ca_guid][::-1]:
            self.remove_iou(iou.guid)

    # ------------------------------------------------------------------ rejection
    def on_reject(self, fn: RejectListener) -> None:
        """Call ``fn(ioc_guid, al)`` when an AL rejects an IOC (``al.reject_ioc``)."""
        if not callable(fn):
            raise InvalidParameter("on_reject takes a callable")
        with self._lock:
            self._reject_listeners.append(fn)

    def reject(self, al: AlObject, rec: object) -> None:
        """``ib_reject_ioc``: only inside the callback of the ``IOC_ADD`` that is ``rec``."""
        if not isinstance(rec, PnpRec):
            raise InvalidParameter("reject_ioc takes the PnpRec of an IOC_ADD callback")
        reg = rec.registration
        if (rec.event is not PnpEvent.IOC_ADD or reg is None or reg.al is not al
                or not pnp.delivering(reg, rec) or not self._mgr.queues.pnp.is_current()
                or rec.ioc is None):
            raise InvalidHandle("reject_ioc is valid only inside the callback of its IOC_ADD")
        guid = rec.ioc.ioc_guid
        key = ("ioc", guid)
        with self._lock:
            if guid in self._iocs:  # else removed meanwhile: its queued REMOVE ends this
                self._rejected.setdefault(guid, set()).add(al)
            mine = [r for r in self._mgr.pnp_regs() if r.al is al and r.pnp_class is PnpClass.IOC]
            listeners = list(self._reject_listeners)
        for r in mine:  # PnP thread: no delivery of theirs runs concurrently
            pnp.reject(r, key)
        for fn in listeners:
            try:
                fn(guid, al)
            except Exception:
                log.exception("ibal: IOC reject listener %r raised (IOC 0x%016x)", fn, guid)

    # ------------------------------------------------------------------ engine
    def _regs(self, cls: PnpClass) -> list[PnpRegistration]:
        return [r for r in pnp.ordered(self._mgr.pnp_regs()) if r.pnp_class is cls]

    def replay(self, reg: PnpRegistration) -> None:
        """The current IOUs (IOU class) or IOCs and their paths (IOC class) for a new reg."""
        if reg.pnp_class is PnpClass.IOU:
            for iou in self._ious.values():
                self._iou_event(reg, iou, PnpEvent.IOU_ADD)
        elif reg.pnp_class is PnpClass.IOC:
            for ioc in self._iocs.values():
                if reg.al in self._rejected.get(ioc.ioc_guid, ()):
                    self._mgr.queues.pnp.post(pnp.reject, reg, ("ioc", ioc.ioc_guid))
                    continue
                self._ioc_event(reg, ioc, PnpEvent.IOC_ADD)
                for p in self._paths[ioc.ioc_guid].values():
                    self._path_event(reg, ioc, p, PnpEvent.IOC_PATH_ADD)

    def _iou_event(self, reg: PnpRegistration, iou: IouInfo, event: PnpEvent) -> None:
        pnp_engine.post(reg, event, ("iou", iou.guid), guid=iou.guid, ca_guid=iou.ca_guid, iou=iou)

    def _ioc_event(self, reg: PnpRegistration, ioc: IocInfo, event: PnpEvent) -> None:
        iou = self._ious.get(ioc.iou_guid)
        ca_guid = iou.ca_guid if iou is not None else 0
        pnp_engine.post(reg, event, ("ioc", ioc.ioc_guid), guid=ioc.ioc_guid, ca_guid=ca_guid,
                        ioc=ioc)

    def _path_event(self, reg: PnpRegistration, ioc: IocInfo, p: _Path, event: PnpEvent) -> None:
        pnp_engine.post(reg, event, ("ioc", ioc.ioc_guid), guid=ioc.ioc_guid, ca_guid=p.ca_guid,
                 ioc=ioc, path=p.path, port_guid=p.port_guid)


__all__ = ["PATH_RECORD_SIZE", "IoDevices", "RejectListener"]
