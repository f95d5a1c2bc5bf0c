"""Subnet administration records (IBA vol. 1 15.2.5) as field tables.

Records that carry an SMP attribute embed its table (NodeRecord holds
NodeInfo and NodeDescription, PortInfoRecord holds PortInfo, ...), prefixing
nothing: the inner names are unique in the record.

The component mask of a query has one bit per record component, in table
order, reserved components included (IBA 15.2.5: "the component mask bit
number is the order of the component in the record").  :func:`component_bits`
derives it from the table; the few components that own two bits (PathRecord's
64-bit ServiceID counts as two 32-bit halves) are declared in ``WIDE``.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Final

from ibal.wire.fields import F, FieldError, Kind, R, Table
from ibal.wire.mad.header import embed
from ibal.wire.mad.smp import GUID_INFO, NODE_DESCRIPTION, NODE_INFO, PORT_INFO

__all__ = [
    "GUID_INFO_RECORD",
    "INFORM_INFO",
    "INFORM_INFO_RECORD",
    "LINK_RECORD",
    "MCMEMBER_RECORD",
    "NODE_RECORD",
    "NOTICE",
    "PATH_RECORD",
    "PORT_INFO_RECORD",
    "SERVICE_RECORD",
    "SL_TO_VL_RECORD",
    "TRAP_64_65_DETAILS",
    "TRAP_128_DETAILS",
    "TRAP_144_DETAILS",
    "VL_ARB_RECORD",
    "component_bits",
    "component_mask",
    "records",
]  # fmt: skip

NODE_RECORD: Final = Table("NodeRecord", [
    F("lid", 16),
    R(16),
    *embed(NODE_INFO, 32),
    *embed(NODE_DESCRIPTION, 32 + NODE_INFO.size * 8),
])  # fmt: skip

PORT_INFO_RECORD: Final = Table("PortInfoRecord", [
    F("endport_lid", 16),
    F("port_num", 8),
    F("options", 8, hex=True),
    *embed(PORT_INFO, 32),
])  # fmt: skip

PATH_RECORD: Final = Table("PathRecord", [
    F("service_id", 64, hex=True),
    F("dgid", 128, kind=Kind.GID),
    F("sgid", 128, kind=Kind.GID),
    F("dlid", 16),
    F("slid", 16),
    F("raw_traffic", 1),
    R(3),
    F("flow_label", 20, hex=True),
    F("hop_limit", 8),
    F("tclass", 8),
    F("reversible", 1),
    F("numb_path", 7),
    F("p_key", 16, hex=True, default=0xFFFF),
    F("qos_class", 12),
    F("sl", 4),
    F("mtu_selector", 2),
    F("mtu", 6),
    F("rate_selector", 2),
    F("rate", 6),
    F("packet_life_time_selector", 2),
    F("packet_life_time", 6),
    F("preference", 8),
    R(48),
])  # fmt: skip

SERVICE_RECORD: Final = Table("ServiceRecord", [
    F("service_id", 64, hex=True),
    F("service_gid", 128, kind=Kind.GID),
    F("service_p_key", 16, hex=True),
    R(16),
    F("service_lease", 32, hex=True),
    F("service_key", 128, kind=Kind.BYTES),
    F("service_name", 512, kind=Kind.BYTES),
    *[F(f"service_data8_{i}", 8) for i in range(16)],
    *[F(f"service_data16_{i}", 16) for i in range(8)],
    *[F(f"service_data32_{i}", 32) for i in range(4)],
    *[F(f"service_data64_{i}", 64) for i in range(2)],
])  # fmt: skip

MCMEMBER_RECORD: Final = Table("MCMemberRecord", [
    F("mgid", 128, kind=Kind.GID),
    F("port_gid", 128, kind=Kind.GID),
    F("q_key", 32, hex=True),
    F("mlid", 16, hex=True),
    F("mtu_selector", 2),
    F("mtu", 6),
    F("tclass", 8),
    F("p_key", 16, hex=True),
    F("rate_selector", 2),
    F("rate", 6),
    F("packet_life_time_selector", 2),
    F("packet_life_time", 6),
    F("sl", 4),
    F("flow_label", 20, hex=True),
    F("hop_limit", 8),
    F("scope", 4),
    F("join_state", 4),
    F("proxy_join", 1),
    R(23),
])  # fmt: skip

INFORM_INFO: Final = Table("InformInfo", [
    F("gid", 128, kind=Kind.GID),
    F("lid_range_begin", 16),
    F("lid_range_end", 16),
    R(16),
    F("is_generic", 8),
    F("subscribe", 8),
    F("type", 16),
    F("trap_number", 16),  # DeviceID when not generic
    F("qpn", 24, hex=True),
    R(3),
    F("resp_time_value", 5),
    R(8),
    F("producer_type", 24),  # VendorID when not generic
])  # fmt: skip

INFORM_INFO_RECORD: Final = Table("InformInfoRecord", [
    F("subscriber_gid", 128, kind=Kind.GID),
    F("enum", 16),
    R(48),
    *embed(INFORM_INFO, 192),
    R(32),  # pads the record to a multiple of 8 bytes (AttributeOffset unit)
])  # fmt: skip

NOTICE_DATA_DETAILS: Final = 54

NOTICE: Final = Table("Notice", [
    F("is_generic", 1),
    F("type", 7),
    F("producer_type", 24),  # VendorID when not generic
    F("trap_number", 16),  # DeviceID when not generic
    F("issuer_lid", 16),
    F("notice_toggle", 1),
    F("notice_count", 15),
    F("data_details", NOTICE_DATA_DETAILS * 8, kind=Kind.BYTES),
    F("issuer_gid", 128, kind=Kind.GID),
])  # fmt: skip

# The DataDetails of the generic traps the SA forwards most (read off
# ``NOTICE.decode(...)["data_details"]``).
TRAP_64_65_DETAILS: Final = Table("Trap64/65 details", [  # GID in / out of service
    R(48),
    F("gid", 128, kind=Kind.GID),
    R(256),
], size=NOTICE_DATA_DETAILS)  # fmt: skip

TRAP_128_DETAILS: Final = Table("Trap128 details", [  # link state change
    F("lid", 16),
    R(416),
], size=NOTICE_DATA_DETAILS)  # fmt: skip

TRAP_144_DETAILS: Final = Table("Trap144 details", [  # capability mask / local change
    R(16),
    F("lid", 16),
    R(15),
    F("other_local_changes", 1),
    F("capability_mask", 32, hex=True),
    R(13),
    F("link_speed_enabled_change", 1),
    F("link_width_enabled_change", 1),
    F("node_description_change", 1),
    F("capability_mask2", 16, hex=True),
    R(256),
], size=NOTICE_DATA_DETAILS)  # fmt: skip

LINK_RECORD: Final = Table("LinkRecord", [
    F("from_lid", 16),
    F("from_port", 8),
    F("to_port", 8),
    F("to_lid", 16),
    R(16),
])  # fmt: skip

GUID_INFO_RECORD: Final = Table("GUIDInfoRecord", [
    F("lid", 16),
    F("block_num", 8),
    R(8),
    R(32),
    *embed(GUID_INFO, 64),
])  # fmt: skip

SL_TO_VL_RECORD: Final = Table("SLtoVLMappingTableRecord", [
    F("lid", 16),
    F("input_port_num", 8),
    F("output_port_num", 8),
    R(32),
    F("sl_to_vl_table", 64, kind=Kind.BYTES),  # 16 SLs, 4 bits each
])  # fmt: skip

VL_ARB_RECORD: Final = Table("VLArbitrationTableRecord", [
    F("lid", 16),
    F("output_port_num", 8),
    F("block_num", 8),
    R(32),
    F("vl_arb_table", 512, kind=Kind.BYTES),  # 32 (VL, weight) entries of 2 bytes
])  # fmt: skip

WIDE: Final[dict[str, dict[str, int]]] = {"PathRecord": {"service_id": 2}}


@cache
def component_bits(table: Table) -> dict[str, int]:
    """Field name -> component mask bit number (reserved components use numbers too)."""
    wide = WIDE.get(table.name, {})
    out: dict[str, int] = {}
    bit = 0
    for p in table.fields:
        out[p.name] = bit
        bit += wide.get(p.name, 1)
    return out


def component_mask(table: Table, names: Iterable[str]) -> int:
    """The ComponentMask selecting ``names`` of ``table`` (every bit a wide field owns)."""
    bits = component_bits(table)
    wide = WIDE.get(table.name, {})
    mask = 0
    for n in names:
        if n not in bits or table.by_name[n].field.reserved:
            raise FieldError("unknown", f"{table.name}: no component {n!r}", n)
        for k in range(wide.get(n, 1)):
            mask |= 1 << (bits[n] + k)
    return mask


def records(data: bytes | bytearray | memoryview, attr_offset: int, table: Table) -> list[bytes]:
    """The records of a (reassembled) SA response's data: ``attr_offset`` 8-byte words each.

    ``attr_offset`` 0 (no record) gives none; a record shorter than ``table``
    raises ``FieldError('short')``.
    """
    step = attr_offset * 8
    if step == 0:
        return []
    if step < table.size:
        raise FieldError("short", f"{table.name}: records of {step} bytes, need {table.size}")
    n = len(data) // step
    return [bytes(data[i * step : i * step + step]) for i in range(n)]
