"""Device Management (class 0x06, IBA vol.1 16.3): I/O unit, controller and service tables.

DM MADs carry 40 reserved bytes after the common header; attribute data
starts at MAD byte 64 (192 bytes).  ClassPortInfo is the common one
(``ibal.wire.mad.header``).  Attribute modifiers: IOControllerProfile takes the
controller slot (1-based); ServiceEntries takes slot << 16 | last << 8 | first
and answers at most four entries (:func:`service_entries_modifier`).
"""

from __future__ import annotations

import enum

from ibal.wire.fields import F, Field, FieldError, Kind, R, Table, Value
from ibal.wire.mad import header as H
from ibal.wire.mad.consts import CLASS_VERSION, Method, MgmtClass
from ibal.wire.mad.consts import DmAttr as DmAttr  # one definition, re-exported with the tables

DM_CLASS = MgmtClass.DEV_MGT
DM_CLASS_VERSION = CLASS_VERSION[DM_CLASS]
DATA_OFFSET = H.data_offset(DM_CLASS)  # 64: 40 reserved bytes follow the common header
DATA_SIZE = H.data_size(DM_CLASS)  # 192
MAX_SLOTS = 256  # 128 bytes of 4-bit slot entries
ENTRIES_PER_MAD = 4


class DmStatus(enum.IntEnum):
    """DM class-specific MAD status bits (IBA 16.3.1.1), beside the common codes.

    ``NO_IOC``: the slot addressed is empty (no controller answers there);
    ``NO_SVC_ENTRIES``: the controller has no service entries to list;
    ``IOC_FAILURE``: the controller failed (bit 15; not sent by ibal's agent).
    """

    NO_IOC = 0x0100
    NO_SVC_ENTRIES = 0x0200
    IOC_FAILURE = 0x8000


class SlotState(enum.IntEnum):
    """One 4-bit entry of IOUnitInfo's ControllerList."""

    NOT_INSTALLED = 0x0
    PRESENT = 0x1
    NO_SLOT = 0xF


IO_UNIT_INFO = Table("IOUnitInfo", [
    F("change_id", 16, hex=True),
    F("max_controllers", 8),
    R(6),
    F("diag_device_id", 1, kind=Kind.BOOL),
    F("option_rom", 1, kind=Kind.BOOL),
    F("controller_list", 1024, kind=Kind.BYTES),
])  # fmt: skip

IO_CONTROLLER_PROFILE = Table("IOControllerProfile", [
    F("guid", 64, hex=True),
    F("vendor_id", 24, hex=True),
    R(8),
    F("device_id", 32, hex=True),
    F("device_version", 16, hex=True),
    R(16),
    F("subsystem_vendor_id", 24, hex=True),
    R(8),
    F("subsystem_id", 32, hex=True),
    F("io_class", 16, hex=True),
    F("io_subclass", 16, hex=True),
    F("protocol", 16, hex=True),
    F("protocol_version", 16, hex=True),
    R(32),
    F("send_message_depth", 16),
    R(8),
    F("rdma_read_depth", 8),
    F("send_message_size", 32),
    F("rdma_transfer_size", 32),
    F("controller_operations_mask", 8, hex=True),
    R(8),
    F("service_entries", 8),
    R(8),
    R(64),
    F("id_string", 512, kind=Kind.BYTES),
])  # fmt: skip


def _entry(n: int) -> list[Field]:
    return [F(f"service_name_{n}", 320, kind=Kind.BYTES), F(f"service_id_{n}", 64, hex=True)]


SERVICE_ENTRIES = Table(
    "ServiceEntries", [f for n in range(ENTRIES_PER_MAD) for f in _entry(n)]
)
DIAGNOSTIC_TIMEOUT = Table("DiagnosticTimeout", [F("max_diag_time", 32)])
DIAG_CODE = Table("DiagCode", [F("diag_code", 16, hex=True), R(16)])

