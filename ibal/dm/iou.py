"""The I/O unit of a local CA: its controller slots, as the DM agent exports them.

One :class:`IoUnit` per (manager, CA GUID), process-wide, shared by every AL
instance that creates IOCs on that CA (IBAL's IOU is the CA's, whoever opened
it).  A registered IOC takes the lowest free slot (1-based) until
``max_controllers`` are taken; every change of what is exported (an IOC
registered or gone, a service entry added or removed on a registered IOC)
bumps the 16-bit change ID.  :meth:`IoUnit.view` is the snapshot the agent
answers from; listeners hear when the unit goes from empty to exporting and
back (the agent sets the ports' IsDeviceManagementSupported bit then).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ibal.al import StashKey
from ibal.dm.answer import ExportedIoc, UnitView
from ibal.status import InsufficientResources

if TYPE_CHECKING:
    from ibal.al import AlManager

__all__ = ["DEFAULT_MAX_CONTROLLERS", "IoUnit", "io_unit"]

DEFAULT_MAX_CONTROLLERS = 16
"""Controller slots of an I/O unit (IOUnitInfo.MaxControllers; the wire allows 255)."""

ExportListener = Callable[["IoUnit", bool], object]
"""``fn(unit, exporting)``: the unit started (True) or stopped (False) exporting IOCs."""


class IoUnit:
    """A CA's I/O unit (see the module docstring); thread-safe."""

    def __init__(self, ca_guid: int, max_controllers: int = DEFAULT_MAX_CONTROLLERS) -> None:
        self.ca_guid = ca_guid
        self.max_controllers = max_controllers
        self._lock = threading.Lock()
        self._slots: list[object | None] = [None] * max_controllers  # slot n at n - 1
        self._exports: dict[int, ExportedIoc] = {}  # slot -> what is exported there
        self._change_id = 0
        self._listeners: list[ExportListener] = []
        self._tell_lock = threading.RLock()  # one export change told at a time, in order

    def __repr__(self) -> str:
        return f"<IoUnit 0x{self.ca_guid:016x} {len(self._exports)}/{self.max_controllers}>"

    @property
    def change_id(self) -> int:
        return self._change_id

    @property
    def exporting(self) -> bool:
        """At least one IOC is registered."""
        return bool(self._exports)

    def view(self) -> UnitView:
        with self._lock:
            slots = tuple(self._exports.get(n) for n in range(1, self.max_controllers + 1))
            return UnitView(self._change_id, self.max_controllers, slots)

    def apply(self, fn: Callable[[bool], object]) -> None:
        """``fn(exporting)`` in order with the listeners' notifications (a new port's
        agent sets its bit so, and no concurrent change is told before it)."""
        with self._tell_lock:
            fn(self.exporting)

    def add_listener(self, fn: ExportListener) -> None:
        with self._lock:
            self._listeners.append(fn)

    def remove_listener(self, fn: ExportListener) -> None:
        with self._lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    # ------------------------------------------------------------------ for Ioc
    def take_slot(self, owner: object, export: ExportedIoc) -> int:
        """Export ``export`` in the lowest free slot; ``InsufficientResources`` when full."""
        with self._lock:
            try:
                slot = self._slots.index(None) + 1
            except ValueError:
                raise InsufficientResources(
                    f"the I/O unit of CA 0x{self.ca_guid:016x} has all its "
                    f"{self.max_controllers} controller slots taken") from None  # fmt: skip
            self._slots[slot - 1] = owner
            first = not self._exports
            self._exports[slot] = export
            self._bump()
            listeners = list(self._listeners) if first else []
        self._tell(listeners, True)
        return slot

    def update(self, slot: int, owner: object, export: ExportedIoc) -> None:
        """What ``slot`` exports changed (a service entry added or removed)."""
        with self._lock:
            if self._slots[slot - 1] is owner:
                self._exports[slot] = export
                self._bump()

    def free_slot(self, slot: int, owner: object) -> None:
        """``owner`` stops exporting (unregistered or destroyed)."""
        with self._lock:
            if self._slots[slot - 1] is not owner:
                return
            self._slots[slot - 1] = None
            del self._exports[slot]
            self._bump()
            listeners = list(self._listeners) if not self._exports else []
        self._tell(listeners, False)

    def _bump(self) -> None:
        self._change_id = (self._change_id + 1) & 0xFFFF

    def _tell(self, listeners: list[ExportListener], exporting: bool) -> None:
        from ibal.al import call_user

        with self._tell_lock:
            if self.exporting is not exporting:
                return  # changed back meanwhile: that change tells its own listeners
            for fn in listeners:
                call_user(fn, self, exporting)


_UNITS: StashKey[dict[int, IoUnit]] = StashKey()
_UNITS_LOCK = threading.Lock()


def io_unit(mgr: AlManager, ca_guid: int) -> IoUnit:
    """The I/O unit of CA ``ca_guid`` under ``mgr`` (made on first use)."""
    with _UNITS_LOCK:
        units = mgr.stash.setdefault(_UNITS, {})
        unit = units.get(ca_guid)
        if unit is None:
            unit = units[ca_guid] = IoUnit(ca_guid)
        return unit


def units_of(mgr: AlManager) -> list[IoUnit]:
    """Every I/O unit made under ``mgr``."""
    with _UNITS_LOCK:
        return list(mgr.stash.get(_UNITS, {}).values())
