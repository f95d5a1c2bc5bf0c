"""The mock engine's responder: receive, RC/UC/UD delivery, multicast delivery, ACK/NAK.

Called by the engine under the fabric lock.
"""

from __future__ import annotations

from ibal.providers.mock import invalidate
from ibal.providers.mock.engine_core import (
    _ATOMIC,
    _ATOMIC_CACHE,
    _IB_GRH,
    _INV_REQ,
    _NO_OPT,
    _OK,
    _RC,
    _RDMA_READ,
    _RDMA_WRITE,
    _RECV,
    _RECV_WRITE,
    _RTR,
    _RTS,
    _SQD,
    _SQERR,
    _UD,
)
from ibal.providers.mock.objects import (
    MockQp,
    MockSrq,
    RecvWqe,
    migrate_qp,
)
from ibal.providers.mock.packets import (
    GRH_LEN,
    MCAST_QPN,
    PSN_MASK,
    NakCode,
    Packet,
    PacketOp,
    psn_diff,
)
from ibal.providers.mock.pma import QP1_DROPPED, RCV_ERRORS, VL15_DROPPED
from ibal.providers.mock.topology import MockPort
from ibal.providers.mock.transmit import Transmit
from ibal.transport.rules import atomic_result, pkey_match
from ibal.transport.wc import make_wc
from ibal.types import (
    QP1_WELL_KNOWN_QKEY,
    ApmState,
    AsyncEvent,
    QpType,
    RecvOpt,
    WcStatus,
)


