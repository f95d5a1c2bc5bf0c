"""Port attributes of a MAD-only CA from its own SMA, and the events a change raises.

Pure functions (no I/O): :func:`local_smp` builds a directed-route SubnGet
with hop count 0 (the local port's SMA answers it, whatever the link state);
:func:`port_attr` turns the PortInfo and P_KeyTable answers into a
:class:`~ibal.types.PortAttr`; :func:`port_events` says which async events a
change between two snapshots raises (what the kernel raises for a verbs
device: PORT_ACTIVE / PORT_DOWN when the port enters or leaves ACTIVE,
LID_CHANGE, SM_CHANGE, PKEY_CHANGE, GID_CHANGE, CLIENT_REREGISTER).

PortInfo's layout is :data:`ibal.wire.mad.smp.PORT_INFO`; the SMPs are built
with :func:`ibal.wire.mad.header.build`.
"""

from __future__ import annotations

from typing import Final

from ibal.providers.rdma_core import consts as C
from ibal.types import (
    AsyncEvent,
    Gid,
    LinkLayer,
    LinkState,
    Mtu,
    PortAttr,
    PortCap,
)
from ibal.wire.mad import header as H
from ibal.wire.mad.consts import DR_DIRECTION, Method, MgmtClass, SmpAttr
from ibal.wire.mad.smp import PORT_INFO

ATTR_PORT_INFO: Final = SmpAttr.PORT_INFO
ATTR_PKEY_TABLE: Final = SmpAttr.PKEY_TABLE
PKEYS_PER_BLOCK = 32
SMP_DATA: Final = H.data_offset(MgmtClass.SUBN_DR)
"""Where a directed-route SMP's attribute data starts."""


def local_smp(tid: int, attr_id: int, attr_mod: int = 0) -> bytes:
    """SubnGet(attr) to the local SMA: directed route, hop count 0, permissive DrSLID/DrDLID."""
    return bytes(H.build(MgmtClass.SUBN_DR, Method.GET, attr_id, tid=tid, attr_mod=attr_mod,
                         dr_path=[]))  # fmt: skip


def smp_status(mad: bytes) -> int:
    """The status of an SMP answer, D bit (direction) left out."""
    return H.header(mad).status & ~DR_DIRECTION


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
