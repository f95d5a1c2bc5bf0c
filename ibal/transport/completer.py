"""The completer: responses and timers -> completions, retries and QP errors.

It works on the :class:`~ibal.transport.requester.Requester`'s send queue
(rxe ``rxe_comp.c`` rules, roce-wire.md 2.7-2.9):

* a response for PSN ``r`` implicitly acknowledges every SEND/WRITE before
  ``r``; an unanswered READ/atomic before ``r`` means its responses were lost:
  go back to it (once until progress, like rxe's ``started_retry``);
* ACK completes what it covers (coalesced ACKs complete many WQEs);
* PSN sequence NAK and the local ACK timeout cost one transport retry
  (``retry_cnt``; 7 is infinite under the rxe policy) and go back N;
* RNR NAK waits the timer its syndrome codes, then retries (``rnr_retry``; 7 is
  infinite);
* other NAKs complete the WQE with the matching error and end the QP.
"""

from __future__ import annotations

from ibal.transport.policy import RXE_POLICY, TransportPolicy
from ibal.transport.psn import PSN_MASK, psn_diff
from ibal.transport.qp import Counters, QpConfig, SendWqe, scatter
from ibal.transport.requester import Requester
from ibal.transport.rules import NAK_WC_STATUS
from ibal.transport.timers import INFINITE_RETRY, ack_timeout_seconds, rnr_seconds
from ibal.types import QpState, WcStatus, WrType
from ibal.wire import packet as P
from ibal.wire.packet import Packet

_RTS = QpState.RTS
_SQD = QpState.SQD
_ATOMIC_FLAG = P.ATOMIC
_READ_FLAG = P.READ
_LAST_FLAG = P.LAST


