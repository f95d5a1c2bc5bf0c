"""``AccessLayer``: one ``ib_open_al`` instance, the root of its own object tree."""

from __future__ import annotations

import threading
from collections.abc import Callable
from ipaddress import AddressValueError
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ibal.al import pnp, pnp_engine
from ibal.al.ca import Ca
from ibal.al.cica import CiCa
from ibal.al.obj import READY, AlObject
from ibal.al.pnp import DeviceAttrMask, PnpCallback, PnpClass, PnpOrder, PnpRec, PnpRegistration
from ibal.al.timer import TimerScope
from ibal.status import (
    InvalidAlHandle,
    InvalidGuid,
    InvalidHandle,
    InvalidIndex,
    InvalidParameter,
    InvalidSetting,
    InvalidState,
    NoMatch,
    NotFound,
)
from ibal.types import IB_ANY_INDEX, AsyncEventRec, CaAttr, Gid, LinkState, PortAttr

if TYPE_CHECKING:
    from ibal.al.manager import AlManager

EventCallback = Callable[[AsyncEventRec], object]


def _gid(gid: object) -> Gid:
    try:
        return gid if isinstance(gid, Gid) else Gid(gid)
    except (AddressValueError, ValueError, TypeError):
        raise InvalidParameter(f"{gid!r} is not a GID") from None


