"""The mock engine's requester: the send queue, RC/UC sends, and RC responses.

Datagrams (UD sends, multicast, the port agents' MADs) are the part in
:mod:`ibal.providers.mock.datagram`.  Called by the engine under the fabric lock.
"""

from __future__ import annotations

from ibal.providers.mock import invalidate
from ibal.providers.mock.datagram import Datagrams
from ibal.providers.mock.engine_core import (
    _OK,
    _RC,
    _RTS,
    _SQD,
    _T_RNR,
    _UD,
    MAX_MSG,
)
from ibal.providers.mock.objects import (
    MockQp,
    SendWqe,
)
from ibal.providers.mock.packets import (
    PSN_MASK,
    NakCode,
    Packet,
    PacketOp,
    packets_for,
    psn_diff,
    rnr_seconds,
)
from ibal.transport.rules import NAK_WC_STATUS
from ibal.types import (
    WcStatus,
    WrType,
)


class Requester(Datagrams):
    """The mock engine's requester: the send queue, RC/UC sends, and RC responses."""

    # ================================================================ requester
    def sq_progress(self, qp: MockQp) -> None:
        """Transmit whatever the send queue may send now."""
        if qp.rnr_blocked:
            return
        state = qp.state
        if state is not _RTS and state is not _SQD:
            return
        sq = qp.sq
        while qp.send_idx < len(sq):
            wqe = sq[qp.send_idx]
            if wqe.done:  # answered already; a go-back-N does not resend it
                qp.send_idx += 1
                continue
            if wqe.psn is None:
                if state is _SQD:
                    return
                if wqe.fence and qp.rd_atomic_out:
                    return
                if wqe.is_rd_atomic and qp.rd_atomic_out >= max(1, qp.init_depth):
                    return
            qp.send_idx += 1
            self._send_wqe(qp, wqe)
            if qp.state is not state or qp.rnr_blocked:
                return

    def _send_wqe(self, qp: MockQp, wqe: SendWqe) -> None:
        if wqe.local is not None:
            self._local_op(qp, wqe)
            return
        if wqe.bind is not None:
            wqe.done = True
            if wqe.psn is None:
                wqe.psn = qp.sq_psn
                wqe.npsn = 0
            self._complete_front(qp)
            return
        transport = qp.transport
        op = wqe.opcode
        if op is WrType.SEND or op is WrType.RDMA_WRITE:
            data = self.gather(qp, wqe)
            if data is None:
                self._fail_wqe(qp, wqe, WcStatus.LOCAL_PROTECTION_ERR)
                self._complete_front(qp)
                return
        else:
            data = b""
        port = qp.port
        if port is None:
            self._fail_wqe(qp, wqe, WcStatus.LOCAL_OP_ERR)
            self._complete_front(qp)
            return
        if wqe.length >= MAX_MSG:
            self._fail_wqe(qp, wqe, WcStatus.LOCAL_LEN_ERR)
            self._complete_front(qp)
            return
        if transport is _UD:
            self._send_ud(qp, wqe, port, data)
            return
        # ------------------------------------------------------------ RC / UC
        first = wqe.psn is None
        if first:
            if op is WrType.RDMA_READ:
                npsn = packets_for(wqe.length, qp.mtu_bytes)
            elif wqe.is_rd_atomic:
                npsn = 1
            else:
                npsn = packets_for(wqe.length, qp.mtu_bytes)
            wqe.psn = qp.sq_psn
            wqe.npsn = npsn
            qp.sq_psn = (qp.sq_psn + npsn) & PSN_MASK
            if wqe.is_rd_atomic:
                qp.rd_atomic_out += 1
        else:
            self.counters.retransmitted += 1
        av = qp.av
        route = self._route(port, av.dlid) if av is not None else None
        if op is WrType.SEND:
            pop = PacketOp.SEND if wqe.imm is None else PacketOp.SEND_IMM
        elif op is WrType.RDMA_WRITE:
            pop = PacketOp.RDMA_WRITE if wqe.imm is None else PacketOp.RDMA_WRITE_IMM
        elif op is WrType.RDMA_READ:
            pop = PacketOp.RDMA_READ_REQ
        elif op is WrType.COMPARE_SWAP:
            pop = PacketOp.COMPARE_SWAP
        else:
            pop = PacketOp.FETCH_ADD
        if route is None:
            self._discard(port)
        else:
            pkt = Packet(
                pop, transport, port, route[0], route[1], qp.num, qp.dest_qp,
                wqe.psn,  # type: ignore[arg-type]
                port.pkeys[qp.pkey_index] if qp.pkey_index < len(port.pkeys) else 0,
                data,
            )
            pkt.npsn = wqe.npsn
            pkt.imm = wqe.imm
            pkt.inv = wqe.inv
            pkt.solicited = wqe.solicited
            if pop is not PacketOp.SEND and pop is not PacketOp.SEND_IMM:
                pkt.remote_addr = wqe.remote_addr
                pkt.rkey = wqe.rkey
                if pop is PacketOp.RDMA_READ_REQ:
                    pkt.length = wqe.length
                elif wqe.is_rd_atomic:
                    pkt.length = 8
                    pkt.compare = wqe.compare
                    pkt.swap = wqe.swap
            self._transmit(pkt)
        if transport is _RC:
            self.ack_wait.add(qp)
        else:
            wqe.done = True
            self._complete_front(qp)

    def _local_op(self, qp: MockQp, wqe: SendWqe) -> None:
        """LOCAL_INV or a type 2 BIND_MW, reached in send-queue order."""
        loc = wqe.local
        assert loc is not None
        if loc[0] == "inv":
            status = invalidate.local_invalidate(qp.ca, qp, loc[1])
        else:
            status = invalidate.bind_type2(qp.ca, qp, *loc[1:])
        if wqe.psn is None:
            wqe.psn = qp.sq_psn
            wqe.npsn = 0
        if status is _OK:
            wqe.done = True
        else:
            self._fail_wqe(qp, wqe, status)
        self._complete_front(qp)

    def _find_wqe(self, qp: MockQp, psn: int) -> int:
        """Index in the send queue of the transmitted WQE whose PSNs hold ``psn``."""
        sq = qp.sq
        for i in range(qp.send_idx):
            w = sq[i]
            if w.psn is None or w.bind is not None:
                continue
            d = psn_diff(psn, w.psn)
            if 0 <= d < max(1, w.npsn):
                return i
        return -1

    def _implied_ack(self, qp: MockQp, upto: int) -> None:
        """Sends and writes before index ``upto`` are acknowledged by a later response."""
        sq = qp.sq
        for j in range(upto):
            w = sq[j]
            if not w.done and not w.is_rd_atomic:
                w.done = True

    def _progress(self, qp: MockQp) -> None:
        qp.retry_left = qp.retry_cnt
        qp.rnr_left = qp.rnr_retry_cnt
        if qp.timer_armed and not qp.rnr_blocked:
            self.cancel_timer(qp)
        self._complete_front(qp)
        if qp.send_idx:
            self.ack_wait.add(qp)
        if qp.send_idx < len(qp.sq):
            self.sq_progress(qp)

    def _requester_rx(self, pkt: Packet) -> None:
        port = pkt.dst_port
        qp = port.ca.qps.get(pkt.dst_qpn)
        if qp is None or qp.transport is not _RC or qp.port is not port:
            self._drop("dropped_no_dest")
            return
        if qp.state is not _RTS and qp.state is not _SQD:
            self._drop("dropped_state")
            return
        op = pkt.op
        if op is PacketOp.ACK:
            self._rc_ack(qp, pkt.psn)
        elif op is PacketOp.READ_RESP or op is PacketOp.ATOMIC_ACK:
            self._rc_data_resp(qp, pkt)
        elif op is PacketOp.RNR_NAK:
            self._rc_rnr(qp, pkt)
        else:
            self._rc_nak(qp, pkt)

    def _rc_ack(self, qp: MockQp, apsn: int) -> None:
        sq = qp.sq
        moved = False
        for i in range(qp.send_idx):
            w = sq[i]
            if w.psn is None or w.bind is not None:
                continue
            last = (w.psn + max(1, w.npsn) - 1) & PSN_MASK
            if psn_diff(apsn, last) < 0:
                break
            if w.done:
                continue
            if w.is_rd_atomic:
                # An ACK beyond an unanswered READ/atomic: its response was lost.
                qp.send_idx = i
                moved = True
                break
            w.done = True
            moved = True
        if moved:
            self._progress(qp)
        else:
            self.counters.duplicates_received += 1

    def _rc_data_resp(self, qp: MockQp, pkt: Packet) -> None:
        i = self._find_wqe(qp, pkt.psn)
        sq = qp.sq
        if i < 0 or sq[i].done or not sq[i].is_rd_atomic or sq[i].psn != pkt.psn:
            self.counters.duplicates_received += 1
            return
        w = sq[i]
        self._implied_ack(qp, i)
        if pkt.op is PacketOp.READ_RESP:
            status = self._scatter(qp, w.sges, ((0, pkt.payload),), False)
        else:
            orig = pkt.compare.to_bytes(8, "little")
            status = self._scatter(qp, w.sges, ((0, orig),), False)
        qp.rd_atomic_out -= 1
        if status is not _OK:
            self._fail_wqe(qp, w, status)
            self._complete_front(qp)
            return
        w.done = True
        self._progress(qp)

    def _rc_rnr(self, qp: MockQp, pkt: Packet) -> None:
        i = self._find_wqe(qp, pkt.psn)
        if i < 0 or qp.sq[i].done or qp.rnr_blocked:  # stale, or a copy of the one we wait on
            self.counters.duplicates_received += 1
            return
        self._implied_ack(qp, i)
        w = qp.sq[i]
        if qp.rnr_left == 0:
            self._fail_wqe(qp, w, WcStatus.RNR_RETRY_ERR)
            self._complete_front(qp)
            return
        if qp.rnr_retry_cnt != 7:
            qp.rnr_left -= 1
        self.counters.rnr_retries += 1
        qp.send_idx = i
        self.cancel_timer(qp)
        qp.rnr_blocked = True
        qp.timer_armed = True
        self._schedule(self.now + rnr_seconds(pkt.syndrome), _T_RNR, qp, qp.timer_gen)
        self._complete_front(qp)

    def _rc_nak(self, qp: MockQp, pkt: Packet) -> None:
        i = self._find_wqe(qp, pkt.psn)
        if i < 0 or qp.sq[i].done:
            self.counters.duplicates_received += 1
            return
        self._implied_ack(qp, i)
        w = qp.sq[i]
        code = pkt.syndrome
        if code == NakCode.PSN_SEQ_ERR:
            if qp.retry_left == 0:
                self._fail_wqe(qp, w, WcStatus.TIMEOUT_RETRY_ERR)
                self._complete_front(qp)
                return
            qp.retry_left -= 1
            qp.send_idx = i
            self.cancel_timer(qp)
            self._complete_front(qp)
            self.sq_progress(qp)
            return
        self._fail_wqe(qp, w, NAK_WC_STATUS.get(code, WcStatus.REM_OP_ERR))
        self._complete_front(qp)

    def _ack_timeout(self, qp: MockQp) -> None:
        if (qp.state is not _RTS and qp.state is not _SQD) or qp.send_idx == 0:
            return
        self.counters.timeouts += 1
        if qp.retry_left == 0:
            self._fail_wqe(qp, qp.sq[0], WcStatus.TIMEOUT_RETRY_ERR)
            self._complete_front(qp)
            return
        qp.retry_left -= 1
        qp.send_idx = 0
        self.sq_progress(qp)