class Responder(Transmit):
    """The mock engine's responder: receive, RC/UC/UD delivery, multicast delivery, ACK/NAK."""

    # ================================================================ responder
    def _receive(self, pkt: Packet) -> None:
        if pkt.icrc is not None and not pkt.icrc_ok():
            pkt.dst_port.pm[RCV_ERRORS] += 1
            self._drop("corrupted")
            return
        if pkt.topo != self._topo_gen and not self._still_routable(pkt):
            self._drop("dropped_link")
            return
        self.counters.delivered += 1
        pm = pkt.dst_port.pm
        n, words = pkt.cost
        pm[3] += n
        pm[1] += words
        if pkt.op >= 16:
            self._requester_rx(pkt)
            return
        port = pkt.dst_port
        qpn = pkt.dst_qpn
        if pkt.transport is _UD:
            if qpn == MCAST_QPN:
                self._mcast_rx(pkt)
                return
            qp = port.special[qpn] if qpn <= 1 else port.ca.qps.get(qpn)
            if qp is None or qp.transport is not _UD or qp.port is not port:
                self._drop("dropped_no_dest")
                if qpn <= 1:
                    port.pm[QP1_DROPPED if qpn else VL15_DROPPED] += 1
                return
            self._ud_rx(qp, pkt)
            return
        qp = port.ca.qps.get(qpn)
        if qp is None or qp.transport is not pkt.transport:
            self._drop("dropped_no_dest")
            return
        if qp.port is not port and (qp.alt_port is not port
                                    or not self._incoming_migration(qp)):  # fmt: skip
            self._drop("dropped_no_dest")
            return
        state = qp.state
        if state is not _RTS and state is not _RTR and state is not _SQD and state is not _SQERR:
            self._drop("dropped_state")
            return
        pkeys = port.pkeys
        mine = pkeys[qp.pkey_index] if qp.pkey_index < len(pkeys) else 0
        if not (pkt.pkey == mine and mine & 0x8000) and not pkey_match(pkt.pkey, mine):
            self._pkey_violation(port)
            return
        if state is _RTR and not qp.comm_est:
            qp.comm_est = True
            self.qp_event(qp, AsyncEvent.QP_COMM)
        if qp.transport is _RC:
            self._rc_rx(qp, pkt)
        else:
            self._uc_rx(qp, pkt)

    def _pkey_violation(self, port: MockPort) -> None:
        self._drop("dropped_access")
        self.counters.pkey_violations += 1
        if port.ca.violation_counters:
            port.pkey_violations = min(port.pkey_violations + 1, 0xFFFF)

    def _qkey_violation(self, port: MockPort) -> None:
        self._drop("dropped_access")
        self.counters.qkey_violations += 1
        if port.ca.violation_counters:
            port.qkey_violations = min(port.qkey_violations + 1, 0xFFFF)

    def _take_recv(self, qp: MockQp) -> RecvWqe | None:
        """The next receive of ``qp`` (its SRQ's: ``qp.mem.recv`` checks against that PD)."""
        srq = qp.srq
        if srq is None:
            rq = qp.rq
            if not rq:
                return None
            return rq.popleft()
        wqes = srq.wqes
        if not wqes:
            return None
        w = wqes.popleft()
        if srq.limit and len(wqes) < srq.limit:
            srq.limit = 0
            self._srq_event(srq, AsyncEvent.SRQ_LIMIT_REACHED)
        return w

    def _srq_event(self, srq: MockSrq, code: AsyncEvent) -> None:
        self._event(srq, srq.ca, code, srq.context)

    def _incoming_migration(self, qp: MockQp) -> bool:
        """A packet came on ``qp``'s alternate path (the peer migrated): armed, the QP
        migrates too (``QP_APM``).  The mock arms a loaded path at once, so it never
        refuses a migration (no ``QP_APM_ERROR``); a port with no path is a plain drop."""
        if qp.apm_state is not ApmState.ARMED:
            return False
        migrate_qp(qp)
        self.qp_event(qp, AsyncEvent.QP_APM)
        return True

    def _respond(self, qp: MockQp, req: Packet, op: PacketOp, psn: int) -> Packet | None:
        """A response packet from responder ``qp`` back to the requester of ``req``."""
        port = req.dst_port
        route = self._route(port, req.slid)
        if route is None:
            self._discard(port)
            return None
        return Packet(op, _RC, port, route[0], route[1], qp.num, qp.dest_qp, psn, req.pkey)

    def _send_ack(self, qp: MockQp, req: Packet, psn: int) -> None:
        resp = self._respond(qp, req, PacketOp.ACK, psn)
        if resp is not None:
            self.counters.acks += 1
            self._transmit(resp)

    def _send_nak(self, qp: MockQp, req: Packet, code: NakCode, psn: int) -> None:
        resp = self._respond(qp, req, PacketOp.NAK, psn)
        if resp is not None:
            resp.syndrome = int(code)
            self.counters.naks += 1
            self._transmit(resp)

    def _send_rnr(self, qp: MockQp, req: Packet) -> None:
        resp = self._respond(qp, req, PacketOp.RNR_NAK, req.psn)
        if resp is not None:
            resp.syndrome = qp.rnr_nak_timeout
            self.counters.rnr_naks += 1
            self._transmit(resp)

    def _responder_error(
        self, qp: MockQp, req: Packet, code: NakCode, event: AsyncEvent | None
    ) -> None:
        self._send_nak(qp, req, code, req.psn)
        self.qp_error(qp, event)

    def _rc_rx(self, qp: MockQp, pkt: Packet) -> None:
        d = psn_diff(pkt.psn, qp.epsn)
        if d:
            if d > 0:
                self._drop("dropped_seq")
                if not qp.nak_sent:
                    qp.nak_sent = True
                    self._send_nak(qp, pkt, NakCode.PSN_SEQ_ERR, qp.epsn)
                return
            self._rc_duplicate(qp, pkt)
            return
        op = pkt.op
        ca = qp.ca
        if op is PacketOp.SEND or op is PacketOp.SEND_IMM:
            taken = self._take_recv(qp)
            if taken is None:
                self._send_rnr(qp, pkt)
                return
            wr_id, sges = taken
            status = self._scatter(qp, sges, ((0, pkt.payload),), True)
            if status is not _OK:
                self._push_wc(qp.recv_cq, make_wc(wr_id, _RECV, status, 0, None, _NO_OPT, qp.num))
                code = (
                    NakCode.INVALID_REQUEST
                    if status is WcStatus.LOCAL_LEN_ERR
                    else NakCode.REMOTE_OP
                )
                self._responder_error(qp, pkt, code, None)
                return
            if pkt.inv is not None:
                if not invalidate.remote_invalidate(ca, qp, pkt.inv):
                    # kernel rxe's class J: the receive fails, the QP goes to error
                    self._push_wc(
                        qp.recv_cq,
                        make_wc(wr_id, _RECV, _INV_REQ, 0, None, _NO_OPT, qp.num),
                    )
                    self._responder_error(
                        qp, pkt, NakCode.INVALID_REQUEST, AsyncEvent.WQ_REQ_ERROR
                    )
                    return
                wc = make_wc(wr_id, _RECV, _OK, pkt.length, None, RecvOpt.INVALIDATE, qp.num,
                    0, pkt.slid, invalidated_rkey=pkt.inv)  # fmt: skip
            elif pkt.imm is None:
                wc = make_wc(wr_id, _RECV, _OK, pkt.length, None, _NO_OPT, qp.num, 0, pkt.slid)
            else:
                wc = make_wc(wr_id, _RECV, _OK, pkt.length, pkt.imm, RecvOpt.IMMEDIATE,
                        qp.num, 0, pkt.slid)
            self._push_wc(qp.recv_cq, wc, pkt.solicited)
        elif op is PacketOp.RDMA_WRITE or op is PacketOp.RDMA_WRITE_IMM:
            n = pkt.length
            got = self._remote(qp, pkt.rkey, pkt.remote_addr, n, _RDMA_WRITE) if n else None
            if n and got is None:
                self._responder_error(
                    qp, pkt, NakCode.REMOTE_ACCESS, AsyncEvent.WQ_ACCESS_ERROR
                )
                return
            if op is PacketOp.RDMA_WRITE_IMM:
                taken = self._take_recv(qp)
                if taken is None:
                    self._send_rnr(qp, pkt)
                    return
                if got is not None:
                    got[: len(pkt.payload)] = pkt.payload
                self._push_wc(
                    qp.recv_cq,
                    make_wc(taken[0], _RECV_WRITE, _OK, n, pkt.imm, RecvOpt.IMMEDIATE,
                       qp.num, 0, pkt.slid),
                    pkt.solicited,
                )
            elif got is not None:
                got[: len(pkt.payload)] = pkt.payload
        elif op is PacketOp.RDMA_READ_REQ:
            if not self._rc_read(qp, pkt):
                return
        else:
            if not self._rc_atomic(qp, pkt):
                return
        qp.epsn = (qp.epsn + pkt.npsn) & PSN_MASK
        qp.nak_sent = False
        if op is not PacketOp.RDMA_READ_REQ and op < PacketOp.COMPARE_SWAP:
            self._send_ack(qp, pkt, (pkt.psn + pkt.npsn - 1) & PSN_MASK)

    def _rc_read(self, qp: MockQp, pkt: Packet) -> bool:
        n = pkt.length
        if n:
            got = self._remote(qp, pkt.rkey, pkt.remote_addr, n, _RDMA_READ)
            if got is None:
                self._responder_error(qp, pkt, NakCode.REMOTE_ACCESS, AsyncEvent.WQ_ACCESS_ERROR)
                return False
            data = bytes(got)
        else:
            data = b""
        resp = self._respond(qp, pkt, PacketOp.READ_RESP, pkt.psn)
        if resp is not None:
            resp.payload = data
            resp.length = n
            resp.npsn = pkt.npsn
            self._transmit(resp)
        return True

    def _rc_atomic(self, qp: MockQp, pkt: Packet) -> bool:
        if pkt.remote_addr & 7:
            self._responder_error(qp, pkt, NakCode.INVALID_REQUEST, AsyncEvent.WQ_REQ_ERROR)
            return False
        got = self._remote(qp, pkt.rkey, pkt.remote_addr, 8, _ATOMIC)
        if got is None:
            self._responder_error(qp, pkt, NakCode.REMOTE_ACCESS, AsyncEvent.WQ_ACCESS_ERROR)
            return False
        old = int.from_bytes(got, "little")
        if pkt.op is PacketOp.COMPARE_SWAP:
            new = atomic_result(True, old, pkt.compare, pkt.swap)
        else:
            new = atomic_result(False, old, 0, pkt.compare)
        if new != old:
            got[:] = new.to_bytes(8, "little")
        cache = qp.atomic_cache
        cache[pkt.psn] = old.to_bytes(8, "little")
        if len(cache) > _ATOMIC_CACHE:
            del cache[next(iter(cache))]
        self._atomic_ack(qp, pkt, old)
        return True

    def _atomic_ack(self, qp: MockQp, pkt: Packet, old: int) -> None:
        resp = self._respond(qp, pkt, PacketOp.ATOMIC_ACK, pkt.psn)
        if resp is not None:
            resp.compare = old
            self._transmit(resp)

    def _rc_duplicate(self, qp: MockQp, pkt: Packet) -> None:
        self.counters.duplicates_received += 1
        op = pkt.op
        if op is PacketOp.RDMA_READ_REQ:
            self._rc_read(qp, pkt)
        elif op is PacketOp.COMPARE_SWAP or op is PacketOp.FETCH_ADD:
            saved = qp.atomic_cache.get(pkt.psn)
            if saved is not None:
                self._atomic_ack(qp, pkt, int.from_bytes(saved, "little"))
        else:
            self._send_ack(qp, pkt, (qp.epsn - 1) & PSN_MASK)

    def _uc_rx(self, qp: MockQp, pkt: Packet) -> None:
        d = psn_diff(pkt.psn, qp.epsn)
        if d < 0:
            self.counters.duplicates_received += 1
            self._drop("dropped_seq")
            return
        qp.epsn = (pkt.psn + pkt.npsn) & PSN_MASK
        op = pkt.op
        if op is PacketOp.SEND or op is PacketOp.SEND_IMM:
            taken = self._take_recv(qp)
            if taken is None:
                self._drop("dropped_no_recv")
                return
            wr_id, sges = taken
            status = self._scatter(qp, sges, ((0, pkt.payload),), True)
            if status is not _OK:
                self._push_wc(qp.recv_cq, make_wc(wr_id, _RECV, status, 0, None, _NO_OPT, qp.num))
                self.qp_error(qp)
                return
            opt = RecvOpt.NONE if pkt.imm is None else RecvOpt.IMMEDIATE
            self._push_wc(
                qp.recv_cq,
                make_wc(wr_id, _RECV, _OK, pkt.length, pkt.imm, opt, qp.num, 0, pkt.slid),
                pkt.solicited,
            )
            return
        n = pkt.length
        got = self._remote(qp, pkt.rkey, pkt.remote_addr, n, _RDMA_WRITE) if n else None
        if n and got is None:
            self._drop("dropped_access")
            return
        if op is PacketOp.RDMA_WRITE_IMM:
            taken = self._take_recv(qp)
            if taken is None:
                self._drop("dropped_no_recv")
                return
            if got is not None:
                got[: len(pkt.payload)] = pkt.payload
            self._push_wc(
                qp.recv_cq,
                make_wc(taken[0], _RECV_WRITE, _OK, n, pkt.imm, RecvOpt.IMMEDIATE,
                   qp.num, 0, pkt.slid),
                pkt.solicited,
            )
        elif got is not None:
            got[: len(pkt.payload)] = pkt.payload

    @staticmethod
    def _special_drop(qp: MockQp, port: MockPort) -> None:
        """A MAD QP0/QP1 could not take: the port's VL15Dropped/QP1Dropped counts it."""
        if qp.qp_type is QpType.QP1:
            port.pm[QP1_DROPPED] += 1
        elif qp.qp_type is QpType.QP0:
            port.pm[VL15_DROPPED] += 1

    def _mcast_rx(self, pkt: Packet) -> None:
        port = pkt.dst_port
        src_ca = pkt.src_port.ca
        delivered = False
        for m in list(self.mcast_groups.get(pkt.dlid, ())):
            qp = m.qp
            if qp.port is not port or not m.alive:
                continue
            if qp.ca is src_ca and qp.num == pkt.src_qpn:
                continue  # no loopback to the sending QP itself
            if pkt.grh is not None and pkt.grh[24:40] != m.gid.packed:
                continue
            delivered = True
            self._ud_rx(qp, pkt)
        if not delivered:
            self._drop("dropped_no_dest")

    def _ud_rx(self, qp: MockQp, pkt: Packet) -> None:
        state = qp.state
        if state is not _RTS and state is not _RTR and state is not _SQD and state is not _SQERR:
            self._drop("dropped_state")
            self._special_drop(qp, pkt.dst_port)
            return
        port = pkt.dst_port
        qp_type = qp.qp_type
        pkeys = port.pkeys
        if qp_type is QpType.QP0:
            pkey_index = 0
        elif qp_type is QpType.QP1:
            if pkt.qkey != QP1_WELL_KNOWN_QKEY:
                self._qkey_violation(port)
                return
            pkey_index = -1
            for index, key in enumerate(pkeys):
                if pkey_match(pkt.pkey, key):
                    pkey_index = index
                    break
            if pkey_index < 0:
                self._pkey_violation(port)
                return
        else:
            if pkt.qkey != qp.qkey:
                self._qkey_violation(port)
                return
            pkey_index = qp.pkey_index
            mine = pkeys[pkey_index] if pkey_index < len(pkeys) else 0
            if not (pkt.pkey == mine and mine & 0x8000) and not pkey_match(pkt.pkey, mine):
                self._pkey_violation(port)
                return
        if state is _RTR and not qp.comm_est:
            qp.comm_est = True
            self.qp_event(qp, AsyncEvent.QP_COMM)
        taken = self._take_recv(qp)
        if taken is None:
            self._drop("dropped_no_recv")
            self._special_drop(qp, port)
            return
        wr_id, sges = taken
        grh = pkt.grh
        writes: tuple[tuple[int, bytes | memoryview], ...]
        if grh is not None:
            writes = ((0, grh), (GRH_LEN, pkt.payload))
        else:
            writes = ((GRH_LEN, pkt.payload),)
        status = self._scatter(qp, sges, writes, True)
        if status is not _OK:
            self._push_wc(qp.recv_cq, make_wc(wr_id, _RECV, status, 0, None, _NO_OPT, qp.num))
            return
        opt = RecvOpt.NONE
        if pkt.imm is not None:
            opt |= RecvOpt.IMMEDIATE
        if grh is not None:
            opt |= RecvOpt.GRH_VALID
        self._push_wc(
            qp.recv_cq,
            make_wc(
                wr_id, _RECV, _OK, GRH_LEN + pkt.length, pkt.imm, opt, qp.num, pkt.src_qpn,
                pkt.slid, pkt.sl, pkey_index, 0, 0, grh, None if grh is None else _IB_GRH,
            ),
            pkt.solicited,
        )

