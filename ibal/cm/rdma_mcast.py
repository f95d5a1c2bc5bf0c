"""RDMA CM multicast on RoCE: ``rdma_join_multicast`` / ``rdma_leave_multicast``.

On an Ethernet port there is no SA to ask: Linux's rdma_cm makes the group's
GID from its IP address (IPv4: ``::ffff:a.b.c.d``, what RoCEv2 carries; IPv6:
the address itself), uses P_Key 0xFFFF, ``RDMA_UDP_QKEY`` and the multicast
QPN 0xFFFFFF, attaches the QP to the GID and joins the IP group on the
netdev (IGMP), so the datagrams sent to the group's address reach it.
:func:`join_multicast` does the same through the access layer: the QP's
``attach_mcast`` (a provider such as ibal's rxe joins the IP group on its
socket) and the address vector a sender to the group needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ibal.al import McastAttachment, Qp
from ibal.cm.cma import RDMA_UDP_QKEY, IpAddress, gid_of, ip_address
from ibal.status import InvalidParameter, InvalidSetting, NotFound
from ibal.types import AvAttr, Gid, GidType, Grh, LinkLayer, PortAttr, QpType

__all__ = ["MCAST_HOP_LIMIT", "MCAST_QPN", "McastGroup", "join_multicast"]

MCAST_QPN = 0xFFFFFF
"""The destination QPN of a datagram to a group (IBA 10.5.2.2, verbs' ``remote_qpn``)."""
MCAST_HOP_LIMIT = 64
"""The hop limit (IP TTL) of datagrams to a group: the IP default."""


@dataclass
class McastGroup:
    """A joined group: ``RDMA_CM_EVENT_MULTICAST_JOIN``'s ``param.ud`` and the membership.

    Send to it with ``pd.create_av(group.av)``, ``remote_qp=group.qpn`` and
    ``remote_qkey=group.qkey``; :meth:`leave` ends the membership.
    """

    addr: IpAddress
    mgid: Gid
    av: AvAttr
    qpn: int
    qkey: int
    attachment: McastAttachment

    def leave(self) -> None:
        """``rdma_leave_multicast``: the QP leaves the group (synchronous)."""
        self.attachment.detach()


def join_multicast(qp: Qp, group: IpAddress | str, *,
                   src: IpAddress | str | None = None) -> McastGroup:  # fmt: skip
    """``rdma_join_multicast``: UD ``qp`` (INIT or later, Q_Key ``RDMA_UDP_QKEY``, on a
    RoCE port) joins the IP multicast group ``group``; ``src``, when given, is the local
    address the group's datagrams are sent from (default: the port's first RoCEv2
    address of the group's IP version).

    ``InvalidParameter`` for an address that is not multicast, ``InvalidSetting`` for a
    QP that is not UD, has another Q_Key or is not on an Ethernet port, ``NotFound`` when
    the port has no address to send from; the QP's ``attach_mcast`` errors otherwise.
    """
    addr = ip_address(group)
    if not addr.is_multicast:
        raise InvalidParameter(f"{addr} is not a multicast address")
    if qp.qp_type is not QpType.UD:
        raise InvalidSetting(f"a multicast group takes a UD QP, not {qp.qp_type.name}")
    attr = qp.query()
    if attr.qkey != RDMA_UDP_QKEY:
        raise InvalidSetting(f"the QP's Q_Key is {attr.qkey:#x}; rdma_cm groups use "
                             f"RDMA_UDP_QKEY {RDMA_UDP_QKEY:#x}")  # fmt: skip
    port = next((p for p in qp.pd.ca.query().ports if p.port_num == attr.port_num), None)
    if port is None or port.link_layer is not LinkLayer.ETHERNET:
        raise InvalidSetting("rdma_cm multicast here is RoCE's: the QP's port is not Ethernet")
    sgid_index = _source_index(port, addr, None if src is None else ip_address(src))
    mgid = gid_of(addr)
    attachment = qp.attach_mcast(mgid, 0xFFFF)  # RoCE has no LIDs: the permissive one
    av = AvAttr(port_num=port.port_num, dlid=0,  # RoCE: no LID (Linux reports mlid 0)
                grh=Grh(dgid=mgid, sgid_index=sgid_index, hop_limit=MCAST_HOP_LIMIT))
    return McastGroup(addr, mgid, av, MCAST_QPN, RDMA_UDP_QKEY, attachment)


def _source_index(port: PortAttr, group: IpAddress, src: IpAddress | None) -> int:
    """The GID index the group's datagrams are sent from."""
    if src is not None:
        if src.version != group.version:
            raise InvalidParameter(f"source {src} and group {group} are of different IP "
                                   f"versions")  # fmt: skip
        index = port.gid_index(gid_of(src).packed)
        if index is None:
            raise NotFound(f"port {port.port_num} has no address {src}")
        return index
    for e in port.gid_table:
        mapped = e.gid.ipv4_mapped is not None
        if e.gid_type is GidType.ROCE_V2 and mapped == (group.version == 4) and \
                not e.gid.is_link_local:  # fmt: skip
            return e.index
    raise NotFound(f"port {port.port_num} has no IPv{group.version} address to send from")
