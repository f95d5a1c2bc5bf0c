"""Dump value styles where ibsim cannot show them (libibmad's rules for odd values)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ibal.wire.mad import dump, sa, smp


def test_link_width_and_speed_lists() -> None:
    f = dump.format_value
    assert f("linkwidthen", 8, 0x3) == "1X or 4X"
    assert f("linkwidthsup", 8, 0x2) == "4X (IBA extension)"
    assert f("linkwidthsup", 8, 0) == "undefined (0) (IBA extension)"
    assert f("linkwidthen", 8, 0x21) == "1X or undefined (33)"
    assert f("linkwidth", 8, 3) == "undefined (3)"
    assert f("linkspeedsup", 4, 0x7) == "2.5 Gbps or 5.0 Gbps or 10.0 Gbps"
    assert f("linkspeedsup", 4, 0x6) == "5.0 Gbps or 10.0 Gbps (IBA extension)"
    assert f("linkspeedsup", 4, 0x9) == "2.5 Gbps or undefined (9)"
    assert f("linkspeed", 4, 0) == "Extended speed"
    assert f("linkspeedext", 4, 4) == "53.125 Gbps"
    assert f("linkspeedextsup", 4, 0x3) == "14.0625 Gbps or 25.78125 Gbps"
    assert f("linkspeedexten", 5, 30) == "Extended link speeds disabled"
    assert f("linkspeedexten", 5, 0) == "0"
    assert f("mtu", 4, 5) == "4096" and f("mtu", 4, 9) == "?(9)"
    assert f("opervls", 4, 0) == "No change" and f("vlcap", 4, 5) == "VL0-14"
    assert f("hex", 24, 0x2C9) == "0x0002c9" and f("hex", 4, 0) == "0x00"


def test_capability_mask_lines() -> None:
    v = smp.CapabilityMask.IS_SM | smp.CapabilityMask.IS_COMMUNICATION_MANAGEMENT_SUPPORTED
    assert dump.format_value("portcapmask", 32, int(v)).split("\n") == [
        "0x10002", "\t\t\t\tIsSM", "\t\t\t\tIsCommunicatonManagementSupported"]
    assert dump.format_value("portcapmask2", 16, 0) == "0x0"


def test_field_line_pads_to_column_33() -> None:
    assert dump.field_line("LMC", "0") == "LMC:" + "." * 29 + "0"
    assert dump.field_line("McastPkeyTrapSuppressionEnabled", "0").endswith(":.0")


def test_portid_and_gid_text() -> None:
    assert dump.portid_str(5) == "Lid 5"
    assert dump.portid_str(dr_path=[]) == "DR path slid 65535; dlid 65535; 0"
    assert dump.portid_str(dr_path=[1, 3]) == "DR path slid 65535; dlid 65535; 0,1,3"
    assert dump.ntop(bytes.fromhex("fe800000000000000000000000100003")) == "fe80::10:3"
    assert dump.ntop(bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1])) == "::ffff:10.0.0.1"
    assert dump.ntop(bytes(16)) == "::"


def test_service_record_hides_the_key() -> None:
    rec = sa.SERVICE_RECORD.encode(service_id=0x10, service_key=bytes(range(16)),
                                   service_name=b"srp".ljust(64, b"\0"))
    text = dump.saquery_service_record(rec)
    assert "\t\tServiceKey..............<not displayed>\n" in text
    assert "\t\tServiceName.............srp\n" in text
    shown = dump.saquery_service_record(rec, show_keys=True)
    assert "ServiceKey..............0x000102030405060708090a0b0c0d0e0f" in shown
    assert "\t\tServiceData64.2.........0x0000000000000000\n" in shown


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=256, max_size=256))
def test_any_bytes_dump_without_error(raw: bytes) -> None:
    """Whatever a peer sends, every dump renders it: one line per row (plus bit lists)."""
    target = dump.portid_str(3)
    assert dump.smpquery_nodeinfo(raw, target).count("\n") == 13
    pi = dump.smpquery_portinfo(raw, target, 1)
    assert pi.startswith("# Port info: Lid 3 port 1\nMkey:") and "<not displayed>" in pi
    assert dump.smpquery_switchinfo(raw, target).count("\n") == 19
    assert dump.smpquery_nodedesc(raw).startswith("Node Description:")
    assert dump.perfquery(raw, target, 1, 0x1200).count("\n") == 22
    assert dump.perfquery_ext(raw, target, 1, 0).count("\n") == 7
    assert dump.smpquery_pkeys([raw[:64], raw[64:128]], 64).count("\n") == 9
    assert dump.smpquery_guids([raw[:64]], 8).count("\n") == 5
    for fn in (dump.saquery_node_record, dump.saquery_path_record, dump.saquery_mcmember_record,
               dump.saquery_portinfo_record, dump.saquery_service_record):
        assert fn(raw).endswith("\n")


def test_informinfo_record_vendor_form_and_shown_qpn() -> None:
    """A vendor subscription names DeviceID and VendorID where a generic one has the trap
    number and producer type (the generic form is checked against saquery on ibsim)."""
    rec = sa.INFORM_INFO_RECORD.encode(
        subscriber_gid=bytes(15) + b"\x01", enum=2, is_generic=0, subscribe=1, type=0x7,
        trap_number=0x1234, qpn=0x2A, resp_time_value=3, producer_type=0x02C9,
    )  # fmt: skip
    lines = dump.saquery_informinfo_record(rec).splitlines()
    assert lines[:3] == ["InformInfoRecord dump:", "\t\tRID", "\t\tSubscriberGID...........::1"]
    assert lines[-4:] == ["\t\tdev_id..................0x1234",
                          "\t\tqpn.....................<not displayed>",
                          "\t\tresp_time_val...........0x3",
                          "\t\tvendor_id...............0x0002C9"]  # fmt: skip
    shown = dump.saquery_informinfo_record(rec, show_keys=True).splitlines()
    assert shown[-3] == "\t\tqpn.....................0x00002A"


def _ibroute_switch(top: int, ports: int = 8) -> tuple[bytes, bytes, bytes]:
    ni = smp.NODE_INFO.encode(node_type=2, num_ports=ports, node_guid=0x20, port_guid=0x20)
    return ni, b"sw\x01one\xff\0junk", smp.SWITCH_INFO.encode(linear_fdb_top=top)


def test_ibroute_quirks() -> None:
    """ibroute's own edges: END on a block boundary is not read, unprintable description
    bytes are spaces, a destination that did not answer, an out port past the last port."""
    ni, nd, si = _ibroute_switch(top=64)
    span = dump.ibroute_span(si)
    assert span == (0, 64) and dump.ibroute_blocks(span) == range(0, 1)
    assert dump.ibroute_blocks(dump.ibroute_span(si, 70, 0)) == range(1, 1)
    assert dump.ibroute_span(_ibroute_switch(top=0xC005)[2], 3) == (3, 0xBFFF)
    lft = bytes([0xFF, 1, 0, 9] + [0xFF] * 60)
    dest = smp.NODE_INFO.encode(node_type=1, port_guid=0x11)
    dests: dict[int, dump.LidInfo | None] = {1: (dest, smp.PORT_INFO.encode(lid=1), b"h\tx\0y"),
                                              2: None}  # fmt: skip
    text = dump.ibroute(ni, nd, "Lid 2", (0, 3), {0: lft}, dests, all_lids=True)
    assert text.splitlines() == [
        "Unicast lids [0x0-0x3] of switch Lid 2 guid 0x0000000000000020 (sw one ):",
        "  Lid  Out   Destination", "       Port     Info ",
        "0x0000 255 : (path #0 - illegal port)",  # LID 0 is in the "last" range (0-0)
        "0x0001 001 : (Channel Adapter portguid 0x0000000000000011: 'h x')",
        "0x0002 000 : (unknown node and type)",
        "0x0003 009 : (illegal port)",
        "4 lids dumped ",
    ]  # fmt: skip
    brief = dump.ibroute(ni, nd, "Lid 2", (1, 2), {0: lft}, None)
    assert brief.splitlines()[3:] == ["0x0001 001 ", "0x0002 000 ", "2 valid lids dumped "]