class Completer:
    """Response and timer handling for one RC QP's requester."""

    def __init__(self, req: Requester, cfg: QpConfig, counters: Counters,
                 policy: TransportPolicy = RXE_POLICY) -> None:
        self.req = req
        self.cfg = cfg
        self.counters = counters
        self.infinite_at_7 = policy.infinite_retry_at_7

    # --------------------------------------------------------------- responses
    def receive(self, pkt: Packet, now: float) -> None:
        """Process one RC response packet addressed to this QP."""
        req = self.req
        counters = self.counters
        state = self.cfg.state
        if state is not _RTS and state is not _SQD:
            counters.drop("response_state")
            return
        r = pkt.psn
        d = psn_diff(r, req.comp_psn)
        if d < 0:
            counters.drop("stale_response")
            return
        if d >= psn_diff(req.next_psn, req.comp_psn):
            counters.drop("response_psn_unsent")
            return
        sq = req.sq
        # The WQE holding PSN r; the unfinished ones before it are implicitly acked.
        i = -1
        for j, w in enumerate(sq):
            if w.done:
                continue
            fp = w.first_psn
            if fp is None:
                break
            k = psn_diff(r, fp)
            if k < 0:  # before this WQE: a late copy for one already finished
                counters.drop("stale_response")
                return
            if k < w.npkts:
                i = j
                break
            if w.rd_atomic:
                self._lost_response(now)
                req.retire()
                return
            w.done = True
            req.comp_psn = (fp + w.npkts) & PSN_MASK
        if i < 0:
            counters.drop("response_psn_unsent")
            return
        w = sq[i]
        flags = P.OP_FLAGS[pkt.opcode]
        assert w.first_psn is not None
        if flags & _READ_FLAG:
            self._read_response(w, pkt, flags, now)
        elif flags & _ATOMIC_FLAG:
            if not w.rd_atomic or w.opcode is WrType.RDMA_READ or r != w.first_psn:
                counters.drop("unexpected_response")
            else:
                self._scatter(w, 0, (pkt.orig & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little"))
                self._finish(w, r, now)
        else:
            syn = pkt.syndrome
            kind = syn & P.AETH_TYPE_MASK
            if kind == P.AETH_TYPE_ACK:
                if w.rd_atomic:
                    self._lost_response(now)
                else:
                    if psn_diff(r, w.first_psn) == w.npkts - 1:
                        w.done = True
                    self._progress(r, now)
            elif kind == P.AETH_TYPE_RNR_NAK:
                self._rnr(w, r, syn, now)
            elif syn == P.Nak.PSN_SEQ_ERR:
                counters.rcvd_seq_err += 1
                req.comp_psn = r
                self._retry(now)
            else:
                req.fail(w, NAK_WC_STATUS.get(syn & 0x1F, WcStatus.REM_OP_ERR))
                return
        req.retire()

    def _read_response(self, w: SendWqe, pkt: Packet, flags: int, now: float) -> None:
        assert w.first_psn is not None
        counters = self.counters
        if w.opcode is not WrType.RDMA_READ:
            counters.drop("unexpected_response")
            return
        expect = (w.first_psn + w.got) & PSN_MASK
        d = psn_diff(pkt.psn, expect)
        if d > 0:
            self._lost_response(now)
            return
        if d < 0:  # an old copy, from before a retry
            counters.drop("stale_response")
            return
        mtu = self.cfg.mtu
        off = w.got * mtu
        n = len(pkt.payload)
        last = bool(flags & _LAST_FLAG)
        if off + n > w.length or (not last and n != mtu) or (last and off + n != w.length):
            counters.drop("bad_read_response")
            return
        if n:
            self._scatter(w, off, pkt.payload)
        w.got += 1
        if last:
            self._finish(w, pkt.psn, now)
        else:
            self._progress(pkt.psn, now)

    def _finish(self, w: SendWqe, psn: int, now: float) -> None:
        w.done = True
        self.req.rd_atomic_out -= 1
        self._progress(psn, now)

    @staticmethod
    def _scatter(w: SendWqe, off: int, data: bytes | memoryview) -> None:
        assert w.targets is not None
        scatter(w.targets, off, data)

    # ---------------------------------------------------------------- progress
    def _progress(self, psn: int, now: float) -> None:
        """Everything up to ``psn`` is acknowledged."""
        req = self.req
        req.comp_psn = (psn + 1) & PSN_MASK
        req.reset_retries()
        req.retry_started = False
        self._rearm(now)

    def _rearm(self, now: float) -> None:
        req = self.req
        if req.outstanding and req.rnr_deadline is None:
            t = ack_timeout_seconds(self.cfg.local_ack_timeout)
            req.ack_deadline = now + t if t else None
        else:
            req.ack_deadline = None

    def _lost_response(self, now: float) -> None:
        """A later response shows a READ/atomic response went missing."""
        if self.req.retry_started:
            self.counters.drop("response_gap")
            return
        self._retry(now)

    def _retry(self, now: float) -> None:
        req = self.req
        self.counters.completer_retry_err += 1
        if self.cfg.retry_cnt != INFINITE_RETRY or not self.infinite_at_7:
            if req.retry_left <= 0:
                self.counters.retry_exceeded_err += 1
                w = self._oldest()
                if w is not None:
                    req.fail(w, WcStatus.TIMEOUT_RETRY_ERR)
                return
            req.retry_left -= 1
        req.retry_started = True
        req.rewind(req.comp_psn)
        self._rearm(now)

    def _oldest(self) -> SendWqe | None:
        for w in self.req.sq:
            if not w.done:
                return w
        return None

    def _rnr(self, w: SendWqe, psn: int, syn: int, now: float) -> None:
        req = self.req
        self.counters.rcvd_rnr_err += 1
        if w.rd_atomic:
            self.counters.drop("unexpected_response")
            return
        req.comp_psn = psn
        if self.cfg.rnr_retry != INFINITE_RETRY:
            if req.rnr_left <= 0:
                self.counters.retry_rnr_exceeded_err += 1
                req.fail(w, WcStatus.RNR_RETRY_ERR)
                return
            req.rnr_left -= 1
        req.rewind(psn)
        req.ack_deadline = None
        req.rnr_deadline = now + rnr_seconds(syn)

    # ------------------------------------------------------------------ timers
    def handle_timer(self, now: float) -> None:
        req = self.req
        rnr = req.rnr_deadline
        if rnr is not None and now >= rnr:
            req.rnr_deadline = None
        ack = req.ack_deadline
        if ack is not None and now >= ack:
            req.ack_deadline = None
            state = self.cfg.state
            if req.outstanding and (state is _RTS or state is _SQD):
                self._retry(now)
                req.retire()
