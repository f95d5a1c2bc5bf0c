"""Plug and Play: ``ib_reg_pnp`` classes, events and records, and their delivery.

A registration names one class (CA or PORT; IOU and IOC are accepted and get
only ``REG_COMPLETE`` until the device-management layer exists).  On
registration the current state is replayed (``CA_ADD`` per CA; ``PORT_ADD``
then the port's state per port), then ``REG_COMPLETE``; live events follow.
ADD events reach registrations in registration order, REMOVE events in reverse
order, and a CA's ports are removed before the CA.  Every delivery is queued on
the manager's PnP queue under the manager lock, so the order is global and a
registration never sees a live event before its replay.

The callback gets a :class:`PnpRec`.  Returning ``None``/``True``/
``Status.SUCCESS`` keeps the device (and ``rec.context``, which later events
for the same device present again); anything else means "no more events for
this device" (IBAL's non-``IB_SUCCESS`` return).  ``dereg()`` is a fence: once
it returns, no callback for the registration runs or will run.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ibal.al.obj import DESTROYED, SYNC_DESTROY, AlObject, DestroyCallback, _SyncDestroy
from ibal.status import InvalidHandle, InvalidParameter, Status, Timeout
from ibal.types import CaAttr, IocInfo, IouInfo, LinkState, PortAttr

if TYPE_CHECKING:
    from ibal.al.cica import CiCa
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


_STATES = frozenset({PnpEvent.PORT_DOWN, PnpEvent.PORT_INIT, PnpEvent.PORT_ARMED,
                     PnpEvent.PORT_ACTIVE})
_COALESCED = _STATES | {PnpEvent.PKEY_CHANGE, PnpEvent.SM_CHANGE, PnpEvent.GID_CHANGE,
                        PnpEvent.LID_CHANGE, PnpEvent.SUBNET_TIMEOUT_CHANGE}
"""Port changes a slow registration gets only the latest of (see :func:`post`)."""


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


_DeviceKey = tuple[str, int]


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
        super().__init__(mgr, al, al, context)
        self.pnp_class = pnp_class
        self.order = order
        self.al = al
        self._callback = callback
        self._dev_ctx: dict[_DeviceKey, Any] = {}
        self._rejected: set[_DeviceKey] = set()
        self._current: PnpRec | None = None  # the record of the callback running, if any
        # Port changes posted but not yet started, per port: event -> record fields.
        self._pending: dict[_DeviceKey, dict[PnpEvent, dict[str, Any]]] = {}

    def dereg(
        self,
        destroy_cb: DestroyCallback | _SyncDestroy | None = None,
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
        if isinstance(destroy_cb, _SyncDestroy):
            destroy_cb, wait = None, True
        self._destroy(destroy_cb, wait, timeout)
        if wait or destroy_cb is not None or self._mgr._queues.pnp.is_current():
            return
        # Queued callbacks are dropped (destroying); wait out the one running, if any.
        with self._lock:
            if not self._mgr._cond.wait_for(lambda: self._state is DESTROYED, timeout):
                raise Timeout(f"PnP callback still running after {timeout} s")

    def _unlink(self) -> None:
        self._mgr._pnp_regs.pop(self, None)

    def _finish(self) -> None:
        super()._finish()
        with self._lock:
            self._mgr._cond.notify_all()

    def _reject(self, key: _DeviceKey) -> None:
        """No more events for ``key`` until it is removed (PnP queue)."""
        self._rejected.add(key)
        self._dev_ctx.pop(key, None)

    # ------------------------------------------------------------------ delivery
    def _deliver_changes(self, key: _DeviceKey, changes: dict[PnpEvent, dict[str, Any]]) -> None:
        """PnP-queue task: the port changes coalesced for ``key``, latest state last."""
        with self._lock:
            if self._pending.get(key) is changes:
                del self._pending[key]  # closed: later changes start a new batch
            items = list(changes.items())
        for event, fields in items:
            self._deliver(event, key, fields)

    def _deliver(self, event: PnpEvent, key: _DeviceKey | None, fields: dict[str, Any]) -> None:
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
                self._mgr._pnp_callback_failed(self, rec)
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


# ---------------------------------------------------------------------- the engine
# Each function below runs under the manager lock and only queues deliveries.


def post(reg: PnpRegistration, event: PnpEvent, key: _DeviceKey | None, **fields: Any) -> None:
    """Queue ``event`` for ``reg`` (``fields`` are :class:`PnpRec` fields).

    Port changes coalesce: while a registration has changes of a port queued
    and not started, a newer change of the same kind replaces the older one
    (a newer link state replaces any older state) and moves to the end, so a
    slow client sees each kind once, with the latest attributes.  Any other
    event for the port closes the batch, so ADD/REMOVE order is untouched.
    """
    queue = reg._mgr._queues.pnp
    if key is None or event not in _COALESCED:
        if key is None:  # REG_COMPLETE: no live change may move before it
            reg._pending.clear()
        else:
            reg._pending.pop(key, None)
        queue.post(reg._deliver, event, key, fields)
        return
    changes = reg._pending.get(key)
    if changes is None:
        changes = reg._pending[key] = {event: fields}
        queue.post(reg._deliver_changes, key, changes)
        return
    replaced = [e for e in changes if e is event or (event in _STATES and e in _STATES)]
    for e in replaced:
        del changes[e]
    changes[event] = fields
    reg._mgr._pnp_coalesced += len(replaced)


def _post(reg: PnpRegistration, event: PnpEvent, key: _DeviceKey | None, ca_guid: int,
          guid: int, ca_attr: CaAttr | None, port_attr: PortAttr | None) -> None:
    post(reg, event, key, ca_guid=ca_guid, guid=guid, ca_attr=ca_attr, port_attr=port_attr)


def _ca_events(reg: PnpRegistration, cica: CiCa, add: bool) -> None:
    attr = cica.attr
    if reg.pnp_class is PnpClass.CA:
        event = PnpEvent.CA_ADD if add else PnpEvent.CA_REMOVE
        _post(reg, event, ("ca", cica.guid), cica.guid, cica.guid, attr if add else None, None)


def _port_events(reg: PnpRegistration, cica: CiCa, add: bool) -> None:
    attr = cica.attr
    if reg.pnp_class is not PnpClass.PORT:
        return
    for port in attr.ports:
        key = ("port", port.port_guid)
        if add:
            _post(reg, PnpEvent.PORT_ADD, key, cica.guid, port.port_guid, attr, port)
            _post(reg, port_state_event(port), key, cica.guid, port.port_guid, attr, port)
        else:
            _post(reg, PnpEvent.PORT_REMOVE, key, cica.guid, port.port_guid, None, port)


def replay(reg: PnpRegistration, cicas: list[CiCa], done: threading.Event | None) -> None:
    """The current state for a new registration, then ``REG_COMPLETE``."""
    for cica in cicas:
        _ca_events(reg, cica, True)
        _port_events(reg, cica, True)
    reg._mgr.io_devices.replay(reg)
    _post(reg, PnpEvent.REG_COMPLETE, None, 0, 0, None, None)
    if done is not None:
        reg._mgr._queues.pnp.post(done.set)


def ca_added(regs: list[PnpRegistration], cica: CiCa) -> None:
    """A CA registered: ``CA_ADD`` then its ports, to registrations in order."""
    for reg in regs:
        _ca_events(reg, cica, True)
    for reg in regs:
        _port_events(reg, cica, True)


def ca_removed(regs: list[PnpRegistration], cica: CiCa) -> None:
    """A CA goes: the I/O devices reached through it, its ports, then the CA, each to
    registrations in reverse order."""
    cica.mgr.io_devices.ca_lost(cica.guid, [p.port_guid for p in cica.attr.ports])
    for reg in reversed(regs):
        _port_events(reg, cica, False)
    for reg in reversed(regs):
        _ca_events(reg, cica, False)


def client_reregister(regs: list[PnpRegistration], cica: CiCa, port_num: int) -> None:
    """The SM asked a port's clients to re-register: ``CLIENT_REREGISTER`` to PORT registrations."""
    port = cica.port(port_num)
    if port is None:
        return
    key = ("port", port.port_guid)
    for reg in regs:
        if reg.pnp_class is PnpClass.PORT:
            _post(reg, PnpEvent.CLIENT_REREGISTER, key, cica.guid, port.port_guid, cica.attr, port)


