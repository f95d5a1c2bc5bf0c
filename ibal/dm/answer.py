"""The device-management agent's protocol, sans I/O: one request MAD in, one answer out.

:func:`answer` is a pure function of a received DM MAD and a :class:`UnitView`
(the I/O unit as it is exported at that moment); it returns the GetResp to
send (:class:`Reply`) or why the MAD is dropped (:class:`Drop`, counted by the
I/O layer).  What it answers (IBA vol. 1 16.3):

* Get ClassPortInfo, IOUnitInfo, IOControllerProfile (attribute modifier: the
  slot, 1-based), ServiceEntries (modifier ``slot << 16 | last << 8 | first``,
  at most four entries).
* A slot outside ``1..max_controllers``, a range backwards or of more than
  four entries, or entries past the controller's: ``INVALID_FIELD`` (0x001C).
  An empty slot: ``DmStatus.NO_IOC`` (0x0100).  A controller without service
  entries: ``DmStatus.NO_SVC_ENTRIES`` (0x0200).
* Set of any attribute (they are read-only, the diagnostics unsupported) and
  Get of another attribute: ``METHOD_ATTR_UNSUPPORTED`` (0x000C); any other
  request method: ``METHOD_UNSUPPORTED`` (0x0008).
* Dropped: not 256 bytes, another base version, class or class version, a
  response (the R bit), which no agent answers.
"""

from __future__ import annotations

from ibal.records import record
from ibal.wire.fields import FieldError
from ibal.wire.mad import dm
from ibal.wire.mad import header as H
from ibal.wire.mad.consts import MAD_SIZE, Method, MgmtClass
from ibal.wire.mad.consts import MadStatus as M

__all__ = ["RESP_TIME_VALUE", "Drop", "ExportedIoc", "Reply", "UnitView", "answer",
           "class_port_info"]  # fmt: skip

RESP_TIME_VALUE = 20
"""ClassPortInfo.RespTimeValue: 4.096 us * 2**20, about 4.3 s (the agent answers at once;
the value bounds what a client waits, with the subnet's packet life added)."""


@record(frozen=True)
class ExportedIoc:
    """One registered controller as the agent exports it."""

    profile: bytes
    """The 128-byte IOControllerProfile, ServiceEntries count included."""
    entries: tuple[tuple[bytes, int], ...]
    """(ServiceName, padded to 40 bytes; ServiceID), in the order they were added."""


@record(frozen=True)
class UnitView:
    """An I/O unit at one moment: what a request is answered from."""

    change_id: int
    max_controllers: int
    slots: tuple[ExportedIoc | None, ...]
    """Slot ``n`` at index ``n - 1``, ``max_controllers`` of them; ``None``: empty."""


@record(frozen=True)
class Reply:
    """Send ``mad`` (the GetResp) back to the requester."""

    mad: bytes
    status: int


@record(frozen=True)
class Drop:
    """Do not answer; ``reason`` is the counter the I/O layer bumps."""

    reason: str


def class_port_info() -> bytes:
    """The agent's ClassPortInfo: DM class version 1, no traps, no redirection."""
    return H.CLASS_PORT_INFO.encode({
        "base_version": 1, "class_version": dm.DM_CLASS_VERSION,
        "resp_time_value": RESP_TIME_VALUE,
    })  # fmt: skip


def io_unit_info(view: UnitView) -> bytes:
    """IOUnitInfo: the change ID, the slot count, each slot's 4-bit state."""
    states = [dm.SlotState.PRESENT if s is not None else dm.SlotState.NOT_INSTALLED
              for s in view.slots]  # fmt: skip
    states += [dm.SlotState.NO_SLOT] * (dm.MAX_SLOTS - len(states))
    return dm.IO_UNIT_INFO.encode({
        "change_id": view.change_id & 0xFFFF, "max_controllers": view.max_controllers,
        "controller_list": dm.controller_list([int(s) for s in states]),
    })  # fmt: skip


def _slot(view: UnitView, slot: int) -> ExportedIoc | int:
    """The controller in ``slot``, or the status that answers for it."""
    if not 1 <= slot <= view.max_controllers:
        return M.INVALID_FIELD
    ioc = view.slots[slot - 1]
    return int(dm.DmStatus.NO_IOC) if ioc is None else ioc


def _service_entries(view: UnitView, mod: int) -> bytes | int:
    slot, last, first = mod >> 16 & 0xFFFF, mod >> 8 & 0xFF, mod & 0xFF
    found = _slot(view, slot)
    if isinstance(found, int):
        return found
    if first > last or last - first >= dm.ENTRIES_PER_MAD:
        return M.INVALID_FIELD
    if not found.entries:
        return dm.DmStatus.NO_SVC_ENTRIES
    if last >= len(found.entries):
        return M.INVALID_FIELD
    return b"".join(name + sid.to_bytes(8, "big") for name, sid in found.entries[first:last + 1])


def _get(attr: int, mod: int, view: UnitView) -> bytes | int:
    """The attribute data a Get is answered with, or its error status."""
    if attr == dm.DmAttr.CLASS_PORT_INFO:
        return class_port_info()
    if attr == dm.DmAttr.IO_UNIT_INFO:
        return io_unit_info(view)
    if attr == dm.DmAttr.IO_CONTROLLER_PROFILE:
        found = _slot(view, mod) if mod <= 0xFF else int(M.INVALID_FIELD)
        return found if isinstance(found, int) else found.profile
    if attr == dm.DmAttr.SERVICE_ENTRIES:
        return _service_entries(view, mod)
    return M.METHOD_ATTR_UNSUPPORTED


def answer(mad: bytes | bytearray | memoryview, view: UnitView) -> Reply | Drop:
    """The agent's answer to one received DM MAD (see the module docstring)."""
    if len(mad) != MAD_SIZE:
        return Drop("dropped_bad_length")
    try:
        h = H.header(mad)
    except FieldError:  # pragma: no cover - 256 bytes always hold a header
        return Drop("dropped_bad_length")
    if h.base_version != 1:
        return Drop("dropped_bad_base_version")
    if h.mgmt_class != MgmtClass.DEV_MGT:
        return Drop("dropped_wrong_class")
    if h.class_version != dm.DM_CLASS_VERSION:
        return Drop("dropped_bad_class_version")
    if h.method & 0x80 or h.method == Method.TRAP_REPRESS:
        return Drop("dropped_response")
    data: bytes | int
    if h.method == Method.GET:
        data = _get(h.attr_id, h.attr_mod, view)
    elif h.method == Method.SET:
        data = M.METHOD_ATTR_UNSUPPORTED  # every DM attribute ibal has is read-only
    else:
        data = M.METHOD_UNSUPPORTED
    status, body = (int(data), b"") if isinstance(data, int) else (0, data)
    out = H.respond(bytes(mad), status=status, data=body)
    out[H.MAD_HEADER.size : dm.DATA_OFFSET] = bytes(dm.DATA_OFFSET - H.MAD_HEADER.size)
    out[6:8] = b"\0\0"  # ClassSpecific: none for DM
    return Reply(bytes(out), status)
