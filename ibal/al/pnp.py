"""Plug and Play: ``ib_reg_pnp`` classes, events, records and the registration handle.

A registration names one class (CA, PORT, IOU or IOC).  On registration the
current state is replayed, then ``REG_COMPLETE``; live events follow.  ADD
events reach registrations in (:class:`PnpOrder`, registration) order, REMOVE
events in the reverse.  Every delivery is queued on the manager's PnP queue
under the manager lock, so the order is global and a registration never sees a
live event before its replay.  :mod:`ibal.al.pnp_engine` decides which events
a CA or port change makes (and coalesces port changes); :mod:`ibal.al.pnp_io`
holds the I/O units and controllers.  See docs/pnp.md.

The callback gets a :class:`PnpRec`.  Returning ``None``/``True``/
``Status.SUCCESS`` keeps the device (and ``rec.context``, which later events
for the same device present again); anything else means "no more events for
this device" (IBAL's non-``IB_SUCCESS`` return).  ``dereg()`` is a fence: once
it returns, no callback for the registration runs or will run.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ibal.al.dispatcher import log
from ibal.al.obj import DESTROYED, SYNC_DESTROY, AlObject, DestroyCallback, SyncDestroy
from ibal.status import InvalidHandle, InvalidParameter, Status, Timeout
from ibal.types import CaAttr, IocInfo, IouInfo, LinkState, PortAttr

if TYPE_CHECKING:
    from ibal.al.manager import AlManager


class PnpClass(enum.IntFlag):
    """``ib_pnp_class_t``: one class per registration, plus flags."""

    CA = 0x00000001
    PORT = 0x00000002
    IOU = 0x00000004
    IOC = 0x00000008
    FLAG_REG_SYNC = 0x40000000
    FLAG_REG_COMPLETE = 0x80000000


PNP_CLASS_MASK = 0x000000FF
PNP_FLAG_MASK = 0xF0000000


class PnpEventBit(enum.IntFlag):
    """The bits ``ib_pnp_event_t`` values are made of (with a class bit)."""

    PATH = 0x00000800
    ADD = 0x00001000
    REMOVE = 0x00002000
    CHANGE = 0x00004000
    INIT = 0x00008000
    ARMED = 0x00010000
    ACTIVE = 0x00020000
    DOWN = 0x00040000
    PKEY = 0x00080000
    SM = 0x00100000
    GID = 0x00200000
    LID = 0x00400000
    SUBNET = 0x00800000
    CLIENT_REREGISTER = 0x01000000  # ibal: not in ib_al.h


class PnpEvent(enum.IntEnum):
    """``ib_pnp_event_t`` with IBAL's composite values."""

    CA_ADD = 0x00001001
    CA_REMOVE = 0x00002001
    PORT_ADD = 0x00001002
    PORT_REMOVE = 0x00002002
    PORT_INIT = 0x00008002
    PORT_ARMED = 0x00010002
    PORT_ACTIVE = 0x00020002
    PORT_DOWN = 0x00040002
    PKEY_CHANGE = 0x00080002
    SM_CHANGE = 0x00100002
    GID_CHANGE = 0x00200002
    LID_CHANGE = 0x00400002
    SUBNET_TIMEOUT_CHANGE = 0x00800002
    CLIENT_REREGISTER = 0x01000002
    """ibal's addition: the SM asked this port's clients to re-register (re-join
    multicast groups, renew subscriptions); the port attributes did not change."""
    IOU_ADD = 0x00001004
    IOU_REMOVE = 0x00002004
    IOC_ADD = 0x00001008
    IOC_REMOVE = 0x00002008
    IOC_PATH_ADD = 0x00001808
    IOC_PATH_REMOVE = 0x00002808
    REG_COMPLETE = 0x80000000

    @property
    def is_add(self) -> bool:
        return bool(self & PnpEventBit.ADD) and self is not PnpEvent.REG_COMPLETE

    @property
    def is_remove(self) -> bool:
        return bool(self & PnpEventBit.REMOVE) and self is not PnpEvent.REG_COMPLETE


class PnpOrder(enum.IntEnum):
    """Where a registration sits in delivery order (``reg_pnp(..., order=)``).

    Deliveries go by (order, registration sequence): a subsystem client sees
    an ADD before every user client and a REMOVE after every user client,
    whatever the time it registered.  ibal's addition (IBAL starts its
    subsystems before any client instead).
    """

    MAD = 10
    SA = 20
    CM = 30
    DM = 40
    USER = 100


_DEVICE_REMOVES = frozenset({PnpEvent.CA_REMOVE, PnpEvent.PORT_REMOVE, PnpEvent.IOU_REMOVE,
                             PnpEvent.IOC_REMOVE})


class DeviceAttrMask(enum.IntFlag):
    """``ib_device_attr_mask_t`` for ``get_guid``."""

    NONE = 0
    PORT_ACTIVE = 0x1


