"""Subnet management attributes (IBA vol. 1 14.2.5) as field tables, and their encodings.

Each table covers the attribute as it sits in an SMP's 64-byte data area.
Field names are the IBA names in snake case; :mod:`ibal.wire.mad.dump` maps them to
the names infiniband-diags prints.  The tables take any value that fits the
field; the enums below name the values (a peer may send codes newer than
ours, which must still decode).
"""

from __future__ import annotations

import enum
from typing import Final

from ibal.wire.fields import F, Kind, R, Table

# ------------------------------------------------------------------ encodings


class NodeType(enum.IntEnum):
    CA = 1
    SWITCH = 2
    ROUTER = 3


class PortState(enum.IntEnum):
    NO_CHANGE = 0
    DOWN = 1
    INIT = 2
    ARMED = 3
    ACTIVE = 4


class PhysPortState(enum.IntEnum):
    NO_CHANGE = 0
    SLEEP = 1
    POLLING = 2
    DISABLED = 3
    PORT_CONFIGURATION_TRAINING = 4
    LINK_UP = 5
    LINK_ERROR_RECOVERY = 6
    PHY_TEST = 7


class MtuCode(enum.IntEnum):
    MTU_256 = 1
    MTU_512 = 2
    MTU_1024 = 3
    MTU_2048 = 4
    MTU_4096 = 5


class LinkWidth(enum.IntFlag):
    """LinkWidthSupported/Enabled bits; LinkWidthActive holds exactly one."""

    W1X = 0x01
    W4X = 0x02
    W8X = 0x04
    W12X = 0x08
    W2X = 0x10


class LinkSpeed(enum.IntFlag):
    """LinkSpeedSupported/Enabled bits; LinkSpeedActive holds one (0: see the extended one)."""

    SDR = 0x1  # 2.5 Gbps
    DDR = 0x2  # 5.0 Gbps
    QDR = 0x4  # 10.0 Gbps


class LinkSpeedExt(enum.IntFlag):
    """LinkSpeedExt* bits (CapabilityMask.IS_EXTENDED_SPEEDS_SUPPORTED)."""

    FDR = 0x1  # 14.0625 Gbps
    EDR = 0x2  # 25.78125 Gbps
    HDR = 0x4  # 53.125 Gbps
    NDR = 0x8  # 106.25 Gbps


LINK_SPEED_EXT_DISABLED: Final = 30  # LinkSpeedExtEnabled: extended speeds off


class CapabilityMask(enum.IntFlag):
    """PortInfo.CapabilityMask (bit 0 and 13 are reserved)."""

    IS_SM = 1 << 1
    IS_NOTICE_SUPPORTED = 1 << 2
    IS_TRAP_SUPPORTED = 1 << 3
    IS_OPTIONAL_IPD_SUPPORTED = 1 << 4
    IS_AUTOMATIC_MIGRATION_SUPPORTED = 1 << 5
    IS_SL_MAPPING_SUPPORTED = 1 << 6
    IS_MKEY_NVRAM = 1 << 7
    IS_PKEY_NVRAM = 1 << 8
    IS_LED_INFO_SUPPORTED = 1 << 9
    IS_SM_DISABLED = 1 << 10
    IS_SYSTEM_IMAGE_GUID_SUPPORTED = 1 << 11
    IS_PKEY_SWITCH_EXTERNAL_PORT_TRAP_SUPPORTED = 1 << 12
    IS_EXTENDED_SPEEDS_SUPPORTED = 1 << 14
    IS_CAPABILITY_MASK2_SUPPORTED = 1 << 15
    IS_COMMUNICATION_MANAGEMENT_SUPPORTED = 1 << 16
    IS_SNMP_TUNNELING_SUPPORTED = 1 << 17
    IS_REINIT_SUPPORTED = 1 << 18
    IS_DEVICE_MANAGEMENT_SUPPORTED = 1 << 19
    IS_VENDOR_CLASS_SUPPORTED = 1 << 20
    IS_DR_NOTICE_SUPPORTED = 1 << 21
    IS_CAPABILITY_MASK_NOTICE_SUPPORTED = 1 << 22
    IS_BOOT_MANAGEMENT_SUPPORTED = 1 << 23
    IS_LINK_ROUND_TRIP_LATENCY_SUPPORTED = 1 << 24
    IS_CLIENT_REREGISTRATION_SUPPORTED = 1 << 25
    IS_OTHER_LOCAL_CHANGES_NOTICE_SUPPORTED = 1 << 26
    IS_LINK_SPEED_WIDTH_PAIRS_TABLE_SUPPORTED = 1 << 27
    IS_VENDOR_SPECIFIC_MADS_TABLE_SUPPORTED = 1 << 28
    IS_MCAST_PKEY_TRAP_SUPPRESSION_SUPPORTED = 1 << 29
    IS_MULTICAST_FDB_TOP_SUPPORTED = 1 << 30
    IS_HIERARCHY_INFO_SUPPORTED = 1 << 31


class CapabilityMask2(enum.IntFlag):
    """PortInfo.CapabilityMask2."""

    IS_SET_NODE_DESCRIPTION_SUPPORTED = 1 << 0
    IS_PORT_INFO_EXTENDED_SUPPORTED = 1 << 1
    IS_VIRTUALIZATION_SUPPORTED = 1 << 2
    IS_SWITCH_PORT_STATE_TABLE_SUPPORTED = 1 << 3
    IS_LINK_WIDTH_2X_SUPPORTED = 1 << 4
    IS_LINK_SPEED_HDR_SUPPORTED = 1 << 5
    IS_MKEY_PROTECT_BITS_EXT_SUPPORTED = 1 << 6
    IS_ENHANCED_TRAP128_SUPPORTED = 1 << 7
    IS_PARTITION_TOP_SUPPORTED = 1 << 8
    IS_ENHANCED_QOS_ARBITER_SUPPORTED = 1 << 9
    IS_LINK_SPEED_NDR_SUPPORTED = 1 << 10


