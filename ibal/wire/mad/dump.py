"""Attribute dumps in infiniband-diags' format (``smpquery``, ``perfquery``, ``saquery``).

A dump is a list of rows ``(label, field, style)`` over one of our tables:
``label`` is the name libibmad prints, ``field`` ours, ``style`` how
libibmad's ``mad_dump_*`` family renders the value (``uint``, ``hex`` zero
padded to the field's whole bytes, link width/speed lists, states, MTU and VL
codes, capability bit lists...).  A line is the label, a colon, dots up to
column 33 and the value: ``LinkWidthEnabled:................4X``.

The ``smpquery_*``/``perfquery*``/``saquery_*`` functions produce exactly what
those tools print for the same attribute (header line included), so their
output can be compared line by line with the real tools (tests/mad).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from ibal.wire.fields import Buffer, Table, Value
from ibal.wire.mad import header, perf, smp
from ibal.wire.mad.consts import PM_EXT_WIDTH_SUPPORTED, PM_PC_XMIT_WAIT_SUP
from ibal.wire.mad.smp import CapabilityMask, CapabilityMask2

__all__ = [
    "IBROUTE_MAX_LID", "LidInfo", "field_line", "fields", "format_value", "ibroute",
    "ibroute_blocks", "ibroute_entries", "ibroute_span", "ntop", "perfquery", "perfquery_ext",
    "portid_str",
    "saquery_class_port_info", "saquery_guidinfo_record", "saquery_informinfo_record",
    "saquery_link_record",
    "saquery_mcmember_group", "saquery_mcmember_member", "saquery_mcmember_record",
    "saquery_node_record", "saquery_path_record", "saquery_portinfo_brief",
    "saquery_portinfo_record", "saquery_service_record", "sminfo", "smpquery_guids",
    "smpquery_nodedesc", "smpquery_nodeinfo", "smpquery_pkeys", "smpquery_portinfo",
    "smpquery_switchinfo",
]  # fmt: skip

NOT_DISPLAYED: Final = "<not displayed>"
Row = tuple[str, str, str]  # label, field, style

# ------------------------------------------------------------- value styles


def _or_list(v: int, names: Sequence[tuple[int, str]]) -> str:
    return " or ".join(n for bit, n in names if v & bit)


_WIDTHS = ((1, "1X"), (2, "4X"), (4, "8X"), (8, "12X"), (16, "2X"))
_SPEEDS = ((1, "2.5 Gbps"), (2, "5.0 Gbps"), (4, "10.0 Gbps"))
_EXT_SPEEDS = ((1, "14.0625 Gbps"), (2, "25.78125 Gbps"), (4, "53.125 Gbps"), (8, "106.25 Gbps"))


def _width_list(v: int) -> str:
    s = _or_list(v, _WIDTHS)
    if v == 0 or v >> 5:
        return f"{s} or undefined ({v})" if s else f"undefined ({v})"
    return s


def _width_sup(v: int) -> str:
    s = _width_list(v)
    if v not in (1, 3, 7, 11, 15, 17, 19, 23, 27, 31) and not v >> 5:
        s += " (IBA extension)"
    return s


def _speed_list(v: int) -> str:
    s = _or_list(v, _SPEEDS)
    if v == 0 or v >> 3:
        s = f"{s} or undefined ({v})" if s else f"undefined ({v})"
    if v not in (1, 3, 5, 7) and not v >> 3:
        s += " (IBA extension)"
    return s


def _ext_speed_list(v: int) -> str:
    if v == 0:
        return "0"
    s = _or_list(v, _EXT_SPEEDS)
    if v >> 4:
        return f"{s} or undefined ({v})" if s else f"undefined ({v})"
    return s


def _ext_speed_en(v: int) -> str:
    return "Extended link speeds disabled" if v == 30 else _ext_speed_list(v)


def _table(names: Mapping[int, str], fallback: str) -> Callable[[int], str]:
    return lambda v: names.get(v, fallback.format(v))


_VLS = {1: "VL0", 2: "VL0-1", 3: "VL0-3", 4: "VL0-7", 5: "VL0-14"}
_CAP_NAMES: Final[dict[str, str]] = {  # where libibmad's spelling is not the CamelCase name
    "IS_COMMUNICATION_MANAGEMENT_SUPPORTED": "IsCommunicatonManagementSupported",
    "IS_SNMP_TUNNELING_SUPPORTED": "IsSNMPTunnelingSupported",
    "IS_SM_DISABLED": "IsSMdisabled",
    "IS_SYSTEM_IMAGE_GUID_SUPPORTED": "IsSystemImageGUIDsupported",
    "IS_DR_NOTICE_SUPPORTED": "IsDRNoticeSupported",
    "IS_MKEY_NVRAM": "IsMKeyNVRAM",
    "IS_PKEY_NVRAM": "IsPKeyNVRAM",
    "IS_OPTIONAL_IPD_SUPPORTED": "IsOptionalIPDSupported",
    "IS_SL_MAPPING_SUPPORTED": "IsSLMappingSupported",
    "IS_SM": "IsSM",
    "IS_MULTICAST_FDB_TOP_SUPPORTED": "IsMulticastFDBTopSupported",
    "IS_LINK_WIDTH_2X_SUPPORTED": "IsLinkWidth2xSupported",
    "IS_LINK_SPEED_HDR_SUPPORTED": "IsLinkSpeedHDRSupported",
    "IS_LINK_SPEED_NDR_SUPPORTED": "IsLinkSpeedNDRSupported",
    "IS_MKEY_PROTECT_BITS_EXT_SUPPORTED": "IsMKeyProtectBitsExtSupported",
    "IS_ENHANCED_QOS_ARBITER_SUPPORTED": "IsEnhancedQoSArbiterSupported",
    "IS_ENHANCED_TRAP128_SUPPORTED": "IsEnhancedTrap128Supported",
}


def _camel(name: str) -> str:
    """libibmad's spelling of a capability bit (``IsTrapSupported``...)."""
    return _CAP_NAMES.get(name) or "".join(w.capitalize() for w in name.split("_"))


