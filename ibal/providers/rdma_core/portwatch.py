"""Port attributes of a MAD-only CA from its own SMA, and the events a change raises.

Pure functions (no I/O): :func:`local_smp` builds a directed-route SubnGet
with hop count 0 (the local port's SMA answers it, whatever the link state);
:func:`port_attr` turns the PortInfo and P_KeyTable answers into a
:class:`~ibal.types.PortAttr`; :func:`port_events` says which async events a
change between two snapshots raises (what the kernel raises for a verbs
device: PORT_ACTIVE / PORT_DOWN when the port enters or leaves ACTIVE,
LID_CHANGE, SM_CHANGE, PKEY_CHANGE, GID_CHANGE, CLIENT_REREGISTER).

The PortInfo table below holds the fields up to SubnetTimeOut (IBA
14.2.5.6); ``ibal.mad`` will carry the whole attribute.
"""

from __future__ import annotations

from typing import Final

from ibal.providers.rdma_core import consts as C
from ibal.types import (
    MAD_SIZE,
    AsyncEvent,
    Gid,
    LinkLayer,
    LinkState,
    Mtu,
    PortAttr,
    PortCap,
)
from ibal.wire.fields import F, R, Table

ATTR_PORT_INFO = 0x0015
ATTR_PKEY_TABLE = 0x0016
PKEYS_PER_BLOCK = 32
SMP_DATA = 64
"""Where a directed-route SMP's attribute data starts."""

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
])  # fmt: skip


def local_smp(tid: int, attr_id: int, attr_mod: int = 0) -> bytes:
    """SubnGet(attr) to the local SMA: directed route, hop count 0, permissive DrSLID/DrDLID."""
    m = bytearray(MAD_SIZE)
    m[0:4] = bytes([1, 0x81, 1, 0x01])  # base version, DR SMP class, class version, Get
    m[8:16] = tid.to_bytes(8, "big")
    m[16:18] = attr_id.to_bytes(2, "big")
    m[20:24] = attr_mod.to_bytes(4, "big")
    m[32:36] = b"\xff\xff\xff\xff"  # DrSLID, DrDLID: permissive
    return bytes(m)


def smp_status(mad: bytes) -> int:
    """The status of an SMP answer, D bit (direction) left out."""
    return int.from_bytes(mad[4:6], "big") & 0x7FFF


def pkey_block(mad: bytes) -> tuple[int, ...]:
    """The 32 P_Keys of a P_KeyTable answer."""
    data = mad[SMP_DATA : SMP_DATA + 2 * PKEYS_PER_BLOCK]
    return tuple(int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2))


def _enum(kind: type[Mtu], value: int, default: Mtu) -> Mtu:
    try:
        return kind(value)
    except ValueError:
        return default


def port_attr(port_num: int, port_guid: int, portinfo: bytes, pkeys: tuple[int, ...]) -> PortAttr:
    """A port's attributes from its PortInfo (the 64 attribute bytes) and P_Key table."""
    pi = {k: int(v) for k, v in PORT_INFO.decode(portinfo).items() if isinstance(v, int)}
    prefix = pi["gid_prefix"]
    state = pi["port_state"]
    return PortAttr(
        port_num=port_num,
        port_guid=port_guid,
        lid=pi["lid"],
        lmc=pi["lmc"],
        sm_lid=pi["master_sm_lid"],
        sm_sl=pi["master_sm_sl"],
        link_state=LinkState(state) if state in LinkState._value2member_map_ else LinkState.DOWN,
        active_mtu=_enum(Mtu, pi["neighbor_mtu"], Mtu.MTU_256),
        max_mtu=_enum(Mtu, pi["mtu_cap"], Mtu.MTU_256),
        cap=PortCap(pi["capability_mask"]),
        pkeys=pkeys,
        gids=(Gid(((prefix << 64) | port_guid).to_bytes(16, "big")),),
        qkey_violations=pi["q_key_violations"],
        pkey_violations=pi["p_key_violations"],
        subnet_timeout=pi["subnet_timeout"],
        init_type_reply=pi["init_type_reply"],
        max_vls=C.VLS_FROM_IBV.get(pi["vl_cap"], 1),
        link_layer=LinkLayer.INFINIBAND,
        active_speed=C.SPEED_FROM_IBV.get(pi["link_speed_active"],
                                          f"speed {pi['link_speed_active']}"),
        active_width=C.WIDTH_FROM_IBV.get(pi["link_width_active"],
                                          f"width {pi['link_width_active']}"),
    )  # fmt: skip


def client_reregister(portinfo: bytes) -> bool:
    """PortInfo.ClientReregister: the SM asks the port's clients to register again."""
    return bool(PORT_INFO.decode(portinfo)["client_reregister"])


def _up(state: LinkState) -> bool:
    return state in (LinkState.ACTIVE, LinkState.ACT_DEFER)


def port_events(old: PortAttr, new: PortAttr) -> list[AsyncEvent]:
    """The async events a verbs device raises for the change from ``old`` to ``new``."""
    events: list[AsyncEvent] = []
    if _up(old.link_state) and not _up(new.link_state):
        events.append(AsyncEvent.PORT_DOWN)
    elif _up(new.link_state) and not _up(old.link_state):
        events.append(AsyncEvent.PORT_ACTIVE)
    if (old.lid, old.lmc) != (new.lid, new.lmc):
        events.append(AsyncEvent.LID_CHANGE)
    if (old.sm_lid, old.sm_sl) != (new.sm_lid, new.sm_sl):
        events.append(AsyncEvent.SM_CHANGE)
    if old.pkeys != new.pkeys:
        events.append(AsyncEvent.PKEY_CHANGE)
    if old.gids != new.gids:
        events.append(AsyncEvent.GID_CHANGE)
    return events


__all__ = [
    "ATTR_PKEY_TABLE",
    "ATTR_PORT_INFO",
    "PORT_INFO",
    "client_reregister",
    "local_smp",
    "pkey_block",
    "port_attr",
    "port_events",
    "smp_status",
]