def port_changes(regs: list[PnpRegistration], cica: CiCa, old: CaAttr, new: CaAttr) -> None:
    """Events for what changed between two snapshots of a CA's ports (latest state wins)."""
    old_ports = {p.port_num: p for p in old.ports}
    new_ports = {p.port_num: p for p in new.ports}
    for num, port in new_ports.items():
        before = old_ports.get(num)
        key = ("port", port.port_guid)
        events: list[PnpEvent] = []
        if before is None:
            events = [PnpEvent.PORT_ADD, port_state_event(port)]
        else:
            if port_state_event(before) is not port_state_event(port):
                events.append(port_state_event(port))
                if port_state_event(before) is PnpEvent.PORT_ACTIVE:
                    cica.mgr.io_devices.port_lost(port.port_guid)  # IOC_REMOVE first
            if (before.lid, before.lmc) != (port.lid, port.lmc):
                events.append(PnpEvent.LID_CHANGE)
            if before.pkeys != port.pkeys:
                events.append(PnpEvent.PKEY_CHANGE)
            if (before.sm_lid, before.sm_sl) != (port.sm_lid, port.sm_sl):
                events.append(PnpEvent.SM_CHANGE)
            if before.gids != port.gids:
                events.append(PnpEvent.GID_CHANGE)
            if before.subnet_timeout != port.subnet_timeout:
                events.append(PnpEvent.SUBNET_TIMEOUT_CHANGE)
        for reg in regs:
            if reg.pnp_class is PnpClass.PORT:
                for event in events:
                    _post(reg, event, key, cica.guid, port.port_guid, new, port)
    for num, before in old_ports.items():
        if num not in new_ports:
            cica.mgr.io_devices.port_lost(before.port_guid)
            for reg in reversed(regs):
                if reg.pnp_class is PnpClass.PORT:
                    key = ("port", before.port_guid)
                    _post(reg, PnpEvent.PORT_REMOVE, key, cica.guid, before.port_guid, None, before)


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