def _capmask(flags: type[CapabilityMask] | type[CapabilityMask2]) -> Callable[[int], str]:
    bits = [(int(m), _camel(m.name or "")) for m in flags]

    def fmt(v: int) -> str:
        return "\n".join([f"{v:#x}", *(f"\t\t\t\t{n}" for b, n in bits if v & b)])

    return fmt


def _node_type(v: int) -> str:
    return {1: "Channel Adapter", 2: "Switch", 3: "Router"}.get(v, f"?({v})?")


_SPEED_ACTIVE = {0: "Extended speed", 1: "2.5 Gbps", 2: "5.0 Gbps", 4: "10.0 Gbps"}
_EXT_SPEED_ACTIVE = {0: "No Extended Speed", **dict(_EXT_SPEEDS)}
_PORT_STATES = {0: "NoChange", 1: "Down", 2: "Initialize", 3: "Armed", 4: "Active"}
_PHYS_STATES = {0: "NoChange", 1: "Sleep", 2: "Polling", 3: "Disabled",
                4: "PortConfigurationTraining", 5: "LinkUp", 6: "LinkErrorRecovery",
                7: "PhyTest"}  # fmt: skip

STYLES: Final[dict[str, Callable[[int], str]]] = {
    "uint": str,
    "node_type": _node_type,
    "linkwidth": _table({1: "1X", 2: "4X", 4: "8X", 8: "12X", 16: "2X"}, "undefined ({})"),
    "linkwidthsup": _width_sup,
    "linkwidthen": _width_list,
    "linkspeed": _table(_SPEED_ACTIVE, "undefined ({})"),
    "linkspeedsup": _speed_list,
    "linkspeeden": _speed_list,
    "linkspeedext": _table(_EXT_SPEED_ACTIVE, "undefined ({})"),
    "linkspeedextsup": _ext_speed_list,
    "linkspeedexten": _ext_speed_en,
    "portstate": _table(_PORT_STATES, "?({})"),
    "physportstate": _table(_PHYS_STATES, "?({})"),
    "linkdowndefstate": _table({0: "NoChange", 1: "Sleep", 2: "Polling"}, "?({})"),
    "mtu": _table({1: "256", 2: "512", 3: "1024", 4: "2048", 5: "4096"}, "?({})"),
    "vlcap": _table(_VLS, "?({})"),
    "opervls": _table({0: "No change", **_VLS}, "?({})"),
    "portcapmask": _capmask(CapabilityMask),
    "portcapmask2": _capmask(CapabilityMask2),
}


def format_value(style: str, bits: int, v: Value) -> str:
    """``v`` rendered like libibmad's ``mad_dump_<style>`` for a ``bits``-wide field."""
    if isinstance(v, bytes | bytearray):
        return bytes(v).hex()
    if style == "hex":
        return f"0x{v:0{(bits + 7) // 8 * 2}x}"
    return STYLES[style](int(v))


def field_line(label: str, value: str) -> str:
    """``label:`` and dots to column 33, then the value (``mad_dump_field``)."""
    return f"{label}:{'.' * (32 - len(label)) if len(label) < 32 else ''}{value}"


def fields(table: Table, rows: Sequence[Row], buf: Buffer, off: int = 0,
           tabs: int = 0, override: Mapping[str, str] | None = None) -> list[str]:  # fmt: skip
    """The dump lines of ``rows`` for the attribute at ``buf[off:]``."""
    d = table.decode(buf, off)
    out = []
    for label, name, style in rows:
        if override and name in override:
            value = override[name]
        else:
            value = format_value(style, table.by_name[name].field.bits, d[name])
        out.append("\t" * tabs + field_line(label, value))
    return out


# ------------------------------------------------------------- the tables' rows

NODE_INFO_ROWS: Final[tuple[Row, ...]] = (
    ("BaseVers", "base_version", "uint"),
    ("ClassVers", "class_version", "uint"),
    ("NodeType", "node_type", "node_type"),
    ("NumPorts", "num_ports", "uint"),
    ("SystemGuid", "system_image_guid", "hex"),
    ("Guid", "node_guid", "hex"),
    ("PortGuid", "port_guid", "hex"),
    ("PartCap", "partition_cap", "uint"),
    ("DevId", "device_id", "hex"),
    ("Revision", "revision", "hex"),
    ("LocalPort", "local_port_num", "uint"),
    ("VendorId", "vendor_id", "hex"),
)