class AccessLayer(AlObject):
    """An open access layer: CAs, PnP registrations and everything below them.

    ``close()`` (``ib_close_al``) destroys every resource opened through it
    and blocks until every callback for them has returned.
    """

    _invalid = InvalidAlHandle
    _rank = 100
    _kind = "AL"

    def __init__(self, mgr: AlManager) -> None:
        super().__init__(None, mgr=mgr)
        self._owns_manager = False
        self._timers = mgr.timers.scope()

    @property
    def timers(self) -> TimerScope:
        """This instance's timers (:mod:`ibal.al.timer`): ``close()`` cancels them."""
        return self._timers

    def _on_destroying(self) -> None:
        self._timers.close()

    @property
    def closed(self) -> bool:
        return self._state is not READY

    def __enter__(self) -> AccessLayer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.closed:
            self.close()

    def close(self, *, timeout: float | None = None) -> None:
        """``ib_close_al``: blocks until everything is destroyed and every callback returned.

        Allowed in a callback of another AL instance, or of nothing this AL
        owns, off the teardown queue; otherwise (it would wait for itself) it
        raises ``InvalidState``.  A second close raises ``InvalidAlHandle``.
        """
        if self._owns_manager and self._mgr.queues.is_current():
            raise InvalidState("closing an AL that owns its manager from its callback deadlocks")
        self._destroy(None, True, timeout)
        if self._owns_manager:
            self._mgr.close()

    async def destroy_async(self) -> None:
        """``await`` the close (run in a worker thread: ``close`` blocks)."""
        import asyncio

        await asyncio.to_thread(self.close)

    def _unlink(self) -> None:
        self._mgr.forget_al(self)

    # ------------------------------------------------------------------ CAs
    def _cicas(self) -> list[CiCa]:
        with self._lock:
            return self._mgr.live_cas()

    def _cica(self, guid: object) -> CiCa:
        if not isinstance(guid, int) or isinstance(guid, bool):
            raise InvalidParameter(f"a CA GUID is an int, not {type(guid).__name__}")
        cica = self._mgr.find_ca(guid)
        if cica is None:
            raise InvalidGuid(f"no CA with GUID 0x{guid:x}")
        return cica

    def get_ca_guids(self) -> list[int]:
        """``ib_get_ca_guids``: every registered CA, in registration order."""
        self._check()
        return [c.guid for c in self._cicas()]

    def open_ca(
        self, guid: int, *, event_cb: EventCallback | None = None, context: Any = None
    ) -> Ca:
        """``ib_open_ca``: ``event_cb(AsyncEventRec)`` gets CA and port events with ``context``."""
        self._check()
        if event_cb is not None and not callable(event_cb):
            raise InvalidParameter("event_cb must be callable")
        with self._lock:
            cica = self._cica(guid)
            ca = Ca(self, cica, event_cb, context)
            ca._attach()
            cica.cas[ca] = None
        ca._activate(InvalidAlHandle)
        return ca

    def query_ca_by_guid(self, guid: int) -> CaAttr:
        """``ib_query_ca_by_guid``."""
        self._check()
        cica = self._cica(guid)
        try:
            return cica.ci.query_ca(cica.h_ca)
        except InvalidHandle:
            if cica.removing:  # withdrawn while we asked
                raise InvalidGuid(f"no CA with GUID 0x{guid:x}") from None
            raise

    def _ports(self) -> list[tuple[CiCa, PortAttr]]:
        """Every port of every CA, freshly queried (a CA withdrawn meanwhile is skipped)."""
        out: list[tuple[CiCa, PortAttr]] = []
        for cica in self._cicas():
            try:
                attr = cica.ci.query_ca(cica.h_ca)
            except InvalidHandle:
                if cica.removing:
                    continue
                raise
            out.extend((cica, p) for p in attr.ports)
        return out

    def get_ca_by_gid(self, gid: Gid) -> int:
        """``ib_get_ca_by_gid``: the GUID of the CA one of whose ports has ``gid``."""
        self._check()
        want = _gid(gid)
        for cica, port in self._ports():
            if want in port.gids:
                return cica.guid
        raise NotFound(f"no local port has GID {want}")

    def get_port_by_gid(self, gid: Gid) -> int:
        """``ib_get_port_by_gid``: the GUID of the port that has ``gid``."""
        self._check()
        want = _gid(gid)
        for _, port in self._ports():
            if want in port.gids:
                return port.port_guid
        raise NotFound(f"no local port has GID {want}")

    def get_guid(self, index: int, device_type: str, attr_mask: int = 0) -> int:
        """``ib_get_guid``: the ``index``-th CA or port GUID (``IB_ANY_INDEX``: the first match).

        ``attr_mask`` ``DeviceAttrMask.PORT_ACTIVE`` matches active ports only.
        """
        self._check()
        if device_type not in ("ca", "port"):
            raise InvalidSetting(f"device_type is 'ca' or 'port', not {device_type!r}")
        if not isinstance(index, int) or (index < 0 and index != IB_ANY_INDEX):
            raise InvalidParameter(f"bad index {index!r}")
        if not isinstance(attr_mask, int) or int(attr_mask) & ~int(DeviceAttrMask.PORT_ACTIVE):
            raise InvalidParameter(f"bad attr_mask {attr_mask!r}")
        want_active = device_type == "port" and bool(attr_mask & DeviceAttrMask.PORT_ACTIVE)
        devices: list[tuple[int, bool]]
        if device_type == "ca":
            devices = [(c.guid, True) for c in self._cicas()]
        else:
            devices = [
                (p.port_guid, not want_active or p.link_state is LinkState.ACTIVE)
                for _, p in self._ports()
            ]
        if index == IB_ANY_INDEX:
            for guid, ok in devices:
                if ok:
                    return guid
            raise NoMatch(f"no {device_type} matches")
        if index >= len(devices):
            raise InvalidIndex(f"there are {len(devices)} {device_type}s")
        guid, ok = devices[index]
        if not ok:
            raise NoMatch(f"{device_type} {index} does not match the attributes")
        return guid

    # ------------------------------------------------------------------ PnP
    def reg_pnp(
        self,
        pnp_class: PnpClass | int,
        callback: PnpCallback,
        context: Any = None,
        *,
        order: PnpOrder = PnpOrder.USER,
    ) -> PnpRegistration:
        """``ib_reg_pnp``: replay the current state, then ``REG_COMPLETE``, then live events.

        With ``PnpClass.FLAG_REG_SYNC`` it returns after the replay was delivered
        (``InvalidState`` from a PnP callback: that queue would wait for itself).
        ``order`` places a subsystem client before the user clients: ADDs go
        by (order, registration time), REMOVEs in the reverse of that.
        """
        self._check()
        cls_bits, flags = pnp.parse_class(pnp_class)
        if not callable(callback):
            raise InvalidParameter("callback must be callable")
        if not isinstance(order, PnpOrder):
            raise InvalidParameter(f"order must be a PnpOrder, not {order!r}")
        sync = bool(flags & PnpClass.FLAG_REG_SYNC)
        if sync and self._mgr.queues.pnp.is_current():
            raise InvalidState("a synchronous reg_pnp inside a PnP callback would deadlock")
        # the subsystems serving this class first, so the replay includes what they report
        self._mgr.subsystems.start_for(cls_bits)
        reg = PnpRegistration(self._mgr, self, cls_bits, callback, context, order)
        done = threading.Event() if sync else None
        with self._lock:
            reg._attach()
            self._mgr.add_pnp_reg(reg)
            pnp_engine.replay(reg, self._mgr.live_cas(), done)
        reg._activate(InvalidAlHandle)
        if done is not None:
            done.wait()
        return reg

    def reject_ioc(self, rec: PnpRec) -> None:
        """``ib_reject_ioc``: refuse the IOC of the ``IOC_ADD`` callback running with ``rec``.

        This AL's registrations get no more events for the IOC (until it is
        removed and reported again); the registry's ``on_reject`` listeners
        run before this returns.  ``InvalidHandle`` outside that callback or
        for another AL's record, ``InvalidParameter`` for a non-record.
        """
        self._check()
        self._mgr.io_devices.reject(self, rec)


def hand_over_manager(al: AccessLayer) -> None:
    """``al`` owns its manager: closing it closes the manager (``ibal.open_al``'s AL)."""
    al._owns_manager = True
