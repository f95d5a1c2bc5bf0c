"""The requester: send WRs -> request packets (MTU segments, PSNs, AckReq, window).

The send queue is also the retransmit queue: a WQE stays in it, with its PSNs,
until the completer retires it, and a go-back-N retry (:meth:`Requester.rewind`)
moves the transmit cursor back so :meth:`Requester.poll` regenerates the
packets from the WQE (nothing is kept per packet).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final

from ibal.transport.policy import RXE_POLICY, TransportPolicy
from ibal.transport.psn import PSN_MASK, psn_diff
from ibal.transport.qp import (
    MAX_MSG,
    Counters,
    MemoryAccess,
    Output,
    QpConfig,
    SendWqe,
)
from ibal.transport.rules import effective_qkey
from ibal.transport.scatter import Range, Scatter
from ibal.transport.timers import ack_timeout_seconds
from ibal.transport.wc import make_wc
from ibal.types import (
    WC_TYPE_FOR_WR,
    AsyncEvent,
    QpState,
    QpType,
    RecvOpt,
    SendWr,
    WcStatus,
    WrType,
)
from ibal.wire import packet as P
from ibal.wire.packet import Packet, Train, WqeRun

_OK = WcStatus.SUCCESS
_FLUSHED = WcStatus.WR_FLUSHED_ERR
_NO_OPT = RecvOpt.NONE
_RTS = QpState.RTS
_SQD = QpState.SQD
_SEND = WrType.SEND
_WRITE = WrType.RDMA_WRITE
_READ = WrType.RDMA_READ
_CMP_SWAP = WrType.COMPARE_SWAP

# Opcode offsets by (first, last) for SEND and WRITE; the base adds 0x00 (RC) or 0x20 (UC).
_SEND_OP = {(True, False): 0x00, (False, False): 0x01, (False, True): 0x02, (True, True): 0x04}
_WRITE_OP = {(True, False): 0x06, (False, False): 0x07, (False, True): 0x08, (True, True): 0x0A}

def _run_ops() -> dict[int, tuple[int, int, int, int]]:
    """(FIRST, MIDDLE, LAST, ONLY) opcodes by transport base + 2 * SEND + immediate."""
    out = {}
    for base in (0x00, 0x20):
        for send, table in ((0, _WRITE_OP), (1, _SEND_OP)):
            for imm in (0, 1):
                out[base + 2 * send + imm] = (
                    base + table[(True, False)], base + table[(False, False)],
                    base + table[(False, True)] + imm, base + table[(True, True)] + imm,
                )  # fmt: skip
    return out


_RUN_OPS: Final = _run_ops()


class Requester:
    """One QP's send queue and transmit state.

    ``cur`` indexes the WQE to transmit next and ``cur_pkt`` its next packet;
    ``next_psn`` is the PSN the next new WQE starts at; ``comp_psn`` the oldest
    PSN not yet acknowledged (the completer moves it).
    """

    def __init__(
        self,
        cfg: QpConfig,
        mem: MemoryAccess,
        out: Output,
        counters: Counters,
        on_fatal: Callable[[], None],
        policy: TransportPolicy = RXE_POLICY,
    ) -> None:
        self.cfg = cfg
        self.policy = policy
        self.max_unacked = policy.max_unacked_psns
        self.per_ack = policy.max_pkt_per_ack
        self.mem = mem
        self.out = out
        self.counters = counters
        self.on_fatal = on_fatal
        self.sq: deque[SendWqe] = deque()
        self.cur = 0
        self.cur_pkt = 0
        self.next_psn = cfg.sq_psn
        self.comp_psn = cfg.sq_psn
        self.rd_atomic_out = 0
        self.since_ack_req = 0
        self.ack_deadline: float | None = None
        self.rnr_deadline: float | None = None
        self.retry_left = cfg.retry_cnt
        self.rnr_left = cfg.rnr_retry
        self.retry_started = False
        self.sqd_notify = False
        t = cfg.qp_type
        self.connected = t is QpType.RC or t is QpType.UC
        self.reliable = t is QpType.RC
        self.base = 0x20 if t is QpType.UC else 0x00

    # ------------------------------------------------------------------ set-up
    def set_psn(self, psn: int) -> None:
        """``modify_qp`` gave the send PSN (before anything was sent)."""
        self.next_psn = self.comp_psn = psn & PSN_MASK

    def reset_retries(self) -> None:
        self.retry_left = self.cfg.retry_cnt
        self.rnr_left = self.cfg.rnr_retry

    def post(self, wr: SendWr, inline: bytes | None = None, inv_rkey: int | None = None,
             local: Callable[[], WcStatus] | None = None) -> None:
        """Queue a send WR (the provider validated it); it leaves on a later :meth:`poll`.

        ``local`` (LOCAL_INV, BIND_MW) runs when the queue reaches the WR and
        says how it completes; nothing goes on the wire for it.
        """
        w = SendWqe(wr, self.cfg.mtu, inline, inv_rkey)
        w.local = local
        self.sq.append(w)

    @property
    def outstanding(self) -> bool:
        """Whether a sent PSN still waits for its acknowledgement."""
        return self.next_psn != self.comp_psn

    # ---------------------------------------------------------------- transmit
    def poll(self, now: float, budget: int, out: list[Packet | Train | WqeRun],
             trains: bool = False, runs: bool = False) -> int:
        """Append up to ``budget`` request packets the send queue may send now; how many.

        ``trains``: runs of MIDDLE packets go out as one :class:`Train` each
        (counted as the packets it stands for); ``runs``: a SEND/WRITE's packets
        that fit the window and the budget go out as one :class:`WqeRun` (the
        C engine's send side cuts them).
        """
        cfg = self.cfg
        state = cfg.state
        if (state is not _RTS and state is not _SQD) or self.rnr_deadline is not None:
            return 0
        sq = self.sq
        got = 0
        ran_local = False
        while got < budget and self.cur < len(sq):
            w = sq[self.cur]
            if w.done:
                self.cur += 1
                self.cur_pkt = 0
                continue
            if w.first_psn is None:
                if state is _SQD:
                    break
                if w.local is not None:
                    if w.fence and self.rd_atomic_out:
                        break
                    status = w.local()
                    if status is not _OK:
                        self.fail(w, status)
                        break
                    w.done = True
                    self.cur += 1
                    ran_local = True
                    continue
                if self.reliable:
                    if w.fence and self.rd_atomic_out:
                        break
                    if w.rd_atomic and self.rd_atomic_out >= max(1, cfg.init_depth):
                        break
                    if psn_diff(self.next_psn, self.comp_psn) >= self.max_unacked:
                        break
                if not self._prepare(w):
                    break
                if not self.connected:
                    n0 = len(out)
                    self._send_ud(w, out)
                    got += len(out) - n0
                    continue
                w.first_psn = self.next_psn
                self.next_psn = (self.next_psn + w.npkts) & PSN_MASK
                if w.rd_atomic:
                    self.rd_atomic_out += 1
            if w.rd_atomic:
                out.append(self._rd_atomic_packet(w))
                got += 1
                self.cur += 1
                self.cur_pkt = 0
                continue
            sent, closed = self._segments(w, budget - got, out, trains, runs)
            got += sent
            if closed:
                break
        if self.reliable and got and self.ack_deadline is None:
            t = ack_timeout_seconds(cfg.local_ack_timeout)
            if t:
                self.ack_deadline = now + t
        if not self.reliable or ran_local:
            self.retire()
        return got

    def _prepare(self, w: SendWqe) -> bool:
        """Resolve the WQE's local buffers (first transmission only)."""
        if w.length >= MAX_MSG:
            self.fail(w, WcStatus.LOCAL_LEN_ERR)
            return False
        if w.opcode is _SEND or w.opcode is _WRITE:
            if w.data is None:
                data = self._gather(w)
                if data is None:
                    self.fail(w, WcStatus.LOCAL_PROTECTION_ERR)
                    return False
                w.data = data
            if not self.connected and w.length > self.cfg.mtu:
                self.fail(w, WcStatus.LOCAL_LEN_ERR)
                return False
            return True
        if not self.reliable:
            self.fail(w, WcStatus.LOCAL_OP_ERR)
            return False
        targets: list[Range] = []
        total = 0
        for s in w.sges:
            if not s.length:
                continue
            v = self.mem.local(s.lkey, s.addr, s.length, True)
            if v is None:
                self.fail(w, WcStatus.LOCAL_PROTECTION_ERR)
                return False
            targets.append(v)
            total += s.length
        if w.opcode is not _READ and total < 8:
            self.fail(w, WcStatus.LOCAL_LEN_ERR)
            return False
        w.targets = targets
        return True

    def _gather(self, w: SendWqe) -> Range | bytes | None:
        sges = w.sges
        mem = self.mem
        if len(sges) == 1:
            s = sges[0]
            if not s.length:
                return b""
            return mem.local(s.lkey, s.addr, s.length, False)
        parts: list[Range] = []
        for s in sges:
            if not s.length:
                continue
            v = mem.local(s.lkey, s.addr, s.length, False)
            if v is None:
                return None
            parts.append(v)
        try:
            return b"".join(parts)  # type: ignore[arg-type]
        except TypeError:
            # a Scatter is no buffer: found out here, so a list of views pays nothing
            return b"".join([bytes(p) for p in parts])

    def _segments(self, w: SendWqe, budget: int, out: list[Packet | Train | WqeRun],
                  trains: bool, runs: bool = False) -> tuple[int, bool]:
        """Append packets of a SEND/WRITE from ``cur_pkt``; (packets, the window closed)."""
        cfg = self.cfg
        mtu = cfg.mtu
        data = w.data
        assert data is not None and w.first_psn is not None
        wr = w.wr
        is_send = w.opcode is _SEND
        table = _SEND_OP if is_send else _WRITE_OP
        base = self.base
        npkts = w.npkts
        reliable = self.reliable
        max_unacked = self.max_unacked
        per_ack = self.per_ack
        k = self.cur_pkt
        sent = 0
        while k < npkts and sent < budget:
            psn = (w.first_psn + k) & PSN_MASK
            room = max_unacked - psn_diff(psn, self.comp_psn) if reliable else npkts
            if room <= 0:
                self.cur_pkt = k
                if not is_send:
                    self.counters.rdma_sends += sent
                return sent, True
            if (runs and not isinstance(data, Scatter)  # the C engine takes one buffer
                    and not (is_send and w.inv_rkey is not None and reliable)):
                # the rest of the WQE that fits, one record: the same packets as below
                m = min(npkts - k, budget - sent, room)
                run = WqeRun(_RUN_OPS[base + (1 if is_send else 0) * 2 + (1 if w.imm else 0)],
                             cfg.dest_qpn, cfg.pkey, w.first_psn, npkts, data, mtu, k, m,
                             self.since_ack_req, per_ack, reliable)
                if not is_send:
                    run.reth = True
                    run.va = wr.remote_addr
                    run.rkey = wr.rkey
                    run.dma_len = w.length
                if w.imm:
                    run.imm = wr.imm
                run.se = w.solicited and (is_send or w.imm)
                run.src_ip = cfg.src_ip
                run.dst_ip = cfg.dst_ip
                run.src_port = cfg.src_port
                out.append(run)
                self.since_ack_req = run.since_after
                sent += m
                k += m
                continue
            first = k == 0
            last = k == npkts - 1
            if trains and not first and not last:
                m = min(npkts - 1 - k, budget - sent, room)
                if m >= 2:
                    # the MIDDLE packets up to the last (or the window, or the budget)
                    head = Packet(base + table[(False, False)], cfg.dest_qpn, psn,
                                  data[k * mtu : (k + 1) * mtu], pkey=cfg.pkey)
                    head.src_ip = cfg.src_ip
                    head.dst_ip = cfg.dst_ip
                    head.src_port = cfg.src_port
                    # only rxe's socket layer polls trains, and its ranges are views
                    out.append(Train(head, data, k * mtu, mtu,  # type: ignore[arg-type]
                                     m, self.since_ack_req, per_ack, reliable))
                    self.since_ack_req = (self.since_ack_req + m) % per_ack
                    sent += m
                    k += m
                    continue
            op = base + table[(first, last)]
            off = k * mtu
            pkt = Packet(op, cfg.dest_qpn, psn, data[off : off + mtu], pkey=cfg.pkey)
            if first and not is_send:
                pkt.va = wr.remote_addr
                pkt.rkey = wr.rkey
                pkt.dma_len = w.length
            if last:
                imm = w.imm
                if imm:
                    op += 1  # LAST -> LAST_IMM, ONLY -> ONLY_IMM
                    pkt.imm = wr.imm
                elif is_send and w.inv_rkey is not None and reliable:
                    op = P.Opcode.RC_SEND_ONLY_INV if first else P.Opcode.RC_SEND_LAST_INV
                    pkt.inv_rkey = w.inv_rkey
                pkt.opcode = op
                # SE only where a receive completes: SEND, WRITE with immediate (rxe_req.c)
                pkt.se = w.solicited and (is_send or imm)
            self.since_ack_req += 1
            if last or self.since_ack_req >= per_ack:
                pkt.ack_req = reliable
                self.since_ack_req = 0
            pkt.src_ip = cfg.src_ip
            pkt.dst_ip = cfg.dst_ip
            pkt.src_port = cfg.src_port
            out.append(pkt)
            sent += 1
            k += 1
        if not is_send:
            self.counters.rdma_sends += sent
        if k >= npkts:
            self.cur += 1
            self.cur_pkt = 0
            if not reliable:
                w.done = True
            return sent, False
        self.cur_pkt = k
        return sent, False

    def _rd_atomic_packet(self, w: SendWqe) -> Packet:
        cfg = self.cfg
        wr = w.wr
        assert w.first_psn is not None
        if w.opcode is _READ:
            # A retried READ asks only for what has not arrived yet (rxe req_retry).
            off = w.got * cfg.mtu
            pkt = Packet(P.Opcode.RC_RDMA_READ_REQUEST, cfg.dest_qpn,
                         (w.first_psn + w.got) & PSN_MASK, pkey=cfg.pkey)
            pkt.va = wr.remote_addr + off
            pkt.dma_len = w.length - off
        else:
            op = P.Opcode.RC_COMPARE_SWAP if w.opcode is _CMP_SWAP else P.Opcode.RC_FETCH_ADD
            pkt = Packet(op, cfg.dest_qpn, w.first_psn, pkey=cfg.pkey)
            pkt.va = wr.remote_addr
            if w.opcode is _CMP_SWAP:
                pkt.compare = wr.compare_add
                pkt.swap_add = wr.swap
            else:
                pkt.swap_add = wr.compare_add
        pkt.rkey = wr.rkey
        pkt.ack_req = True
        self.since_ack_req = 0
        self.counters.rdma_sends += 1
        pkt.src_ip = cfg.src_ip
        pkt.dst_ip = cfg.dst_ip
        pkt.src_port = cfg.src_port
        return pkt

    def _send_ud(self, w: SendWqe, out: list[Packet | Train | WqeRun]) -> None:
        cfg = self.cfg
        wr = w.wr
        ud = wr.ud
        if ud is None:
            self.fail(w, WcStatus.LOCAL_OP_ERR)
            return
        imm = w.imm
        op = P.Opcode.UD_SEND_ONLY_IMM if imm else P.Opcode.UD_SEND_ONLY
        data = w.data
        assert data is not None
        if isinstance(data, Scatter):
            data = bytes(data)  # one packet: the codec wants one buffer
        pkt = Packet(op, ud.remote_qp & 0xFFFFFF, self.next_psn, data, pkey=cfg.pkey)
        self.next_psn = (self.next_psn + 1) & PSN_MASK
        if cfg.qp_type is QpType.QP1:
            pkt.qkey = P.GSI_QKEY
        else:
            pkt.qkey = effective_qkey(ud.remote_qkey, cfg.qkey)
        pkt.src_qpn = cfg.qpn
        pkt.imm = wr.imm if imm else 0
        pkt.se = w.solicited
        pkt.ack_req = True  # as rxe sends UD and GSI
        pkt.src_ip = cfg.src_ip
        pkt.dst_ip = ud.av.dst_ip
        pkt.src_port = cfg.src_port
        out.append(pkt)
        w.first_psn = pkt.psn
        w.done = True
        self.cur += 1

    # ------------------------------------------------------------ retry points
    def rewind(self, psn: int) -> None:
        """Go back N: transmit again from the oldest unfinished WQE, at ``psn`` within it."""
        sq = self.sq
        for i, w in enumerate(sq):
            if w.done or w.first_psn is None:
                continue
            self.cur = i
            if w.rd_atomic:
                self.cur_pkt = 0
            else:
                k = psn_diff(psn, w.first_psn)
                self.cur_pkt = k if 0 <= k < w.npkts else 0
            self.since_ack_req = 0
            return

    # ------------------------------------------------------------- completions
    def retire(self) -> None:
        """Complete finished WQEs off the front of the send queue, in order."""
        sq = self.sq
        wcs = self.out.send_wcs
        qpn = self.cfg.qpn
        while sq and sq[0].done:
            w = sq.popleft()
            if self.cur:
                self.cur -= 1
            if w.signaled or w.status is not _OK:
                wcs.append(make_wc(w.wr.wr_id, WC_TYPE_FOR_WR[w.opcode], w.status, w.length,
                                   None, _NO_OPT, qpn))
        if self.sqd_notify:
            self.check_drained()

    def check_drained(self) -> None:
        """SQD: once nothing sent is unfinished, raise SQ_DRAINED (once per SQD entry)."""
        sq = self.sq
        if self.cfg.state is _SQD and (not sq or sq[0].first_psn is None):
            self.sqd_notify = False
            self.out.events.append(AsyncEvent.SQ_DRAINED)

    def fail(self, w: SendWqe, status: WcStatus) -> None:
        """``w`` completes in error; the QP leaves the working states."""
        w.done = True
        w.status = status
        self.on_fatal()

    def flush(self) -> None:
        """Complete every WQE: finished ones as they ended, the rest WR_FLUSHED_ERR."""
        for w in self.sq:
            if not w.done:
                w.done = True
                w.status = _FLUSHED
        self.retire()
        self.cur = self.cur_pkt = 0
        self.rd_atomic_out = 0
        self.ack_deadline = self.rnr_deadline = None