PORT_INFO_ROWS: Final[tuple[Row, ...]] = (
    ("Mkey", "m_key", "hex"),
    ("GidPrefix", "gid_prefix", "hex"),
    ("Lid", "lid", "uint"),
    ("SMLid", "master_sm_lid", "uint"),
    ("CapMask", "capability_mask", "portcapmask"),
    ("DiagCode", "diag_code", "hex"),
    ("MkeyLeasePeriod", "m_key_lease_period", "uint"),
    ("LocalPort", "local_port_num", "uint"),
    ("LinkWidthEnabled", "link_width_enabled", "linkwidthen"),
    ("LinkWidthSupported", "link_width_supported", "linkwidthsup"),
    ("LinkWidthActive", "link_width_active", "linkwidth"),
    ("LinkSpeedSupported", "link_speed_supported", "linkspeedsup"),
    ("LinkState", "port_state", "portstate"),
    ("PhysLinkState", "port_phys_state", "physportstate"),
    ("LinkDownDefState", "link_down_default_state", "linkdowndefstate"),
    ("ProtectBits", "m_key_protect_bits", "uint"),
    ("LMC", "lmc", "uint"),
    ("LinkSpeedActive", "link_speed_active", "linkspeed"),
    ("LinkSpeedEnabled", "link_speed_enabled", "linkspeeden"),
    ("NeighborMTU", "neighbor_mtu", "mtu"),
    ("SMSL", "master_sm_sl", "uint"),
    ("VLCap", "vl_cap", "vlcap"),
    ("InitType", "init_type", "hex"),
    ("VLHighLimit", "vl_high_limit", "uint"),
    ("VLArbHighCap", "vl_arbitration_high_cap", "uint"),
    ("VLArbLowCap", "vl_arbitration_low_cap", "uint"),
    ("InitReply", "init_type_reply", "hex"),
    ("MtuCap", "mtu_cap", "mtu"),
    ("VLStallCount", "vl_stall_count", "uint"),
    ("HoqLife", "hoq_life", "uint"),
    ("OperVLs", "operational_vls", "opervls"),
    ("PartEnforceInb", "partition_enforcement_inbound", "uint"),
    ("PartEnforceOutb", "partition_enforcement_outbound", "uint"),
    ("FilterRawInb", "filter_raw_inbound", "uint"),
    ("FilterRawOutb", "filter_raw_outbound", "uint"),
    ("MkeyViolations", "m_key_violations", "uint"),
    ("PkeyViolations", "p_key_violations", "uint"),
    ("QkeyViolations", "q_key_violations", "uint"),
    ("GuidCap", "guid_cap", "uint"),
    ("ClientReregister", "client_reregister", "uint"),
    ("McastPkeyTrapSuppressionEnabled", "multicast_pkey_trap_suppression_enabled", "uint"),
    ("SubnetTimeout", "subnet_timeout", "uint"),
    ("RespTimeVal", "resp_time_value", "uint"),
    ("LocalPhysErr", "local_phy_errors", "uint"),
    ("OverrunErr", "overrun_errors", "uint"),
    ("MaxCreditHint", "max_credit_hint", "uint"),
    ("RoundTrip", "link_round_trip_latency", "uint"),
    ("CapabilityMask2", "capability_mask2", "portcapmask2"),
    ("LinkSpeedExtActive", "link_speed_ext_active", "linkspeedext"),
    ("LinkSpeedExtSupported", "link_speed_ext_supported", "linkspeedextsup"),
    ("LinkSpeedExtEnabled", "link_speed_ext_enabled", "linkspeedexten"),
)

SWITCH_INFO_ROWS: Final[tuple[Row, ...]] = (
    ("LinearFdbCap", "linear_fdb_cap", "uint"),
    ("RandomFdbCap", "random_fdb_cap", "uint"),
    ("McastFdbCap", "multicast_fdb_cap", "uint"),
    ("LinearFdbTop", "linear_fdb_top", "uint"),
    ("DefPort", "default_port", "uint"),
    ("DefMcastPrimPort", "default_multicast_primary_port", "uint"),
    ("DefMcastNotPrimPort", "default_multicast_not_primary_port", "uint"),
    ("LifeTime", "life_time_value", "uint"),
    ("StateChange", "port_state_change", "uint"),
    ("OptSLtoVLMapping", "optimized_sl_to_vl_mapping_programming", "uint"),
    ("LidsPerPort", "lids_per_port", "uint"),
    ("PartEnforceCap", "partition_enforcement_cap", "uint"),
    ("InboundPartEnf", "inbound_enforcement_cap", "uint"),
    ("OutboundPartEnf", "outbound_enforcement_cap", "uint"),
    ("FilterRawInbound", "filter_raw_inbound_cap", "uint"),
    ("FilterRawOutbound", "filter_raw_outbound_cap", "uint"),
    ("EnhancedPort0", "enhanced_port0", "uint"),
    ("MulticastFDBTop", "multicast_fdb_top", "hex"),
)

SM_INFO_ROWS: Final[tuple[Row, ...]] = (
    ("SmInfoGuid", "guid", "hex"),
    ("SmInfoKey", "sm_key", "hex"),
    ("SmActivity", "act_count", "uint"),
    ("SmPriority", "priority", "uint"),
    ("SmState", "sm_state", "uint"),
)

PORT_COUNTERS_ROWS: Final[tuple[Row, ...]] = (
    ("PortSelect", "port_select", "uint"),
    ("CounterSelect", "counter_select", "hex"),
    ("SymbolErrorCounter", "symbol_error_counter", "uint"),
    ("LinkErrorRecoveryCounter", "link_error_recovery_counter", "uint"),
    ("LinkDownedCounter", "link_downed_counter", "uint"),
    ("PortRcvErrors", "port_rcv_errors", "uint"),
    ("PortRcvRemotePhysicalErrors", "port_rcv_remote_physical_errors", "uint"),
    ("PortRcvSwitchRelayErrors", "port_rcv_switch_relay_errors", "uint"),
    ("PortXmitDiscards", "port_xmit_discards", "uint"),
    ("PortXmitConstraintErrors", "port_xmit_constraint_errors", "uint"),
    ("PortRcvConstraintErrors", "port_rcv_constraint_errors", "uint"),
    ("CounterSelect2", "counter_select2", "hex"),
    ("LocalLinkIntegrityErrors", "local_link_integrity_errors", "uint"),
    ("ExcessiveBufferOverrunErrors", "excessive_buffer_overrun_errors", "uint"),
    ("QP1Dropped", "qp1_dropped", "uint"),
    ("VL15Dropped", "vl15_dropped", "uint"),
    ("PortXmitData", "port_xmit_data", "uint"),
    ("PortRcvData", "port_rcv_data", "uint"),
    ("PortXmitPkts", "port_xmit_pkts", "uint"),
    ("PortRcvPkts", "port_rcv_pkts", "uint"),
    ("PortXmitWait", "port_xmit_wait", "uint"),
)

PORT_COUNTERS_EXT_ROWS: Final[tuple[Row, ...]] = (
    ("PortSelect", "port_select", "uint"),
    ("CounterSelect", "counter_select", "hex"),
    ("PortXmitData", "port_xmit_data", "uint"),
    ("PortRcvData", "port_rcv_data", "uint"),
    ("PortXmitPkts", "port_xmit_pkts", "uint"),
    ("PortRcvPkts", "port_rcv_pkts", "uint"),
    ("PortUnicastXmitPkts", "port_unicast_xmit_pkts", "uint"),
    ("PortUnicastRcvPkts", "port_unicast_rcv_pkts", "uint"),
    ("PortMulticastXmitPkts", "port_multicast_xmit_pkts", "uint"),
    ("PortMulticastRcvPkts", "port_multicast_rcv_pkts", "uint"),
)