@dataclass
class PnpRec:
    """``ib_pnp_rec_t`` (with the CA and port subtypes folded in).

    ``context`` is the per-device context: ``None`` on the first event for a
    device; what the callback stores in it is presented with later events for
    the same device, until the device is removed.
    """

    event: PnpEvent
    pnp_context: Any
    context: Any = None
    guid: int = 0
    ca_guid: int = 0
    ca_attr: CaAttr | None = None
    port_attr: PortAttr | None = None
    registration: PnpRegistration | None = None
    iou: IouInfo | None = None
    """IOU events: the I/O unit (``ib_pnp_iou_rec_t``'s fields)."""
    ioc: IocInfo | None = None
    """IOC_ADD / IOC_REMOVE and the path events: the controller, its IOU and service entries."""
    path: bytes | None = None
    """IOC path events: the 64-byte PathRecord (``ib_path_rec_t``) to the IOC."""
    port_guid: int = 0
    """IOC path events: the local port the path starts at (``ca_guid`` is its CA)."""

    @property
    def h_pnp(self) -> PnpRegistration | None:
        """IBAL's name for :attr:`registration`."""
        return self.registration


PnpCallback = Callable[[PnpRec], object]

_LINK_EVENT = {
    LinkState.DOWN: PnpEvent.PORT_DOWN,
    LinkState.INIT: PnpEvent.PORT_INIT,
    LinkState.ARMED: PnpEvent.PORT_ARMED,
    LinkState.ACTIVE: PnpEvent.PORT_ACTIVE,
    LinkState.ACT_DEFER: PnpEvent.PORT_ACTIVE,
}


def port_state_event(port: PortAttr) -> PnpEvent:
    """The PnP event that states ``port``'s link state."""
    return _LINK_EVENT.get(port.link_state, PnpEvent.PORT_DOWN)


def _accepted(result: object) -> bool:
    """IBAL's "callback returned IB_SUCCESS"."""
    if result is None or result is True:
        return True
    if isinstance(result, Status):
        return result is Status.SUCCESS
    return type(result) is int and result == 0


DeviceKey = tuple[str, int]
"""What a per-device context is kept under: ("ca" | "port" | "iou" | "ioc", GUID)."""


_STATES = frozenset({PnpEvent.PORT_DOWN, PnpEvent.PORT_INIT, PnpEvent.PORT_ARMED,
                     PnpEvent.PORT_ACTIVE})
_COALESCED = _STATES | {PnpEvent.PKEY_CHANGE, PnpEvent.SM_CHANGE, PnpEvent.GID_CHANGE,
                        PnpEvent.LID_CHANGE, PnpEvent.SUBNET_TIMEOUT_CHANGE}
"""Port changes a slow registration gets only the latest of (``post_event``)."""


