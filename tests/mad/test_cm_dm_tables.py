"""Round trips of every CM, DM and RMPP table, the DM helpers, and garbage handling."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibal.wire.fields import FieldError, Kind, Table, Value
from ibal.wire.mad import cm, dm
from ibal.wire.mad.rmpp import RMPP_HEADER


def values_of(table: Table) -> st.SearchStrategy[dict[str, Value]]:
    parts: dict[str, st.SearchStrategy[Value]] = {}
    for p in table.values:
        f = p.field
        if f.kind in (Kind.BYTES, Kind.GID):
            n = f.bits // 8
            parts[f.name] = st.binary(min_size=n, max_size=n)
        elif f.enum is not None and f.kind is Kind.ENUM:
            parts[f.name] = st.sampled_from([int(m) for m in f.enum])
        elif f.enum is not None:
            parts[f.name] = st.integers(0, sum(int(m) for m in f.enum))
        else:
            parts[f.name] = st.integers(0, (1 << f.bits) - 1)
    return st.fixed_dictionaries(parts)


ALL = [*cm.TABLES.values(), *dm.TABLES.values(), RMPP_HEADER]


# 40 examples a table as in test_tables.py: the field engine every table shares has its
# own 300-example properties (tests/wire), the CM layouts their known bytes below.
@pytest.mark.parametrize("table", ALL, ids=lambda t: t.name)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_round_trip(table: Table, data: st.DataObject) -> None:
    vals = data.draw(values_of(table))
    raw = table.encode(vals)
    assert len(raw) == table.size
    table.validate(raw)
    back = table.decode(raw)
    assert {k: back[k] for k in vals} == vals
    assert table.pack(*table.unpack(raw)) == raw
    assert table.name in table.dump(raw)


@pytest.mark.parametrize("attr", list(cm.TABLES))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_cm_mad_round_trip(attr: cm.CmAttr, data: st.DataObject) -> None:
    vals = data.draw(values_of(cm.TABLES[attr]))
    tid = data.draw(st.integers(0, (1 << 64) - 1))
    mad = cm.cm_mad(attr, tid, vals)
    assert len(mad) == 256 and mad[1] == 0x07 and mad[2] == 2
    msg = cm.parse_cm(mad)
    assert (msg.attr, msg.tid) == (attr, tid)
    assert {k: msg.fields[k] for k in vals} == vals


def test_cm_private_data_sizes_and_padding() -> None:
    want = {"REQ": 92, "MRA": 222, "REJ": 148, "REP": 196, "RTU": 224, "DREQ": 220,
            "DREP": 224, "LAP": 168, "APR": 148, "SIDR_REQ": 216, "SIDR_REP": 136}  # fmt: skip
    assert {a.name: n for a, n in cm.PRIVATE_DATA_SIZE.items()} == want
    mad = cm.cm_mad(cm.CmAttr.RTU, 1, private_data=b"hi")
    assert cm.parse_cm(mad).fields["private_data"] == b"hi" + bytes(222)
    with pytest.raises(FieldError):
        cm.cm_mad(cm.CmAttr.REQ, 1, private_data=bytes(93))
    with pytest.raises(FieldError):
        cm.cm_mad(cm.CmAttr.REJ, 1, reason=34)  # not a REJ reason
    with pytest.raises(FieldError):
        cm.cm_mad(cm.CmAttr.REQ, 1, local_qpn=1 << 24)


def test_cm_known_bytes() -> None:
    """A REQ's packed fields sit where IBA table 106 puts them (MAD byte = 24 + offset)."""
    mad = cm.cm_mad(cm.CmAttr.REQ, 0x1122, local_qpn=0xABCDEF, responder_resources=4,
                    remote_cm_response_timeout=20, transport_type=cm.TransportType.UC,
                    end_to_end_flow_control=True, local_cm_response_timeout=20,
                    retry_count=7, path_mtu=3, rnr_retry_count=7, max_cm_retries=15,
                    primary_sl=5, primary_subnet_local=True, primary_local_ack_timeout=17,
                    alternate_local_ack_timeout=1, sap_supported=True)  # fmt: skip
    d = mad[24:]
    assert d[32:36] == bytes([0xAB, 0xCD, 0xEF, 4])
    assert d[43] == 20 << 3 | 1 << 1 | 1
    assert d[47] == 20 << 3 | 7
    assert d[50] == 3 << 4 | 7 and d[51] == 15 << 4
    assert d[94] == 5 << 4 | 1 << 3 and d[95] == 17 << 3
    assert d[139] == 1 << 3 | 1 << 2
    assert mad[16:18] == b"\x00\x10" and mad[8:16] == (0x1122).to_bytes(8, "big")