# ------------------------------------------------------------- smpquery / perfquery


def portid_str(lid: int = 0, dr_path: Sequence[int] | None = None,
               dr_slid: int = 0xFFFF, dr_dlid: int = 0xFFFF) -> str:  # fmt: skip
    """How the tools name a target: ``Lid 2``, or ``DR path slid 65535; dlid 65535; 0,1``.

    ``dr_path`` lists the out ports of the hops (``[]``: the local port).
    """
    if lid > 0 and not dr_path:
        return f"Lid {lid}"
    hops = "".join(f",{p}" for p in (dr_path or []))
    dr = f"DR path slid {dr_slid}; dlid {dr_dlid}; 0{hops}"
    return f"Lid {lid} {dr}" if lid > 0 else dr


def _text(lines: Sequence[str]) -> str:
    return "".join(line + "\n" for line in lines)


def smpquery_nodeinfo(data: Buffer, target: str) -> str:
    """``smpquery nodeinfo`` for a NodeInfo attribute."""
    return _text([f"# Node info: {target}", *fields(smp.NODE_INFO, NODE_INFO_ROWS, data)])


def _portinfo_lines(data: Buffer, off: int, table: Table, tabs: int, show_keys: bool) -> list[str]:
    hide = None if show_keys else {"m_key": NOT_DISPLAYED}
    return fields(table, PORT_INFO_ROWS, data, off, tabs, hide)


def smpquery_portinfo(data: Buffer, target: str, port: int = 0, *, show_keys: bool = False) -> str:
    """``smpquery portinfo`` (M_Key hidden unless ``show_keys``, like ``-K``)."""
    lines = _portinfo_lines(data, 0, smp.PORT_INFO, 0, show_keys)
    return _text([f"# Port info: {target} port {port}", *lines])


def smpquery_switchinfo(data: Buffer, target: str) -> str:
    """``smpquery switchinfo``."""
    return _text([f"# Switch info: {target}", *fields(smp.SWITCH_INFO, SWITCH_INFO_ROWS, data)])


