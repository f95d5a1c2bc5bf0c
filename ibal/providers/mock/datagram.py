"""The mock engine's datagram side: UD sends, multicast, and MADs for the port agents.

Part of the requester (:class:`ibal.providers.mock.requester.Requester` builds on
it); called by the engine under the fabric lock.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ibal.providers.mock.agents import claims
from ibal.providers.mock.engine_core import (
    _OK,
    _UD,
    MCAST_LID_MAX,
    MCAST_LID_MIN,
)
from ibal.providers.mock.objects import (
    MockQp,
    SendWqe,
)
from ibal.providers.mock.packets import (
    MCAST_QPN,
    PSN_MASK,
    Packet,
    PacketOp,
    build_grh,
)
from ibal.providers.mock.pma import wire_cost
from ibal.providers.mock.topology import MockPort
from ibal.providers.mock.transmit import Transmit
from ibal.transport.rules import effective_qkey
from ibal.types import (
    QP1_WELL_KNOWN_QKEY,
    QpType,
    WcStatus,
)
from ibal.wire.mad.consts import MgmtClass

_SUBN_ADM = int(MgmtClass.SUBN_ADM)


class Datagrams(Transmit):
    """UD sends (to a port, a multicast group, or the SMA/PMA/SA), their completions."""

    def _send_ud(self, qp: MockQp, wqe: SendWqe, port: MockPort, data: bytes | memoryview) -> None:
        ud = wqe.ud
        assert ud is not None
        if wqe.status is not _OK:  # refused at post time (an AV of another PD)
            self._fail_wqe(qp, wqe, wqe.status)
            self._complete_front(qp)
            return
        attr, dqpn, qkey, pkey_index = ud
        if qp.qp_type is not QpType.QP1:
            pkey_index = qp.pkey_index
        if wqe.length > port.max_mtu.bytes or pkey_index >= len(port.pkeys):
            status = (
                WcStatus.LOCAL_LEN_ERR if wqe.length > port.max_mtu.bytes else WcStatus.LOCAL_OP_ERR
            )
            self._fail_wqe(qp, wqe, status)
            self._complete_front(qp)
            return
        qkey = effective_qkey(qkey, qp.qkey)
        pkey = port.pkeys[pkey_index]
        if wqe.psn is None:
            wqe.psn = qp.sq_psn
            qp.sq_psn = (qp.sq_psn + 1) & PSN_MASK
        if qp.special and self.mad_agents is not None:
            if claims(qp.qp_type, dqpn, data):
                self._agent_reply(qp, port, attr.dlid, bytes(data), pkey)
                wqe.done = True
                self._complete_front(qp)
                return
            if dqpn == 1 and len(data) > 1 and data[1] == _SUBN_ADM:
                sa = self.mad_agents.sa
                if sa.takes(attr.dlid, data):
                    self._count_agent_send(port, data, pkey)
                    sa.receive(port, bytes(data), pkey)
                    wqe.done = True
                    self._complete_front(qp)
                    return
        grh: bytes | None = None
        if attr.grh is not None:
            gid_index = attr.grh.sgid_index
            sgid = port.gid.packed if gid_index == 0 else None
            if sgid is None:
                self._fail_wqe(qp, wqe, WcStatus.LOCAL_OP_ERR)
                self._complete_front(qp)
                return
            grh = build_grh(
                sgid, attr.grh.dgid.packed, len(data), attr.grh.hop_limit,
                attr.grh.traffic_class, attr.grh.flow_label,
            )
        dlid = attr.dlid
        if MCAST_LID_MIN <= dlid <= MCAST_LID_MAX:
            self._send_mcast(qp, wqe, port, data, dlid, qkey, pkey, grh)
        else:
            route = self._route(port, dlid)
            if route is None:
                self._discard(port)
            else:
                pkt = Packet(
                    PacketOp.SEND if wqe.imm is None else PacketOp.SEND_IMM,
                    _UD, port, route[0], route[1], qp.num, dqpn & 0xFFFFFF,
                    wqe.psn, pkey, data,
                )
                pkt.qkey = qkey
                pkt.imm = wqe.imm
                pkt.solicited = wqe.solicited
                pkt.sl = attr.sl
                pkt.grh = grh
                self._transmit(pkt)
                if self.packet_faults_armed:
                    lag = self.faults.send_lag(pkt, self.rng)
                    if lag > 0:
                        done = functools.partial(self._lagged_done, qp, wqe)
                        self.call_at(self.now + lag, _LaggedSend(done))
                        return
        wqe.done = True
        self._complete_front(qp)

    def _lagged_done(self, qp: MockQp, wqe: SendWqe) -> None:
        """Fabric lock held: a lagged send is done; what is done at the queue's front
        completes (nothing if the QP went to ERROR meanwhile: flushing completed it)."""
        wqe.done = True
        if qp.alive and any(w is wqe for w in qp.sq):
            self._complete_front(qp)

    def _count_agent_send(
        self, port: MockPort, mad: bytes | memoryview, pkey: int, qpn: int = 1
    ) -> tuple[int, int]:
        """A MAD ``port`` sent to an agent: the port's transmit counters and the fabric's."""
        req = Packet(PacketOp.SEND, _UD, port, port, (), qpn, qpn, 0, pkey, mad)
        n, words = wire_cost(req)
        port.pm[2] += n
        port.pm[0] += words
        self.counters.sent += 1
        return n, words

    def _agent_reply(self, qp: MockQp, port: MockPort, dlid: int, mad: bytes, pkey: int) -> None:
        """A request for the SMA/PMA: its reply comes back to ``qp`` (QP0 or QP1)."""
        assert self.mad_agents is not None
        n, words = self._count_agent_send(port, mad, pkey, qp.num)
        reply = self.mad_agents.answer(port, dlid, mad, (n, words))
        if reply is None:
            self._drop("dropped_no_dest")
            return
        responder, slid, resp = reply
        pkt = Packet(PacketOp.SEND, _UD, responder or port, port, (), qp.num, qp.num, 0, pkey, resp)
        pkt.slid = slid
        pkt.qkey = QP1_WELL_KNOWN_QKEY if qp.num == 1 else 0
        self._transmit(pkt)
        if responder is None:  # a switch answered: the reply did not leave this port
            n, words = pkt.cost
            port.pm[2] -= n
            port.pm[0] -= words

    def _send_mcast(
        self,
        qp: MockQp,
        wqe: SendWqe,
        port: MockPort,
        data: bytes | memoryview,
        mlid: int,
        qkey: int,
        pkey: int,
        grh: bytes | None,
    ) -> None:
        ports: list[MockPort] = []
        for m in self.mcast_groups.get(mlid, ()):
            p = m.qp.port
            if p is not None and p not in ports and m.alive and m.qp.alive:
                ports.append(p)
        agents = self.mad_agents
        if agents is not None and agents.sa_active is not None:
            # a group the SA runs reaches only its member ports (the switches' MFTs)
            receivers = agents.sa_active.groups.receivers(mlid)
            if receivers is not None:
                ports = [p for p in ports if p.gid.packed in receivers]
        if not ports:
            self.counters.sent += 1
            self._drop("dropped_no_dest")
            return
        if not isinstance(data, bytes):
            data = bytes(data)
        for dst in ports:
            route = self._route(port, dst.lid)
            if route is None or route[0] is not dst:
                self.counters.sent += 1
                self._drop("dropped_link")
                continue
            pkt = Packet(
                PacketOp.SEND if wqe.imm is None else PacketOp.SEND_IMM,
                _UD, port, dst, route[1], qp.num, MCAST_QPN,
                wqe.psn,  # type: ignore[arg-type]
                pkey, data,
            )
            pkt.dlid = mlid
            pkt.qkey = qkey
            pkt.imm = wqe.imm
            pkt.solicited = wqe.solicited
            pkt.grh = grh
            self._transmit(pkt)

    # ---------------------------------------------------------- RC responses



class _LaggedSend:
    """A datagram send whose completion a ``lag_sends`` fault holds (a fabric timer)."""

    __slots__ = ("alive", "fire", "timer_gen")

    def __init__(self, fire: Callable[[], None]) -> None:
        self.alive, self.timer_gen, self.fire = True, 0, fire