class SmState(enum.IntEnum):
    NOT_ACTIVE = 0
    DISCOVERING = 1
    STANDBY = 2
    MASTER = 3


# ------------------------------------------------------------------ attributes

NODE_DESCRIPTION: Final = Table("NodeDescription", [
    F("node_string", 512, kind=Kind.BYTES),  # UTF-8, NUL padded
])  # fmt: skip

NODE_INFO: Final = Table("NodeInfo", [
    F("base_version", 8),
    F("class_version", 8),
    F("node_type", 8),
    F("num_ports", 8),
    F("system_image_guid", 64, hex=True),
    F("node_guid", 64, hex=True),
    F("port_guid", 64, hex=True),
    F("partition_cap", 16),
    F("device_id", 16, hex=True),
    F("revision", 32, hex=True),
    F("local_port_num", 8),
    F("vendor_id", 24, hex=True),
])  # fmt: skip

SWITCH_INFO: Final = Table("SwitchInfo", [
    F("linear_fdb_cap", 16),
    F("random_fdb_cap", 16),
    F("multicast_fdb_cap", 16),
    F("linear_fdb_top", 16),
    F("default_port", 8),
    F("default_multicast_primary_port", 8),
    F("default_multicast_not_primary_port", 8),
    F("life_time_value", 5),
    F("port_state_change", 1),
    F("optimized_sl_to_vl_mapping_programming", 2),
    F("lids_per_port", 16),
    F("partition_enforcement_cap", 16),
    F("inbound_enforcement_cap", 1),
    F("outbound_enforcement_cap", 1),
    F("filter_raw_inbound_cap", 1),
    F("filter_raw_outbound_cap", 1),
    F("enhanced_port0", 1),
    R(11),
    F("multicast_fdb_top", 16, hex=True),
])  # fmt: skip

GUID_INFO: Final = Table("GUIDInfo", [F(f"guid{i}", 64, hex=True) for i in range(8)])

PKEY_TABLE: Final = Table("P_KeyTable", [F(f"p_key{i}", 16, hex=True) for i in range(32)])

LINEAR_FORWARDING_TABLE: Final = Table(
    "LinearForwardingTable", [F(f"port{i}", 8) for i in range(64)]
)

MULTICAST_FORWARDING_TABLE: Final = Table(
    "MulticastForwardingTable", [F(f"port_mask{i}", 16, hex=True) for i in range(32)]
)
"""32 MLIDs' PortMasks: AttributeModifier bits 0-8 the block (MLID - 0xC000) / 32,
bits 28-31 the position (ports 16 * position .. + 15, bit n = port n of those)."""

SM_INFO: Final = Table("SMInfo", [
    F("guid", 64, hex=True),
    F("sm_key", 64, hex=True),
    F("act_count", 32),
    F("priority", 4),
    F("sm_state", 4),
])  # fmt: skip

PORT_INFO: Final = Table("PortInfo", [
    F("m_key", 64, hex=True),
    F("gid_prefix", 64, hex=True),
    F("lid", 16),
    F("master_sm_lid", 16),
    F("capability_mask", 32, hex=True),
    F("diag_code", 16, hex=True),
    F("m_key_lease_period", 16),
    F("local_port_num", 8),
    F("link_width_enabled", 8),
    F("link_width_supported", 8),
    F("link_width_active", 8),
    F("link_speed_supported", 4),
    F("port_state", 4),
    F("port_phys_state", 4),
    F("link_down_default_state", 4),
    F("m_key_protect_bits", 2),
    R(3),
    F("lmc", 3),
    F("link_speed_active", 4),
    F("link_speed_enabled", 4),
    F("neighbor_mtu", 4),
    F("master_sm_sl", 4),
    F("vl_cap", 4),
    F("init_type", 4),
    F("vl_high_limit", 8),
    F("vl_arbitration_high_cap", 8),
    F("vl_arbitration_low_cap", 8),
    F("init_type_reply", 4),
    F("mtu_cap", 4),
    F("vl_stall_count", 3),
    F("hoq_life", 5),
    F("operational_vls", 4),
    F("partition_enforcement_inbound", 1),
    F("partition_enforcement_outbound", 1),
    F("filter_raw_inbound", 1),
    F("filter_raw_outbound", 1),
    F("m_key_violations", 16),
    F("p_key_violations", 16),
    F("q_key_violations", 16),
    F("guid_cap", 8),
    F("client_reregister", 1),
    F("multicast_pkey_trap_suppression_enabled", 2),
    F("subnet_timeout", 5),
    R(3),
    F("resp_time_value", 5),
    F("local_phy_errors", 4),
    F("overrun_errors", 4),
    F("max_credit_hint", 16),
    R(8),
    F("link_round_trip_latency", 24),
    F("capability_mask2", 16, hex=True),
    F("link_speed_ext_active", 4),
    F("link_speed_ext_supported", 4),
    R(3),
    F("link_speed_ext_enabled", 5),
])  # fmt: skip

# Mellanox's ExtendedPortInfo (SmpAttr.MLNX_EXT_PORT_INFO): one byte in each of the
# first four 32-bit words, as libibmad's fields place them; bit 0 of a speed is FDR10
MLNX_EXT_PORT_INFO: Final = Table("MlnxExtendedPortInfo", [
    R(24),
    F("state_change_enable", 8, hex=True),
    R(24),
    F("link_speed_supported", 8, hex=True),
    R(24),
    F("link_speed_enabled", 8, hex=True),
    R(24),
    F("link_speed_active", 8, hex=True),
])  # fmt: skip
