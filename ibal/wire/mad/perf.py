"""Performance management attributes (IBA vol. 1 16.1.3) as field tables.

ClassPortInfo is common to all classes: :data:`ibal.wire.mad.header.CLASS_PORT_INFO`.
"""

from __future__ import annotations

from typing import Final

from ibal.wire.fields import F, R, Table
from ibal.wire.mad.header import CLASS_PORT_INFO

__all__ = ["CLASS_PORT_INFO", "PORT_COUNTERS", "PORT_COUNTERS_EXT", "PORT_RCV_ERROR_DETAILS",
           "PORT_XMIT_DISCARD_DETAILS"]

PORT_COUNTERS: Final = Table("PortCounters", [
    R(8),
    F("port_select", 8),
    F("counter_select", 16, hex=True),
    F("symbol_error_counter", 16),
    F("link_error_recovery_counter", 8),
    F("link_downed_counter", 8),
    F("port_rcv_errors", 16),
    F("port_rcv_remote_physical_errors", 16),
    F("port_rcv_switch_relay_errors", 16),
    F("port_xmit_discards", 16),
    F("port_xmit_constraint_errors", 8),
    F("port_rcv_constraint_errors", 8),
    F("counter_select2", 8, hex=True),
    F("local_link_integrity_errors", 4),
    F("excessive_buffer_overrun_errors", 4),
    F("qp1_dropped", 16),
    F("vl15_dropped", 16),
    F("port_xmit_data", 32),  # in 4-byte words
    F("port_rcv_data", 32),
    F("port_xmit_pkts", 32),
    F("port_rcv_pkts", 32),
    F("port_xmit_wait", 32),
])  # fmt: skip

PORT_COUNTERS_EXT: Final = Table("PortCountersExtended", [
    R(8),
    F("port_select", 8),
    F("counter_select", 16, hex=True),
    R(32),
    F("port_xmit_data", 64),
    F("port_rcv_data", 64),
    F("port_xmit_pkts", 64),
    F("port_rcv_pkts", 64),
    F("port_unicast_xmit_pkts", 64),
    F("port_unicast_rcv_pkts", 64),
    F("port_multicast_xmit_pkts", 64),
    F("port_multicast_rcv_pkts", 64),
])  # fmt: skip

# IBA vol. 1 16.1.4.3 (optional): why a port's PortRcvErrors and PortXmitDiscards counted
PORT_RCV_ERROR_DETAILS: Final = Table("PortRcvErrorDetails", [
    R(8),
    F("port_select", 8),
    F("counter_select", 16, hex=True),
    F("port_local_physical_errors", 16),
    F("port_malformed_packet_errors", 16),
    F("port_buffer_overrun_errors", 16),
    F("port_dlid_mapping_errors", 16),
    F("port_vl_mapping_errors", 16),
    F("port_looping_errors", 16),
])  # fmt: skip

PORT_XMIT_DISCARD_DETAILS: Final = Table("PortXmitDiscardDetails", [
    R(8),
    F("port_select", 8),
    F("counter_select", 16, hex=True),
    F("port_inactive_discards", 16),
    F("port_neighbor_mtu_discards", 16),
    F("port_sw_lifetime_limit_discards", 16),
    F("port_sw_hoq_lifetime_limit_discards", 16),
])  # fmt: skip