@settings(deadline=None)
@given(st.binary(min_size=0, max_size=300), st.integers(0, 0x30), st.booleans())
def test_parse_garbage_raises_field_error_only(junk: bytes, attr: int, cm_class: bool) -> None:
    mad = bytearray(junk)
    if len(mad) >= 18:  # mostly a plausible class and attribute, the rest random
        mad[1] = 0x07 if cm_class else 0x06
        mad[16:18] = attr.to_bytes(2, "big")
    for parse in (cm.parse_cm, dm.parse_dm):
        with contextlib.suppress(FieldError):
            parse(bytes(mad))


@settings(deadline=None)
@given(st.lists(st.sampled_from([0, 1, 0xF]), max_size=256))
def test_controller_list_round_trip(slots: list[int]) -> None:
    raw = dm.controller_list(slots)
    assert len(raw) == 128
    assert dm.controller_slots(raw, len(slots)) == slots
    mad = dm.dm_mad(dm.DmAttr.IO_UNIT_INFO, 7, values={
        "change_id": 3, "max_controllers": len(slots), "option_rom": True,
        "controller_list": raw})  # fmt: skip
    attr, mod, vals = dm.parse_dm(mad)
    assert attr is dm.DmAttr.IO_UNIT_INFO and mod == 0 and vals["controller_list"] == raw
    assert mad[64:68] == bytes([0, 3, len(slots) & 0xFF, 1])  # OptionROM: the last bit


def test_controller_list_first_slot_is_high_nibble() -> None:
    assert dm.controller_list([1, 0xF, 0, 1])[:2] == bytes([0x1F, 0x01])
    with pytest.raises(FieldError):
        dm.controller_list([16])


def test_service_entries_modifier() -> None:
    assert dm.service_entries_modifier(2, 4, 7) == 0x0002_07_04
    assert dm.parse_service_entries_modifier(0x0002_07_04) == (2, 4, 7)
    for bad in ((0, 0, 0), (1, 3, 2), (1, 0, 4)):
        with pytest.raises(FieldError):
            dm.service_entries_modifier(*bad)
    vals: dict[str, Value] = {f"service_name_{n}": f"SRP.T10:{n}".encode().ljust(40, b"\0")
                              for n in range(4)}  # fmt: skip
    vals |= {f"service_id_{n}": 0x0002C90300000000 + n for n in range(4)}
    mad = dm.dm_mad(dm.DmAttr.SERVICE_ENTRIES, 9, method=0x81,
                    modifier=dm.service_entries_modifier(1, 0, 1), values=vals)  # fmt: skip
    _, mod, back = dm.parse_dm(mad)
    assert dm.service_entries(back, 2) == [(b"SRP.T10:0", 0x0002C90300000000),
                                           (b"SRP.T10:1", 0x0002C90300000001)]  # fmt: skip
    assert mod == 0x0001_01_00 and mad[64 + 40 : 64 + 48] == (0x0002C90300000000).to_bytes(8, "big")


def test_parsers_refuse_short_mads_and_other_classes_by_reason() -> None:
    req = cm.cm_mad(cm.CmAttr.RTU, 5, local_comm_id=1, remote_comm_id=2)
    iou = dm.dm_mad(dm.DmAttr.IO_UNIT_INFO, 6)
    for parse, own, other in ((cm.parse_cm, req, iou), (dm.parse_dm, iou, req)):
        with pytest.raises(FieldError) as short:
            parse(own[:255])
        assert short.value.reason == "short"
        with pytest.raises(FieldError) as wrong:
            parse(other)
        assert wrong.value.reason == "type"