class PnpRegistration(AlObject):
    """``ib_reg_pnp``'s handle; ``dereg()`` is ``ib_dereg_pnp``."""

    _invalid = InvalidHandle
    _rank = 1  # torn down before anything else of its AL: no PnP during a close
    _kind = "PnP registration"

    def __init__(
        self,
        mgr: AlManager,
        al: AlObject,
        pnp_class: PnpClass,
        callback: PnpCallback,
        context: Any,
        order: PnpOrder = PnpOrder.USER,
    ) -> None:
        super().__init__(al, context)
        self.pnp_class = pnp_class
        self.order = order
        self.al = al
        self._callback = callback
        self._dev_ctx: dict[DeviceKey, Any] = {}
        self._rejected: set[DeviceKey] = set()
        self._current: PnpRec | None = None  # the record of the callback running, if any
        # Port changes posted but not yet started, per port: event -> record fields.
        self._pending: dict[DeviceKey, dict[PnpEvent, dict[str, Any]]] = {}

    def post_event(self, event: PnpEvent, key: DeviceKey | None, fields: dict[str, Any]) -> None:
        """Queue ``event`` for this registration (``fields`` are :class:`PnpRec` fields).

        The caller holds the manager lock.  Port changes coalesce: while the
        registration has changes of a port queued and not started, a newer change
        of the same kind replaces the older one (a newer link state replaces any
        older state) and moves to the end, so a slow client sees each kind once,
        with the latest attributes.  Any other event for the port closes the
        batch, so ADD/REMOVE order is untouched.
        """
        queue = self._mgr.queues.pnp
        if key is None or event not in _COALESCED:
            if key is None:  # REG_COMPLETE: no live change may move before it
                self._pending.clear()
            else:
                self._pending.pop(key, None)
            queue.post(self._deliver, event, key, fields)
            return
        changes = self._pending.get(key)
        if changes is None:
            changes = self._pending[key] = {event: fields}
            queue.post(self._deliver_changes, key, changes)
            return
        replaced = [e for e in changes if e is event or (event in _STATES and e in _STATES)]
        for e in replaced:
            del changes[e]
        changes[event] = fields
        self._mgr.pnp_coalesced += len(replaced)

    def dereg(
        self,
        destroy_cb: DestroyCallback | SyncDestroy | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """``ib_dereg_pnp``.

        Without ``destroy_cb`` it is a fence: when it returns no callback of
        the registration runs or will run (from a PnP callback that holds by
        construction, PnP callbacks running one at a time; from any other
        thread it waits out a callback running).  With ``destroy_cb`` it is
        asynchronous: it returns at once and ``destroy_cb(context)`` runs after
        the last callback (the fence); ``wait=True`` (or ``SYNC_DESTROY``) also
        waits for that.  ``await reg.destroy_async()`` is the awaitable form.
        """
        if isinstance(destroy_cb, SyncDestroy):
            destroy_cb, wait = None, True
        self._destroy(destroy_cb, wait, timeout)
        if wait or destroy_cb is not None or self._mgr.queues.pnp.is_current():
            return
        # Queued callbacks are dropped (destroying); wait out the one running, if any.
        with self._lock:
            if not self._mgr.cond.wait_for(lambda: self._state is DESTROYED, timeout):
                raise Timeout(f"PnP callback still running after {timeout} s")

    def _unlink(self) -> None:
        self._mgr.drop_pnp_reg(self)

    def _finish(self) -> None:
        super()._finish()
        with self._lock:
            self._mgr.cond.notify_all()

    def _reject(self, key: DeviceKey) -> None:
        """No more events for ``key`` until it is removed (PnP queue)."""
        self._rejected.add(key)
        self._dev_ctx.pop(key, None)

    # ------------------------------------------------------------------ delivery
    def _deliver_changes(self, key: DeviceKey, changes: dict[PnpEvent, dict[str, Any]]) -> None:
        """PnP-queue task: the port changes coalesced for ``key``, latest state last."""
        with self._lock:
            if self._pending.get(key) is changes:
                del self._pending[key]  # closed: later changes start a new batch
            items = list(changes.items())
        for event, fields in items:
            self._deliver(event, key, fields)

    def _deliver(self, event: PnpEvent, key: DeviceKey | None, fields: dict[str, Any]) -> None:
        """PnP-queue task: one event to this registration."""
        if key is not None and key in self._rejected:
            if event in _DEVICE_REMOVES:
                self._rejected.discard(key)
            return
        if not self._enter():
            return
        try:
            rec = PnpRec(
                event=event,
                pnp_context=self._context,
                context=self._dev_ctx.get(key) if key is not None else None,
                registration=self,
                **fields,
            )
            self._current = rec
            try:
                result = self._callback(rec)
            except Exception:
                # One client's bug must not stop the others; its device stays accepted.
                self._mgr.pnp_callback_errors += 1
                log.exception("ibal: PnP callback %r of %r raised on %s (guid 0x%016x, ca 0x%016x)",
                              self._callback, self, rec.event.name, rec.guid, rec.ca_guid)
                result = None
            finally:
                self._current = None
            if key is None:
                return
            if event in _DEVICE_REMOVES:
                self._dev_ctx.pop(key, None)
            elif key in self._rejected:  # reject_ioc from inside the callback
                return
            elif event.is_remove or _accepted(result):  # a path went: the IOC stays
                self._dev_ctx[key] = rec.context
            else:
                self._reject(key)
        finally:
            self._leave()


def ordered(regs: Iterable[PnpRegistration]) -> list[PnpRegistration]:
    """``regs`` (in registration order) in delivery order: by ``order``, then registration."""
    return sorted(regs, key=lambda r: r.order)


def parse_class(pnp_class: object) -> tuple[PnpClass, PnpClass]:
    """Split ``pnp_class`` into (class, flags); ``InvalidParameter`` unless exactly one class."""
    if not isinstance(pnp_class, int) or isinstance(pnp_class, bool):
        raise InvalidParameter("pnp_class must be a PnpClass")
    value = int(pnp_class)
    known = PNP_CLASS_MASK | PNP_FLAG_MASK
    if value & ~known & 0xFFFFFFFF or value < 0:
        raise InvalidParameter(f"unknown PnP class bits 0x{value:x}")
    cls_bits = value & PNP_CLASS_MASK
    if cls_bits not in (PnpClass.CA, PnpClass.PORT, PnpClass.IOU, PnpClass.IOC):
        raise InvalidParameter("a PnP registration names exactly one class (CA, PORT, IOU or IOC)")
    flags = value & PNP_FLAG_MASK
    if flags & ~int(PnpClass.FLAG_REG_SYNC | PnpClass.FLAG_REG_COMPLETE):
        raise InvalidParameter(f"unknown PnP flags 0x{flags:x}")
    return PnpClass(cls_bits), PnpClass(flags)


__all__ = [
    "SYNC_DESTROY",
    "DeviceAttrMask",
    "PnpCallback",
    "PnpClass",
    "PnpEvent",
    "PnpEventBit",
    "PnpOrder",
    "PnpRec",
    "PnpRegistration",
    "port_state_event",
]


def delivering(reg: PnpRegistration, rec: object) -> bool:
    """Whether ``reg``'s callback is running for ``rec`` now."""
    return reg._current is rec


def reject(reg: PnpRegistration, key: DeviceKey) -> None:
    """``reg`` gets no more events for device ``key`` (``reject_ioc``); on the PnP queue."""
    reg._reject(key)
