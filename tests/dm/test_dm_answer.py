"""The DM agent's sans-IO answers: statuses, drops, and the bytes at IBA 16.3's offsets.

Offsets below are the spec's (DM data at MAD byte 64; IOUnitInfo: ChangeID
64-65, MaxControllers 66, DiagDeviceID/OptionROM the low bits of 67,
ControllerList 68-195, slot 1 the high nibble of 68), written as raw bytes,
not read through ``ibal.wire.mad.dm``'s tables.
"""

from __future__ import annotations

import struct

import pytest

from ibal.dm.answer import Drop, ExportedIoc, Reply, UnitView, answer
from ibal.wire.mad import header as H
from ibal.wire.mad.consts import Method, MgmtClass

PROFILE = bytes(range(128))
NAME = b"svc".ljust(40, b"\0")


def view(*slots: ExportedIoc | None, change_id: int = 7) -> UnitView:
    return UnitView(change_id, len(slots), tuple(slots))


def req(attr: int, mod: int = 0, method: int = Method.GET, tid: int = 0x1234) -> bytes:
    return bytes(H.build(MgmtClass.DEV_MGT, method, attr, tid=tid, attr_mod=mod))


def status(r: Reply | Drop) -> int:
    assert isinstance(r, Reply)
    assert r.mad[3] == Method.GET_RESP
    got = int.from_bytes(r.mad[4:6], "big")
    assert got == r.status
    return got


IOC = ExportedIoc(PROFILE, tuple((NAME, 0x1000 + i) for i in range(6)))
EMPTY = ExportedIoc(PROFILE, ())


def test_io_unit_info_raw_bytes() -> None:
    r = answer(req(0x0010, tid=0xABCDEF), view(IOC, None, EMPTY, change_id=0x0102))
    assert isinstance(r, Reply) and status(r) == 0
    m = r.mad
    assert m[0:3] == b"\x01\x06\x01" and m[3] == 0x81
    assert int.from_bytes(m[8:16], "big") == 0xABCDEF  # TID kept
    assert m[16:18] == b"\x00\x10"
    assert m[24:64] == bytes(40)  # the DM class's reserved bytes
    assert m[64:66] == b"\x01\x02"  # ChangeID
    assert m[66] == 3  # MaxControllers
    assert m[67] == 0  # no diagnostic device ID, no option ROM
    assert m[68] == 0x10  # slot 1 present, slot 2 not installed
    assert m[69] == 0x1F  # slot 3 present, slot 4 does not exist
    assert m[70:196] == b"\xff" * 126
    assert m[196:256] == bytes(60)


def test_ioc_profile_and_slot_errors() -> None:
    v = view(IOC, None)
    r = answer(req(0x0011, 1), v)
    assert status(r) == 0 and isinstance(r, Reply) and r.mad[64:192] == PROFILE
    assert status(answer(req(0x0011, 2), v)) == 0x0100  # empty slot: no IOC
    for bad in (0, 3, 0x101, 0xFFFFFFFF):
        r = answer(req(0x0011, bad), v)
        assert status(r) == 0x001C and isinstance(r, Reply) and r.mad[64:] == bytes(192)


def entries_mod(slot: int, first: int, last: int) -> int:
    return slot << 16 | last << 8 | first


def test_service_entries_ranges() -> None:
    v = view(IOC, None, EMPTY)
    r = answer(req(0x0012, entries_mod(1, 2, 5)), v)
    assert status(r) == 0 and isinstance(r, Reply)
    for i in range(4):
        at = 64 + 48 * i
        assert r.mad[at : at + 40] == NAME
        assert struct.unpack(">Q", r.mad[at + 40 : at + 48])[0] == 0x1002 + i
    r = answer(req(0x0012, entries_mod(1, 5, 5)), v)
    assert status(r) == 0 and isinstance(r, Reply) and r.mad[64 + 48 :] == bytes(192 - 48)
    assert status(answer(req(0x0012, entries_mod(1, 4, 6)), v)) == 0x001C  # past its 6
    assert status(answer(req(0x0012, entries_mod(1, 0, 4)), v)) == 0x001C  # five
    assert status(answer(req(0x0012, entries_mod(1, 3, 2)), v)) == 0x001C  # backwards
    assert status(answer(req(0x0012, entries_mod(0, 0, 0)), v)) == 0x001C
    assert status(answer(req(0x0012, entries_mod(4, 0, 0)), v)) == 0x001C
    assert status(answer(req(0x0012, entries_mod(2, 0, 0)), v)) == 0x0100
    assert status(answer(req(0x0012, entries_mod(3, 0, 0)), v)) == 0x0200


