"""The MAD field tables: round trips, validation, component masks, header helpers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibal.wire.fields import FieldError, Kind, Table
from ibal.wire.mad import header, perf, sa, smp
from ibal.wire.mad.consts import DR_DIRECTION, MadStatus, Method, MgmtClass, SaAttr, SmpAttr

TABLES: list[Table] = [
    header.MAD_HEADER, header.DR_HEADER, header.SMP, header.DR_SMP, header.SA_HEADER,
    header.PERF_HEADER, header.CLASS_PORT_INFO,
    smp.NODE_DESCRIPTION, smp.NODE_INFO, smp.SWITCH_INFO, smp.GUID_INFO, smp.PKEY_TABLE,
    smp.LINEAR_FORWARDING_TABLE, smp.SM_INFO, smp.PORT_INFO,
    perf.PORT_COUNTERS, perf.PORT_COUNTERS_EXT,
    sa.NODE_RECORD, sa.PORT_INFO_RECORD, sa.PATH_RECORD, sa.SERVICE_RECORD, sa.MCMEMBER_RECORD,
    sa.INFORM_INFO, sa.INFORM_INFO_RECORD, sa.NOTICE, sa.TRAP_64_65_DETAILS, sa.TRAP_128_DETAILS,
    sa.TRAP_144_DETAILS, sa.LINK_RECORD, sa.GUID_INFO_RECORD,
]  # fmt: skip
IDS = [t.name for t in TABLES]


def _values(t: Table) -> st.SearchStrategy[dict[str, int | bytes]]:
    parts: dict[str, st.SearchStrategy[int | bytes]] = {}
    for p in t.values:
        f = p.field
        if f.kind in (Kind.BYTES, Kind.GID, Kind.IPV4, Kind.IPV6, Kind.MAC):
            parts[f.name] = st.binary(min_size=f.bits // 8, max_size=f.bits // 8)
        else:
            parts[f.name] = st.integers(0, p.mask)
    return st.fixed_dictionaries(parts)


def _zero_reserved(t: Table, buf: bytes) -> bytes:
    """``buf`` with every reserved bit and every byte no field covers cleared."""
    keep = 0
    for p in t.values:
        keep |= p.mask << (t.size * 8 - p.offset - p.field.bits)
    return (int.from_bytes(buf, "big") & keep).to_bytes(t.size, "big")


@pytest.mark.parametrize("table", TABLES, ids=IDS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_round_trip(table: Table, data: st.DataObject) -> None:
    values = data.draw(_values(table))
    wire = table.encode(values)
    assert len(wire) == table.size
    table.validate(wire, enums=False)
    got = table.decode(wire)
    assert {k: got[k] for k in table.names} == values
    # and from the bytes side: any buffer with reserved bits zero comes back unchanged
    raw = _zero_reserved(table, data.draw(st.binary(min_size=table.size, max_size=table.size)))
    assert table.pack(*table.unpack(raw)) == raw
    assert table.encode(table.decode(raw)) == raw


WITH_RESERVED = [t for t in TABLES if any(p.field.reserved for p in t.fields)]


@pytest.mark.parametrize("table", WITH_RESERVED, ids=[t.name for t in WITH_RESERVED])
def test_reserved_bits_are_rejected_and_named(table: Table) -> None:
    for p in (p for p in table.fields if p.field.reserved):
        # only the reserved field's top bit set
        buf = (1 << (table.size * 8 - p.offset - 1)).to_bytes(table.size, "big")
        with pytest.raises(FieldError) as e:
            table.validate(buf)
        assert e.value.reason == "reserved" and e.value.field == p.name
        with pytest.raises(FieldError) as e:
            table.encode(table.decode(buf))
        assert e.value.reason == "reserved" and e.value.field == p.name


@pytest.mark.parametrize("table", TABLES, ids=IDS)
def test_short_buffer_and_range_errors_name_the_field(table: Table) -> None:
    with pytest.raises(FieldError) as e:
        table.decode(bytes(table.size - 1))
    assert e.value.reason == "short" and table.name in str(e.value)
    ints = [p for p in table.values if p.field.kind is Kind.UINT]
    if not ints:  # the PerfMgt header is all reserved
        assert table.encode() == bytes(table.size)
        return
    p = ints[-1]
    with pytest.raises(FieldError) as e:
        table.encode({p.name: p.mask + 1})
    assert (e.value.reason, e.value.field) == ("range", p.name)


def test_layouts_match_iba_offsets() -> None:
    """Spot checks of bit offsets that the IBA tables (and libibmad's) give."""
    pi = smp.PORT_INFO.by_name
    assert smp.PORT_INFO.size == 64 and smp.NODE_INFO.size == 40
    assert (pi["lid"].offset, pi["capability_mask"].offset, pi["lmc"].offset) == (128, 160, 277)
    assert (pi["resp_time_value"].offset, pi["link_round_trip_latency"].offset) == (419, 456)
    assert (pi["capability_mask2"].offset, pi["link_speed_ext_enabled"].offset) == (480, 507)
    assert perf.PORT_COUNTERS.by_name["qp1_dropped"].offset == 160
    assert perf.PORT_COUNTERS_EXT.by_name["port_xmit_data"].offset == 64
    assert sa.PATH_RECORD.size == 64 and sa.NODE_RECORD.size == 108
    assert sa.PORT_INFO_RECORD.size == 68 and sa.MCMEMBER_RECORD.size == 52
    assert sa.SERVICE_RECORD.size == 176 and sa.NOTICE.size == 80
    assert sa.GUID_INFO_RECORD.size == 72 and sa.INFORM_INFO.size == 36
    assert header.DR_SMP.by_name["initial_path"].offset == 128 * 8
    assert header.CLASS_PORT_INFO.size == 72


def test_component_mask_bits_follow_table_order() -> None:
    """Bit numbers as IBA 15.2.5 (and OpenSM's IB_*_COMPMASK_*) number them."""
    pir = sa.component_bits(sa.PORT_INFO_RECORD)
    assert (pir["endport_lid"], pir["options"], pir["m_key"], pir["lmc"]) == (0, 2, 3, 20)
    assert (pir["client_reregister"], pir["subnet_timeout"], pir["resp_time_value"]) == (43, 45, 47)
    assert (pir["capability_mask2"], pir["link_speed_ext_enabled"]) == (53, 57)
    assert sa.component_bits(sa.NODE_RECORD)["node_string"] == 14
    pr = sa.component_bits(sa.PATH_RECORD)
    assert (pr["dgid"], pr["slid"], pr["p_key"], pr["sl"], pr["preference"]) == (2, 5, 13, 15, 22)
    assert sa.component_mask(sa.PATH_RECORD, ["service_id"]) == 0b11
    mc = sa.component_bits(sa.MCMEMBER_RECORD)
    assert (mc["mlid"], mc["join_state"], mc["proxy_join"]) == (3, 16, 17)
    assert sa.component_bits(sa.GUID_INFO_RECORD)["guid0"] == 4
    lr = sa.component_bits(sa.LINK_RECORD)
    assert (lr["from_lid"], lr["from_port"], lr["to_port"], lr["to_lid"]) == (0, 1, 2, 3)
    assert sa.component_bits(sa.SERVICE_RECORD)["service_data64_1"] == 36
    with pytest.raises(FieldError) as e:
        sa.component_mask(sa.PATH_RECORD, ["no_such"])
    assert e.value.field == "no_such"


def test_build_and_respond_a_directed_route_smp() -> None:
    req = header.build(MgmtClass.SUBN_DR, Method.GET, SmpAttr.PORT_INFO, tid=0x1234,
                       attr_mod=3, dr_path=[1, 4])  # fmt: skip
    d = header.DR_SMP.decode(req)
    assert (d["method"], d["attr_id"], d["attr_mod"], d["tid"]) == (1, 0x15, 3, 0x1234)
    assert (d["hop_count"], d["hop_pointer"], d["d"]) == (2, 0, 0)
    assert (d["dr_slid"], d["dr_dlid"]) == (0xFFFF, 0xFFFF)
    assert bytes(d["initial_path"])[:3] == bytes([0, 1, 4])  # type: ignore[index]
    data = smp.PORT_INFO.encode(lid=7)
    resp = header.respond(req, status=MadStatus.INVALID_FIELD, data=data)
    h = header.header(resp)
    assert h.method == Method.GET_RESP and h.tid == 0x1234
    assert h.status == DR_DIRECTION | MadStatus.INVALID_FIELD
    assert smp.PORT_INFO.decode(header.payload(resp))["lid"] == 7
    assert len(header.payload(resp)) == 64
    assert resp[128:131] == bytes([0, 1, 4])  # the initial path survives the new data
    with pytest.raises(FieldError):
        header.respond(req, data=bytes(65))


def test_build_an_sa_query() -> None:
    rec = sa.NODE_RECORD.encode(lid=9)
    mask = sa.component_mask(sa.NODE_RECORD, ["lid"])
    q = header.build(MgmtClass.SUBN_ADM, Method.GET_TABLE, SaAttr.NODE_RECORD, tid=7,
                     comp_mask=mask, data=rec)  # fmt: skip
    assert header.header(q).class_version == 2
    sah = header.SA_HEADER.decode(q, header.SA_HEADER_OFFSET)
    assert sah["comp_mask"] == 1
    assert bytes(header.payload(q)[: sa.NODE_RECORD.size]) == rec
    r = header.respond(q)
    assert r[3] == Method.GET_TABLE_RESP
    with pytest.raises(FieldError) as e:
        header.build(MgmtClass.SUBN_ADM, 0x1FF, 0x11, tid=1)
    assert e.value.field == "method"
    with pytest.raises(FieldError) as e:
        header.build(MgmtClass.SUBN_ADM, 1, 0x11, tid=1, data=bytes(201))
    assert e.value.reason == "range"


def test_short_mad_header_is_an_error() -> None:
    with pytest.raises(FieldError) as e:
        header.header(bytes(23))
    assert e.value.reason == "short"
    with pytest.raises(FieldError):
        header.respond(bytes(100))


def test_the_wire_layer_does_not_import_the_access_layer() -> None:
    import subprocess
    import sys

    code = ("import sys, ibal.wire.mad.dump, ibal.wire.mad.sa, ibal.wire.mad.perf, "
            "ibal.wire.mad.header; "
            "print(sorted(m for m in sys.modules if m.startswith('ibal.al')))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
