"""I/O controllers: ``ib_create_ioc``, ``ib_reg_ioc``, ``ib_add_svc_entry`` and their undoing.

An :class:`Ioc` hangs on a CA handle (a :class:`~ibal.al.Dependent`: it dies
with the handle, its AL or the CA) and its service entries hang on it (they
die with it, their handles then invalid).  :meth:`Ioc.register` exports it in
the CA's I/O unit (:mod:`ibal.dm.iou`) through the device-management agent of
the CA's ports (:mod:`ibal.dm.agent`, started on first use); a service entry
added or removed afterwards changes the export at once.  Destroying the IOC
(or losing its CA) unexports it and removes its entries.  All of it is
synchronous: when a call returns, the agent answers the new state.

Errors: a handle that is not a live CA ``InvalidCaHandle``; a destroyed IOC
or removed entry ``InvalidHandle``; something that is not an
:class:`~ibal.types.IocProfile`/:class:`~ibal.types.SvcEntry`
``InvalidParameter``; no free controller slot in the I/O unit, or the
IOC's 255 entries taken, ``InsufficientResources``; a second ``register``
``InvalidState``.
"""

from __future__ import annotations

import threading

from ibal.al import Ca, Dependent
from ibal.dm.answer import ExportedIoc
from ibal.dm.iou import IoUnit, io_unit
from ibal.status import InsufficientResources, InvalidCaHandle, InvalidParameter, InvalidState
from ibal.types import (
    IOC_ID_STRING_SIZE,
    MAX_SVC_ENTRIES,
    SVC_NAME_SIZE,
    IocProfile,
    SvcEntry,
)
from ibal.wire.fields import Value
from ibal.wire.mad import dm

__all__ = ["Ioc", "SvcEntryHandle", "create_ioc", "profile_values"]


def profile_values(profile: IocProfile, num_entries: int) -> dict[str, Value]:
    """The IOControllerProfile table's values for ``profile`` with ``num_entries`` services."""
    return {
        "guid": profile.ioc_guid, "vendor_id": profile.vend_id, "device_id": profile.dev_id,
        "device_version": profile.dev_version, "subsystem_vendor_id": profile.subsys_vend_id,
        "subsystem_id": profile.subsys_id, "io_class": profile.io_class,
        "io_subclass": profile.io_subclass, "protocol": profile.protocol,
        "protocol_version": profile.protocol_ver, "send_message_depth": profile.send_msg_depth,
        "rdma_read_depth": profile.rdma_read_depth, "send_message_size": profile.send_msg_size,
        "rdma_transfer_size": profile.rdma_size,
        "controller_operations_mask": profile.ctrl_ops_cap, "service_entries": num_entries,
        "id_string": profile.id_string.encode().ljust(IOC_ID_STRING_SIZE, b"\0"),
    }  # fmt: skip


def create_ioc(ca: Ca, profile: IocProfile) -> Ioc:
    """``ib_create_ioc``: an unregistered IOC on ``ca`` (see the module docstring)."""
    if not isinstance(ca, Ca):
        raise InvalidCaHandle(f"{ca!r} is not a CA handle")
    if not isinstance(profile, IocProfile):
        raise InvalidParameter("create_ioc takes an IocProfile")
    return Ioc(ca, profile)


class Ioc(Dependent):
    """``ib_ioc_handle_t``: one I/O controller of a CA (see the module docstring)."""

    _kind = "IOC"

    def __init__(self, ca: Ca, profile: IocProfile) -> None:
        self.ca = ca
        self._profile = profile
        self._unit: IoUnit = io_unit(ca.al.manager, ca.guid)
        self._ioc_lock = threading.Lock()
        self._entries: list[SvcEntryHandle] = []
        self._slot = 0  # 0: not registered
        super().__init__(ca)

    def __repr__(self) -> str:
        state = f"slot {self._slot}" if self._slot else "unregistered"
        return f"<Ioc 0x{self._profile.ioc_guid:016x} on {self.ca.name} {state}>"

    @property
    def profile(self) -> IocProfile:
        """The profile given, ``num_svc_entries`` as exported (the entries' count)."""
        import dataclasses

        return dataclasses.replace(self._profile, num_svc_entries=len(self._entries))

    @property
    def entries(self) -> tuple[SvcEntry, ...]:
        """The service entries, in the order they were added."""
        with self._ioc_lock:
            return tuple(h.entry for h in self._entries)

    @property
    def slot(self) -> int:
        """The controller slot it is exported in (1-based), 0 before :meth:`register`."""
        return self._slot

    @property
    def unit(self) -> IoUnit:
        return self._unit

    def register(self) -> int:
        """``ib_reg_ioc``: export it in the CA's I/O unit; returns the slot taken."""
        from ibal.dm.agent import DmService

        with self.use():
            DmService.start(self.al.manager)
            with self._ioc_lock:
                if self._slot:
                    raise InvalidState(f"{self!r} is already registered")
                self._slot = self._unit.take_slot(self, self._export())
            return self._slot

    def add_svc_entry(self, entry: SvcEntry) -> SvcEntryHandle:
        """``ib_add_svc_entry``: one more service, exported at once if registered."""
        self.check()
        if not isinstance(entry, SvcEntry):
            raise InvalidParameter("add_svc_entry takes a SvcEntry")
        return SvcEntryHandle(self, entry)

    # ------------------------------------------------------------------ internals
    def _export(self) -> ExportedIoc:
        """What the agent answers for it (under ``_ioc_lock``)."""
        entries = tuple(
            (h.entry.name.encode().ljust(SVC_NAME_SIZE, b"\0"), h.entry.id) for h in self._entries
        )
        raw = dm.IO_CONTROLLER_PROFILE.encode(profile_values(self._profile, len(entries)))
        return ExportedIoc(raw, entries)

    def add_entry(self, h: SvcEntryHandle) -> None:
        """Export ``h`` with this IOC (raises InsufficientResources past the limit)."""
        with self._ioc_lock:
            if len(self._entries) >= MAX_SVC_ENTRIES:
                raise InsufficientResources(f"{self!r} has its {MAX_SVC_ENTRIES} service entries")
            self._entries.append(h)
            if self._slot:
                self._unit.update(self._slot, self, self._export())

    def remove_entry(self, h: SvcEntryHandle) -> None:
        """Unexport ``h``; a no-op when it is not (or no longer) exported."""
        with self._ioc_lock:
            if h not in self._entries:
                return
            self._entries.remove(h)
            if self._slot:
                self._unit.update(self._slot, self, self._export())

    def on_destroying(self) -> None:
        with self._ioc_lock:
            slot, self._slot = self._slot, 0
        if slot:
            self._unit.free_slot(slot, self)


class SvcEntryHandle(Dependent):
    """``ib_svc_handle_t``: one service entry of an :class:`Ioc`."""

    _kind = "service entry"

    def __init__(self, ioc: Ioc, entry: SvcEntry) -> None:
        self.ioc = ioc
        self.entry = entry
        super().__init__(ioc)
        try:
            ioc.add_entry(self)
        except BaseException:
            self.destroy()
            raise

    def __repr__(self) -> str:
        return f"<SvcEntryHandle {self.entry.name!r} 0x{self.entry.id:016x}>"

    def remove(self) -> None:
        """``ib_remove_svc_entry``: unexported when it returns; the handle is then invalid."""
        self.destroy()

    def on_destroying(self) -> None:
        self.ioc.remove_entry(self)