def test_class_port_info() -> None:
    r = answer(req(0x0001), view())
    assert status(r) == 0 and isinstance(r, Reply)
    assert r.mad[64] == 1 and r.mad[65] == 1  # base and class version
    assert r.mad[66:68] == b"\0\0"  # CapabilityMask: no traps
    assert r.mad[71] == 20  # CapabilityMask2 (27 bits) then RespTimeValue: the low 5 bits
    assert r.mad[64 + 8 :] == bytes(192 - 8)


@pytest.mark.parametrize("attr", [0x0001, 0x0010, 0x0011, 0x0012, 0x0020, 0x0021, 0x0022,
                                  0x0023, 0x0024, 0x7777])  # fmt: skip
def test_set_is_refused(attr: int) -> None:
    r = answer(req(attr, 1, Method.SET), view(IOC))
    assert status(r) == 0x000C and isinstance(r, Reply) and r.mad[64:] == bytes(192)


def test_other_gets_and_methods() -> None:
    assert status(answer(req(0x0020), view(IOC))) == 0x000C  # DiagnosticTimeout: unsupported
    assert status(answer(req(0x0099), view(IOC))) == 0x000C
    r = answer(req(0x0010, method=Method.SEND), view(IOC))
    assert isinstance(r, Reply) and int.from_bytes(r.mad[4:6], "big") == 0x0008


def test_forged_mads_dropped() -> None:
    good = bytearray(req(0x0010))
    assert answer(good[:255], view()) == Drop("dropped_bad_length")
    assert answer(bytes(good) + b"\0", view()) == Drop("dropped_bad_length")
    assert answer(b"", view()) == Drop("dropped_bad_length")
    for at, value, reason in ((0, 2, "dropped_bad_base_version"), (1, 4, "dropped_wrong_class"),
                              (2, 2, "dropped_bad_class_version"), (3, 0x81, "dropped_response"),
                              (3, 0x07, "dropped_response")):  # fmt: skip
        m = bytearray(good)
        m[at] = value
        assert answer(bytes(m), view()) == Drop(reason)


def test_junk_in_reserved_and_class_specific_not_echoed() -> None:
    m = bytearray(req(0x0010))
    m[6:8] = b"\xaa\xbb"
    m[24:64] = b"\x55" * 40
    m[64:256] = b"\x66" * 192
    r = answer(bytes(m), view(IOC))
    assert isinstance(r, Reply) and r.status == 0
    assert r.mad[6:8] == b"\0\0" and r.mad[24:64] == bytes(40) and r.mad[68] == 0x1F


def test_dm_tables_sit_at_iba_offsets() -> None:
    """ibal.wire.mad.dm's tables against IBA 16.3.3 (bit offsets from the attribute's start)."""
    from ibal.wire.mad import dm

    raw = dm.IO_UNIT_INFO.encode({"change_id": 0xA1B2, "max_controllers": 5,
                                  "diag_device_id": True, "option_rom": False})  # fmt: skip
    assert raw[:4] == b"\xa1\xb2\x05\x02"  # DiagDeviceID is bit 30, OptionROM bit 31
    raw = dm.IO_UNIT_INFO.encode({"option_rom": True})
    assert raw[3] == 0x01 and len(raw) == 132
    assert dm.IO_CONTROLLER_PROFILE.size == 128 and dm.SERVICE_ENTRIES.size == 192
    raw = dm.IO_CONTROLLER_PROFILE.encode({"rdma_read_depth": 0x44, "service_entries": 0x55,
                                           "controller_operations_mask": 0x66})  # fmt: skip
    assert (raw[43], raw[52], raw[54]) == (0x44, 0x66, 0x55)
    assert dm.service_entries_modifier(3, 4, 7) == 0x00030704
    assert dm.parse_service_entries_modifier(0x00030704) == (3, 4, 7)