def _cstring(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("utf-8", errors="replace")


def smpquery_nodedesc(data: Buffer) -> str:
    """``smpquery nodedesc``: its dots depend on the description's length, not the label's."""
    desc = _cstring(bytes(data[: smp.NODE_DESCRIPTION.size]))
    dots = "." * (32 - len(desc)) if len(desc) < 32 else "."
    return f"Node Description:{dots}{desc}\n"


def smpquery_pkeys(blocks: Sequence[Buffer], capacity: int) -> str:
    """``smpquery pkeys``: P_KeyTable blocks (32 entries each) up to ``capacity`` entries."""
    out = []
    nblocks = (capacity + 31) // 32
    for i in range(nblocks):
        keys = smp.PKEY_TABLE.unpack(blocks[i])
        k = ((capacity + 7 - i * 32) // 8) * 8 if i + 1 == nblocks else 32
        for j in range(0, k, 8):
            out.append(f"{i * 32 + j:4d}: " + " ".join(f"0x{x:04x}" for x in keys[j : j + 8]))
    out.append(f"{capacity} pkeys capacity for this port")
    return _text(out)


def smpquery_guids(blocks: Sequence[Buffer], capacity: int) -> str:
    """``smpquery guids``: GUIDInfo blocks (8 GUIDs each) up to ``capacity`` (GUIDCap)."""
    out = []
    nblocks = (capacity + 7) // 8
    for i in range(nblocks):
        guids = smp.GUID_INFO.unpack(blocks[i])
        k = ((capacity + 1 - i * 8) // 2) * 2 if i + 1 == nblocks else 8
        for j in range(0, k, 2):
            out.append(f"{i * 8 + j:4d}: 0x{guids[j]:016x} 0x{guids[j + 1]:016x}")
    out.append(f"{capacity} guids capacity for this port")
    return _text(out)


def perfquery(data: Buffer, target: str, port: int, cap_mask: int) -> str:
    """``perfquery``: PortCounters (PortXmitWait shown 0 when the PMA does not claim it)."""
    over = None if cap_mask & PM_PC_XMIT_WAIT_SUP else {"port_xmit_wait": "0"}
    lines = fields(perf.PORT_COUNTERS, PORT_COUNTERS_ROWS, data, override=over)
    return _text([f"# Port counters: {target} port {port} (CapMask: 0x{cap_mask:02X})", *lines])


def perfquery_ext(data: Buffer, target: str, port: int, cap_mask: int, cap_mask2: int = 0) -> str:
    """``perfquery -x``: PortCountersExtended (the 4 packet-type counters need the cap bit)."""
    rows = PORT_COUNTERS_EXT_ROWS
    if not cap_mask & PM_EXT_WIDTH_SUPPORTED:
        rows = rows[:6]
    head = (f"# Port extended counters: {target} port {port} "
            f"(CapMask: 0x{cap_mask:02X} CapMask2: 0x{cap_mask2:07X})")  # fmt: skip
    return _text([head, *fields(perf.PORT_COUNTERS_EXT, rows, data)])


# ------------------------------------------------------------- saquery


def ntop(gid: bytes) -> str:
    """A GID as glibc's ``inet_ntop(AF_INET6)`` writes it (dotted tail for v4-mapped/compatible)."""
    a = ipaddress.IPv6Address(gid)
    words = [int.from_bytes(gid[i : i + 2], "big") for i in range(0, 16, 2)]
    if not any(words[:5]) and words[5] in (0, 0xFFFF) and (words[5] or any(words[6:7])):
        v4 = ipaddress.IPv4Address(gid[12:])
        return f"::ffff:{v4}" if words[5] else f"::{v4}"
    return a.compressed


def _split(d: Mapping[str, Value]) -> tuple[dict[str, int], dict[str, bytes]]:
    """A decoded record as its integer fields and its byte fields."""
    ints = {k: v for k, v in d.items() if isinstance(v, int)}
    return ints, {k: bytes(v) for k, v in d.items() if not isinstance(v, int)}


def _sa_pairs(pairs: Sequence[tuple[str, str]], width: int = 24) -> list[str]:
    # saquery pads its labels with dots to 24 columns (27 in its newer dumps), after two tabs
    return [f"\t\t{k}{'.' * (width - len(k))}{v}" for k, v in pairs]


def _sa_lines(head: str, pairs: Sequence[tuple[str, str]]) -> str:
    return _text([head, *_sa_pairs(pairs)])


_SA_NODE_TYPES: Final = {1: "Channel Adapter", 2: "Switch", 3: "Router"}


def saquery_node_record(rec: Buffer) -> str:
    """``saquery NR``'s dump of one NodeRecord."""
    from ibal.wire.mad import sa  # the SA's tables: only for saquery's dumps

    d, b = _split(sa.NODE_RECORD.decode(rec))
    return _sa_lines("NodeRecord dump:", [
        ("lid", f"{d['lid']}"),
        ("reserved", f"0x{d['resv_16']:X}"),
        ("base_version", f"0x{d['base_version']:X}"),
        ("class_version", f"0x{d['class_version']:X}"),
        ("node_type", _SA_NODE_TYPES.get(d["node_type"], "UNKNOWN")),
        ("num_ports", f"{d['num_ports']}"),
        ("sys_guid", f"0x{d['system_image_guid']:016x}"),
        ("node_guid", f"0x{d['node_guid']:016x}"),
        ("port_guid", f"0x{d['port_guid']:016x}"),
        ("partition_cap", f"0x{d['partition_cap']:X}"),
        ("device_id", f"0x{d['device_id']:X}"),
        ("revision", f"0x{d['revision']:X}"),
        ("port_num", f"{d['local_port_num']}"),
        ("vendor_id", f"0x{d['vendor_id']:X}"),
        ("NodeDescription", _cstring(b["node_string"])),
    ])  # fmt: skip


def saquery_portinfo_record(rec: Buffer, *, show_keys: bool = False) -> str:
    """``saquery PIR``'s dump of one PortInfoRecord (the PortInfo as smpquery prints it)."""
    from ibal.wire.mad import sa  # the SA's tables: only for saquery's dumps

    d, _ = _split(sa.PORT_INFO_RECORD.decode(rec))
    head = ["PortInfoRecord dump:", "\tRID",
            f"\t\tEndPortLid..............{d['endport_lid']}",
            f"\t\tPortNum.................{d['port_num']}",
            f"\t\tOptions.................0x{d['options']:x}",
            "\tPortInfo dump:"]  # fmt: skip
    return _text([*head, *_portinfo_lines(rec, 4, smp.PORT_INFO, 2, show_keys)])


def saquery_path_record(rec: Buffer) -> str:
    """``saquery PR``'s dump of one PathRecord (bytes of packed fields shown raw, as it does)."""
    from ibal.wire.mad import sa  # the SA's tables: only for saquery's dumps

    i, b = _split(sa.PATH_RECORD.decode(rec))
    hop_flow_raw = i["raw_traffic"] << 31 | i["flow_label"] << 8 | i["hop_limit"]
    return _sa_lines("PathRecord dump:", [
        ("service_id", f"0x{i['service_id']:016x}"),
        ("dgid", ntop(b["dgid"])),
        ("sgid", ntop(b["sgid"])),
        ("dlid", f"{i['dlid']}"),
        ("slid", f"{i['slid']}"),
        ("hop_flow_raw", f"0x{hop_flow_raw:X}"),
        ("tclass", f"0x{i['tclass']:X}"),
        ("num_path_revers", f"0x{i['reversible'] << 7 | i['numb_path']:X}"),
        ("pkey", f"0x{i['p_key']:X}"),
        ("qos_class", f"0x{i['qos_class']:X}"),
        ("sl", f"0x{i['sl']:X}"),
        ("mtu", f"0x{i['mtu_selector'] << 6 | i['mtu']:X}"),
        ("rate", f"0x{i['rate_selector'] << 6 | i['rate']:X}"),
        ("pkt_life", f"0x{i['packet_life_time_selector'] << 6 | i['packet_life_time']:X}"),
        ("preference", f"0x{i['preference']:X}"),
        ("resv2", f"0x{i['resv_464']:012X}"),
    ])  # fmt: skip


def saquery_mcmember_record(rec: Buffer) -> str:
    """``saquery MCMR``'s dump of one MCMemberRecord."""
    from ibal.wire.mad import sa  # the SA's tables: only for saquery's dumps

    i, b = _split(sa.MCMEMBER_RECORD.decode(rec))
    return _sa_lines("MCMember Record dump:", [
        ("MGID", ntop(b["mgid"])),
        ("PortGid", ntop(b["port_gid"])),
        ("qkey", f"0x{i['q_key']:x}"),
        ("mlid", f"0x{i['mlid']:x}"),
        ("mtu", f"0x{i['mtu_selector'] << 6 | i['mtu']:x}"),
        ("TClass", f"0x{i['tclass']:x}"),
        ("pkey", f"0x{i['p_key']:x}"),
        ("rate", f"0x{i['rate_selector'] << 6 | i['rate']:x}"),
        ("pkt_life", f"0x{i['packet_life_time_selector'] << 6 | i['packet_life_time']:x}"),
        ("SL", f"0x{i['sl']:x}"),
        ("FlowLabel", f"0x{i['flow_label']:x}"),
        ("HopLimit", f"0x{i['hop_limit']:x}"),
        ("Scope", f"0x{i['scope']:x}"),
        ("JoinState", f"0x{i['join_state']:x}"),
        ("ProxyJoin", f"0x{i['proxy_join'] << 7:x}"),
    ])  # fmt: skip


def saquery_mcmember_group(rec: Buffer) -> str:
    """``saquery -g``'s dump of one MCMemberRecord (the group's fields)."""
    from ibal.wire.mad import sa  # the SA's tables: only for saquery's dumps

    i, b = _split(sa.MCMEMBER_RECORD.decode(rec))
    return _sa_lines("MCMemberRecord group dump:", [
        ("MGID", ntop(b["mgid"])),
        ("Mlid", f"0x{i['mlid']:X}"),
        ("Mtu", f"0x{i['mtu_selector'] << 6 | i['mtu']:X}"),
        ("pkey", f"0x{i['p_key']:X}"),
        ("Rate", f"0x{i['rate_selector'] << 6 | i['rate']:X}"),
        ("SL", f"0x{i['sl']:X}"),
    ])  # fmt: skip


def saquery_mcmember_member(rec: Buffer, names: Mapping[int, str], mlid: int | None = None) -> str:
    """``saquery -m [MLID]``'s dump of one MCMemberRecord: ``names`` maps port GUIDs to
    node descriptions; with ``mlid``, only the PortGid line of that group's members."""
    from ibal.wire.mad import sa  # the SA's tables: only for saquery's dumps

    i, b = _split(sa.MCMEMBER_RECORD.decode(rec))
    name = names.get(int.from_bytes(b["port_gid"][8:16], "big"), "<unknown>")
    if mlid is not None:
        return f"\t\tPortGid.................{ntop(b['port_gid'])} ({name})\n" \
            if mlid == i["mlid"] else ""
    return _sa_lines("MCMemberRecord member dump:", [
        ("MGID", ntop(b["mgid"])),
        ("Mlid", f"0x{i['mlid']:X}"),
        ("PortGid", ntop(b["port_gid"])),
        ("ScopeState", f"0x{i['scope'] << 4 | i['join_state']:X}"),
        ("ProxyJoin", f"0x{i['proxy_join'] << 7:X}"),
        ("NodeDescription", name),
    ])  # fmt: skip


def saquery_portinfo_brief(rec: Buffer) -> str:
    """``saquery -s``'s short dump of one PortInfoRecord (the IsSM / IsSMdisabled lists)."""
    from ibal.wire.mad import sa  # the SA's tables: only for saquery's dumps

    d, _ = _split(sa.PORT_INFO_RECORD.decode(rec))
    return _sa_lines("PortInfoRecord dump:", [
        ("EndPortLid", f"{d['endport_lid']}"),
        ("PortNum", f"{d['port_num']}"),
        ("base_lid", f"{d['lid']}"),
        ("master_sm_base_lid", f"{d['master_sm_lid']}"),
        ("capability_mask", f"0x{d['capability_mask']:X}"),
    ])  # fmt: skip


def saquery_service_record(rec: Buffer, *, show_keys: bool = False) -> str:
    """``saquery SR``'s dump of one ServiceRecord (ServiceKey hidden unless ``show_keys``)."""
    from ibal.wire.mad import sa  # the SA's tables: only for saquery's dumps

    d, b = _split(sa.SERVICE_RECORD.decode(rec))
    key = "0x" + b["service_key"].hex() if show_keys else NOT_DISPLAYED
    pairs = [
        ("ServiceID", f"0x{d['service_id']:016x}"),
        ("ServiceGID", ntop(b["service_gid"])),
        ("ServiceP_Key", f"0x{d['service_p_key']:X}"),
        ("ServiceLease", f"0x{d['service_lease']:X}"),
        ("ServiceKey", key),
        ("ServiceName", _cstring(b["service_name"])),
    ]
    pairs += [(f"ServiceData8.{n + 1}", f"0x{d[f'service_data8_{n}']:X}") for n in range(16)]
    pairs += [(f"ServiceData16.{n + 1}", f"0x{d[f'service_data16_{n}']:X}") for n in range(8)]
    pairs += [(f"ServiceData32.{n + 1}", f"0x{d[f'service_data32_{n}']:X}") for n in range(4)]
    pairs += [(f"ServiceData64.{n + 1}", f"0x{d[f'service_data64_{n}']:016x}") for n in range(2)]
    return _sa_lines("ServiceRecord dump:", pairs)


def _sa_wide(head: str, pairs: Sequence[tuple[str, str]]) -> str:
    return _text([head, *_sa_pairs(pairs, 27)])


def saquery_link_record(rec: Buffer) -> str:
    """``saquery LR``'s dump of one LinkRecord."""
    from ibal.wire.mad import sa  # the SA's tables: only for saquery's dumps

    d, _ = _split(sa.LINK_RECORD.decode(rec))
    return _sa_wide("LinkRecord dump:", [
        ("FromLID", f"{d['from_lid']}"),
        ("FromPort", f"{d['from_port']}"),
        ("ToPort", f"{d['to_port']}"),
        ("ToLID", f"{d['to_lid']}"),
    ])  # fmt: skip


def saquery_guidinfo_record(rec: Buffer) -> str:
    """``saquery GIR``'s dump of one GUIDInfoRecord (its eight GUIDs)."""
    from ibal.wire.mad import sa  # the SA's tables: only for saquery's dumps

    d, _ = _split(sa.GUID_INFO_RECORD.decode(rec))
    pairs = [("LID", f"{d['lid']}"), ("Block", f"{d['block_num']}")]
    pairs += [(f"GUID {n}", f"0x{d[f'guid{n}']:016x}") for n in range(8)]
    return _sa_wide("GUIDInfo Record dump:", pairs)


def saquery_informinfo_record(rec: Buffer, *, show_keys: bool = False) -> str:
    """``saquery IIR``'s dump of one InformInfoRecord (the QPN hidden unless ``show_keys``);
    a vendor subscription shows DeviceID and VendorID where a generic one has the trap
    number and producer type."""
    from ibal.wire.mad import sa  # the SA's tables: only for saquery's dumps

    d, b = _split(sa.INFORM_INFO_RECORD.decode(rec))
    generic = bool(d["is_generic"])
    pairs = [
        ("SubscriberGID", ntop(b["subscriber_gid"])),
        ("SubscriberEnum", f"0x{d['enum']:X}"),
    ]
    info = [
        ("gid", ntop(b["gid"])),
        ("lid_range_begin", f"{d['lid_range_begin']}"),
        ("lid_range_end", f"{d['lid_range_end']}"),
        ("is_generic", f"0x{d['is_generic']:X}"),
        ("subscribe", f"0x{d['subscribe']:X}"),
        ("trap_type", f"0x{d['type']:X}"),
        ("trap_num", f"{d['trap_number']}") if generic
        else ("dev_id", f"0x{d['trap_number']:X}"),
        ("qpn", f"0x{d['qpn']:06X}" if show_keys else NOT_DISPLAYED),
        ("resp_time_val", f"0x{d['resp_time_value']:X}"),
        ("node_type" if generic else "vendor_id", f"0x{d['producer_type']:06X}"),
    ]  # fmt: skip
    return _text(["InformInfoRecord dump:", "\t\tRID", *_sa_pairs(pairs),
                  "\t\tInformInfo dump:", *_sa_pairs(info)])  # fmt: skip


def saquery_class_port_info(data: Buffer) -> str:
    """``saquery CPI``'s dump of the SA's ClassPortInfo (the TC/SL/FL and HL/QP words raw)."""
    d, b = _split(header.CLASS_PORT_INFO.decode(data))
    pairs = [
        ("Base version", f"{d['base_version']}"),
        ("Class version", f"{d['class_version']}"),
        ("Capability mask", f"0x{d['capability_mask']:04X}"),
        ("Capability mask 2", f"0x{d['capability_mask2']:08X}"),
        ("Response time value", f"0x{d['resp_time_value']:02X}"),
    ]
    for end in ("redirect", "trap"):
        pairs += [
            (f"{end.title()} GID", ntop(b[f"{end}_gid"])),
            (f"{end.title()} TC/SL/FL",
             f"0x{d[f'{end}_tc'] << 24 | d[f'{end}_sl'] << 20 | d[f'{end}_fl']:08X}"),
            (f"{end.title()} LID", f"{d[f'{end}_lid']}"),
            (f"{end.title()} PKey", f"0x{d[f'{end}_p_key']:04X}"),
            ("Redirect QP", f"0x{d['redirect_qp']:08X}") if end == "redirect"
            else ("Trap HL/QP", f"0x{d['trap_hl'] << 24 | d['trap_qp']:08X}"),
            (f"{end.title()} QKey", f"0x{d[f'{end}_q_key']:08X}"),
        ]  # fmt: skip
    return _text(["SA ClassPortInfo:", *_sa_pairs(pairs, 25)])


_SM_STATES: Final = ("SMINFO_NOTACT", "SMINFO_DISCOVER", "SMINFO_STANDBY", "SMINFO_MASTER")


def sminfo(data: Buffer, lid: int) -> str:
    """``sminfo``'s line for the SMInfo attribute read from the SM at ``lid``."""
    d, _ = _split(smp.SM_INFO.decode(data))
    state = d["sm_state"]
    name = _SM_STATES[state] if state < len(_SM_STATES) else "<unknown>"
    return (f"sminfo: sm lid {lid} sm guid 0x{d['guid']:x}, activity count {d['act_count']} "
            f"priority {d['priority']} state {state} {name}\n")  # fmt: skip


# ------------------------------------------------------------- ibroute

IBROUTE_MAX_LID: Final = 0xBFFF  # the last unicast LID ibroute dumps
_LFT_BLOCK: Final = 64  # LIDs per LinearForwardingTable block

LidInfo = tuple[Buffer, Buffer, Buffer]
"""A destination LID's NodeInfo, PortInfo (port 0: the LID's own port) and NodeDescription."""


def ibroute_span(switch_info: Buffer, start: int = 0, end: int = 0) -> tuple[int, int]:
    """The LIDs ``ibroute SWITCH [START [END]]`` dumps: END (0: none) is capped at the
    switch's LinearFDBTop, then at the last unicast LID."""
    top = int(smp.SWITCH_INFO.decode(switch_info)["linear_fdb_top"])
    if not end or end > top:
        end = top
    return start, min(end, IBROUTE_MAX_LID)


def ibroute_blocks(span: tuple[int, int]) -> range:
    """The LFT blocks ibroute reads for ``span``: up to END rounded up to a block, exclusive,
    so an END on a block boundary (64, 128...) is never read, as ibroute does."""
    start, end = span
    return range(start // _LFT_BLOCK, -(-end // _LFT_BLOCK))


def ibroute_entries(blocks: Mapping[int, Buffer], span: tuple[int, int]) -> list[tuple[int, int]]:
    """``(lid, out port)`` for every LID of ``span`` in the blocks read."""
    start, end = span
    out = []
    for b in ibroute_blocks(span):
        ports = smp.LINEAR_FORWARDING_TABLE.unpack(blocks[b])
        first = b * _LFT_BLOCK
        for lid in range(max(first, start), min(first + _LFT_BLOCK, end + 1)):
            out.append((lid, int(ports[lid - first])))
    return out


def _node_name(desc: Buffer) -> str:
    """libibmad's clean_nodedesc: up to the NUL (63 bytes at most), unprintables as spaces."""
    raw = bytes(desc[: smp.NODE_DESCRIPTION.size - 1]).split(b"\0", 1)[0]
    return "".join(chr(b) if 0x20 <= b < 0x7F else " " for b in raw)


class _Dest:
    """ibroute's destination column, which remembers the last LMC range it described."""

    def __init__(self, dests: Mapping[int, LidInfo | None]) -> None:
        self.dests = dests
        self.base = self.last = 0  # the LMC range of the last port described (LMC > 0)
        self.port_guid = 0

    def __call__(self, lid: int, valid: bool) -> str:
        if lid <= self.last:
            n, of = lid - self.base, self.last - self.base + 1
            if not valid:
                return f": (path #{n} - illegal port)"
            if not self.port_guid:
                return f": (path #{n + 1} out of {of})"
            return f": (path #{n + 1} out of {of}: portguid 0x{self.port_guid:016x})"
        if not valid:
            return ": (illegal port)"
        self.port_guid = 0
        info = self.dests.get(lid)
        if info is None:
            return ": (unknown node and type)"
        ni, pi, nd = smp.NODE_INFO.decode(info[0]), smp.PORT_INFO.decode(info[1]), info[2]
        self.port_guid = int(ni["port_guid"])
        lmc = int(pi["lmc"])
        if lmc > 0:
            self.base = int(pi["lid"])
            self.last = self.base + (1 << lmc) - 1
        kind = _node_type(int(ni["node_type"]))
        return f": ({kind} portguid 0x{self.port_guid:016x}: '{_node_name(nd)}')"


def ibroute(
    node_info: Buffer, node_desc: Buffer, target: str, span: tuple[int, int],
    blocks: Mapping[int, Buffer], dests: Mapping[int, LidInfo | None] | None, *,
    all_lids: bool = False,
) -> str:  # fmt: skip
    """What ``ibroute [-a] [-n] SWITCH`` prints: the switch's LFT over ``span``
    (:func:`ibroute_span`), with ``blocks`` by block number (:func:`ibroute_blocks`).

    ``dests`` maps each destination LID to its :data:`LidInfo` (``None``: it did not
    answer); ``dests=None`` is ``-n`` (no destination column).  Out ports past the
    switch's last port are invalid: skipped unless ``all_lids`` (``-a``).
    """
    ni = smp.NODE_INFO.decode(node_info)
    nports = int(ni["num_ports"])
    start, end = span
    lines = [f"Unicast lids [0x{start:x}-0x{end:x}] of switch {target} "
             f"guid 0x{int(ni['node_guid']):016x} ({_node_name(node_desc)}):",
             "  Lid  Out   Destination", "       Port     Info "]  # fmt: skip
    dest = _Dest(dests or {})
    n = 0
    for lid, port in ibroute_entries(blocks, span):
        valid = port <= nports
        if not valid and not all_lids:
            continue
        info = "" if dests is None else dest(lid, valid)
        lines.append(f"0x{lid:04x} {port:03d} {info}")
        n += 1
    lines.append(f"{n} {'' if all_lids else 'valid '}lids dumped ")
    return _text(lines)


# ---------------------------------------------------------------- ibroute -M

MCAST_MIN_LID: Final = 0xC000
MCAST_MAX_LID: Final = 0xFFFE  # ibroute's last MLID (0xFFFF is the permissive LID)
_MFT_BLOCK: Final = 32  # MLIDs per MulticastForwardingTable block
_MFT_PORTS: Final = 16  # ports per PortMask (one position)


def ibroute_mcast_span(
    switch_info: Buffer, start: int = 0, end: int = 0, *, all_mlids: bool = False
) -> tuple[int, int]:
    """The MLIDs ``ibroute -M SWITCH [START [END]]`` dumps: END (0: none) capped at the
    switch's MulticastFDBCap, then (without ``-a``) at a valid MulticastFDBTop; START
    raised to 0xC000."""
    si = smp.SWITCH_INFO.decode(switch_info)
    cap, top = int(si["multicast_fdb_cap"]), int(si["multicast_fdb_top"])
    if not end or end > MCAST_MIN_LID + cap - 1:
        end = MCAST_MIN_LID + cap - 1
    if not all_mlids and top and top < end and top >= MCAST_MIN_LID - 1:
        end = top
    start = max(start, MCAST_MIN_LID)
    return start, min(end, MCAST_MAX_LID)


def ibroute_mcast_mods(span: tuple[int, int], num_ports: int) -> list[int]:
    """The MulticastForwardingTable attribute modifiers ibroute reads for ``span``: every
    block from START's to END's, each at every position a port of the switch is in."""
    start, end = span
    positions = -(-(num_ports + 1) // _MFT_PORTS)
    first = MCAST_MIN_LID // _MFT_BLOCK
    return [(block - first) | (pos << 28)
            for block in range(start // _MFT_BLOCK, end // _MFT_BLOCK + 1)
            for pos in range(positions)]  # fmt: skip


def ibroute_mcast(
    node_info: Buffer, node_desc: Buffer, target: str, span: tuple[int, int],
    blocks: Mapping[int, Buffer], *, brief: bool = False, all_mlids: bool = False,
) -> str:  # fmt: skip
    """What ``ibroute -M [-n] [-a] SWITCH`` prints: each MLID of ``span`` whose PortMask
    has a port (every one with ``all_mlids``), as a row of ``x`` under the port numbers
    or (``brief``, ``-n``) as the 16-bit masks.  ``blocks`` maps each modifier of
    :func:`ibroute_mcast_mods` to its MulticastForwardingTable data."""
    ni = smp.NODE_INFO.decode(node_info)
    nports = int(ni["num_ports"])
    start, end = span
    lines = [f"Multicast mlids [0x{start:x}-0x{end:x}] of switch {target} "
             f"guid 0x{int(ni['node_guid']):016x} ({_node_name(node_desc)}):"]  # fmt: skip
    if brief:
        lines.append(" MLid       Port Mask")
    else:
        ports = range(nports + 1)
        if nports > 9:
            # ibroute writes '0' + i / 10: past port 99 that is ':', ';'...
            tens = "".join((" " if i % 10 else chr(0x30 + i // 10)) + " " for i in ports)
            lines.append("            " + tens)
        lines.append("     Ports: " + "".join(f"{i % 10} " for i in ports))
        lines.append(" MLid")
    positions = -(-(nports + 1) // _MFT_PORTS)
    first = MCAST_MIN_LID // _MFT_BLOCK
    n = 0
    for mlid in range(start, end + 1):
        block, index = divmod(mlid, _MFT_BLOCK)
        masks = [int(smp.MULTICAST_FORWARDING_TABLE.unpack(
            blocks[(block - first) | (pos << 28)])[index]) for pos in range(positions)]
        if not any(masks) and not all_mlids:
            continue
        if brief:
            row = "".join(f"{m:04x}" for m in masks)
        else:
            row = "".join("x " if masks[i // _MFT_PORTS] >> (i % _MFT_PORTS) & 1 else "  "
                          for i in range(nports + 1))  # fmt: skip
        lines.append(f"0x{mlid:04x}      {row}")
        n += 1
    lines.append(f"{n} {'' if all_mlids else 'valid '}mlids dumped ")
    return _text(lines)
