"""What stands behind QP0 and QP1 of every mock port: the SMA (via the SMI) and the PMA,
and the SA behind the SM port's QP1 (:mod:`ibal.providers.mock.sa_agent`).

As on a real HCA, an SMP request sent on QP0 (LID-routed to any node, or
directed route through the switches) and a PerfMgt request sent to QP1 are
answered by the agents, not by whatever QP the destination opened: the
engine hands them to :meth:`MadAgents.answer` and delivers the response to
the requester's QP0/QP1 like any datagram.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ibal.providers.mock import pma, smi
from ibal.providers.mock.topology import MockPort, Switch
from ibal.types import QpType
from ibal.wire.mad.consts import MAD_SIZE, MgmtClass

if TYPE_CHECKING:
    from ibal.providers.mock.fabric import MockFabric
    from ibal.providers.mock.sa_agent import SaAgent

PERMISSIVE_LID = 0xFFFF
_RESPONSE = 0x80

Reply = tuple[MockPort | None, int, bytes]  # responding CA port (None: a switch), its LID, MAD


def claims(qp_type: QpType, dqpn: int, mad: bytes | memoryview) -> bool:
    """Whether a datagram from a special QP is a request the agents answer."""
    if len(mad) < MAD_SIZE or mad[3] & _RESPONSE:
        return False
    if qp_type is QpType.QP0:
        return dqpn == 0 and mad[1] in (MgmtClass.SUBN_LID, MgmtClass.SUBN_DR)
    return dqpn == 1 and mad[1] == MgmtClass.PERF


class MadAgents:
    """The fabric's agents, as the engine sees them."""

    def __init__(self, fabric: MockFabric) -> None:
        self.fabric = fabric
        self.sa_active: SaAgent | None = None
        """The SA once something used it (it and its imports load on first use)."""

    @property
    def sa(self) -> SaAgent:
        """The SA on the SM port, made on first use."""
        if self.sa_active is None:
            from ibal.providers.mock.sa_agent import SaAgent

            self.sa_active = SaAgent(self.fabric)
        return self.sa_active

    def answer(self, src: MockPort, dlid: int, mad: bytes, cost: tuple[int, int]) -> Reply | None:
        """The reply to ``mad`` sent from ``src`` to ``dlid`` (``None``: dropped).

        ``cost`` (packets, words) of the request goes to the responding CA
        port's receive counters before its agents answer.
        """
        reply = self._answer(src, dlid, mad, cost)
        if reply is not None and reply[0] is not None and mad[1] != MgmtClass.PERF:
            _count_rcv(reply[0], cost)
        return reply

    def _answer(self, src: MockPort, dlid: int, mad: bytes, cost: tuple[int, int]) -> Reply | None:
        if mad[1] == MgmtClass.PERF:
            fab = self.fabric
            node = fab.sm.node_by_lid(dlid)
            if isinstance(node, Switch):
                if not smi.reaches(fab, src, node):
                    return None
                return None, node.lid, bytes(pma.answer_switch(node, mad))
            if not isinstance(node, MockPort) or node.removed:
                return None
            route = fab.engine.route_to(src, dlid)
            if route is None or route[0] is not node:
                return None
            _count_rcv(node, cost)
            return node, node.lid, bytes(pma.answer(node, mad))
        if mad[1] == MgmtClass.SUBN_DR:
            resp = smi.send(self.fabric, src, mad, dlid)
            # LID-routed back from the switch it was LID-routed to, if DrSLID is set
            slid = dlid if resp is not None and resp[32:34] != b"\xff\xff" else PERMISSIVE_LID
            return None if resp is None else (None, slid, resp)
        resp = smi.send(self.fabric, src, mad, dlid)
        if resp is None:
            return None
        owner = self.fabric.sm.node_by_lid(dlid)
        if isinstance(owner, Switch) or owner is None:
            return None, dlid, resp
        return owner, owner.lid, resp


def _count_rcv(port: MockPort, cost: tuple[int, int]) -> None:
    port.pm[pma.RCV_PKTS] += cost[0]
    port.pm[pma.RCV_DATA] += cost[1]