TABLES: dict[DmAttr, Table] = {
    DmAttr.IO_UNIT_INFO: IO_UNIT_INFO,
    DmAttr.IO_CONTROLLER_PROFILE: IO_CONTROLLER_PROFILE,
    DmAttr.SERVICE_ENTRIES: SERVICE_ENTRIES,
    DmAttr.DIAGNOSTIC_TIMEOUT: DIAGNOSTIC_TIMEOUT,
    DmAttr.DIAG_CODE: DIAG_CODE,
}
"""Attributes with data; PrepareToTest, TestDeviceOnce and TestDeviceLoop carry none."""


def controller_list(slots: list[int]) -> bytes:
    """ControllerList bytes: slot 1 in the high nibble of byte 0; the rest NOT_INSTALLED."""
    if len(slots) > MAX_SLOTS:
        raise FieldError("range", f"at most {MAX_SLOTS} controller slots", "controller_list")
    out = bytearray(MAX_SLOTS // 2)
    for i, s in enumerate(slots):
        if not 0 <= s <= 0xF:
            raise FieldError("range", f"slot {i + 1} state {s} is not 4 bits", "controller_list")
        out[i // 2] |= s << (4 if i % 2 == 0 else 0)
    return bytes(out)


def controller_slots(raw: bytes, max_controllers: int | None = None) -> list[int]:
    """The 4-bit state of each slot (1-based slot n at index n-1), up to ``max_controllers``."""
    n = MAX_SLOTS if max_controllers is None else min(max_controllers, MAX_SLOTS)
    return [(raw[i // 2] >> (4 if i % 2 == 0 else 0)) & 0xF for i in range(n)]


def service_entries_modifier(slot: int, first: int, last: int) -> int:
    """The ServiceEntries attribute modifier; at most four entries per MAD."""
    if not 1 <= slot <= 0xFFFF:
        raise FieldError("range", f"controller slot {slot} not in 1..65535", "slot")
    if not 0 <= first <= last <= 0xFF or last - first >= ENTRIES_PER_MAD:
        raise FieldError("range", f"entries {first}..{last}: at most 4, in 0..255", "entries")
    return slot << 16 | last << 8 | first


def parse_service_entries_modifier(mod: int) -> tuple[int, int, int]:
    """(slot, first, last) of a ServiceEntries modifier; raises on an impossible one."""
    slot, last, first = mod >> 16 & 0xFFFF, mod >> 8 & 0xFF, mod & 0xFF
    service_entries_modifier(slot, first, last)
    return slot, first, last


def service_entries(values: dict[str, Value], count: int) -> list[tuple[bytes, int]]:
    """The first ``count`` (name, service ID) pairs of decoded ServiceEntries values."""
    out = []
    for n in range(min(count, ENTRIES_PER_MAD)):
        name, sid = values[f"service_name_{n}"], values[f"service_id_{n}"]
        assert isinstance(name, bytes) and isinstance(sid, int)
        out.append((name.rstrip(b"\0"), sid))
    return out


def dm_mad(attr: DmAttr, tid: int, *, method: int = Method.GET, modifier: int = 0,
           values: dict[str, Value] | None = None) -> bytes:  # fmt: skip
    """A 256-byte DM MAD (default method Get) with ``values`` for the attribute's table."""
    table = TABLES.get(DmAttr(attr))
    body = b"" if table is None else table.encode(values or {})
    return bytes(H.build(DM_CLASS, method, attr, tid=tid, attr_mod=modifier, data=body))


def parse_dm(mad: bytes | bytearray | memoryview) -> tuple[DmAttr, int, dict[str, Value]]:
    """(attribute, modifier, values) of a DM MAD; raises ``FieldError`` if it is not one."""
    h = H.header_of(mad, DM_CLASS, "DM")
    try:
        attr = DmAttr(h.attr_id)
    except ValueError:
        raise FieldError("enum", f"DM attribute {h.attr_id:#06x} unknown") from None
    table = TABLES.get(attr)
    return attr, h.attr_mod, ({} if table is None else table.decode(mad, DATA_OFFSET))
