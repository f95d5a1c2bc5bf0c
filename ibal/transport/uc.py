"""The UC responder: RC's receive rules without responses or retries.

A PSN gap drops the rest of the message until the next FIRST/ONLY packet (its
receive WQE is then reused); an older PSN is dropped; what cannot be taken (no
receive WQE, bad R_Key) is dropped and counted, and the QP stays up.  A receive
that fails locally (too small, bad L_Key) completes in error and ends the QP.
"""

from __future__ import annotations

from ibal.transport.psn import PSN_MASK, psn_diff
from ibal.transport.responder import RecvTarget, Responder
from ibal.transport.wc import make_wc
from ibal.types import AccessFlags, RecvOpt, WcStatus, WcType
from ibal.wire import packet as P
from ibal.wire.packet import Packet

_OK = WcStatus.SUCCESS
_RECV_WRITE = WcType.RECV_RDMA_WRITE
_IMM_OPT = RecvOpt.IMMEDIATE
_R_WRITE = int(AccessFlags.RDMA_WRITE)
_F_FIRST = P.FIRST
_F_LAST = P.LAST
_F_SEND = P.SEND
_F_RWQE = P.CONSUMES_RWQE
_IN_NONE = Responder.IN_NONE
_IN_SEND = Responder.IN_SEND
_IN_WRITE = Responder.IN_WRITE


class UcResponder(Responder):
    """One UC QP's receive side."""

    def receive(self, pkt: Packet) -> None:
        flags = P.OP_FLAGS[pkt.opcode]
        d = psn_diff(pkt.psn, self.epsn)
        first = flags & _F_FIRST
        if d < 0:
            self.counters.duplicate_request += 1
            self.counters.drop("duplicate")
            return
        if d or self.drop_msg:
            if not first:
                self.drop_msg = True
                self.epsn = (pkt.psn + 1) & PSN_MASK
                self.counters.drop("uc_partial_message")
                return
            self.drop_msg = False
            # The message in progress lost its end: forget it (its WQE is reused).
            self.in_msg = _IN_NONE
            self.wview = None
        self.epsn = (pkt.psn + 1) & PSN_MASK
        kind = _IN_SEND if flags & _F_SEND else _IN_WRITE
        if (self.in_msg and (first or kind != self.in_msg)) or (
            not self.in_msg and not first
        ):
            self.drop_msg = not flags & _F_LAST
            self.in_msg = _IN_NONE
            self.counters.drop("uc_bad_sequence")
            return
        if kind == _IN_WRITE and not self.cfg.access & _R_WRITE:
            self.drop_msg = not flags & _F_LAST
            self.counters.drop("qp_access")
            return
        ok = self._send(pkt, flags) if kind == _IN_SEND else self._uc_write(pkt, flags)
        if not ok:
            self.in_msg = _IN_NONE
            self.drop_msg = not flags & _F_LAST

    def _uc_write(self, pkt: Packet, flags: int) -> bool:
        if flags & _F_FIRST:
            length = pkt.dma_len
            view = self.mem.remote(pkt.rkey, pkt.va, length, _R_WRITE) if length else None
            if length and view is None:
                self.counters.drop("bad_rkey")
                return False
            self.wview = view
            self.woff = 0
            self.wlen = length
        end = self.woff + len(pkt.payload)
        last = flags & _F_LAST
        if end > self.wlen or (last and end != self.wlen):
            self.counters.drop("bad_length")
            return False
        if flags & _F_RWQE and self.target is None:
            got = self.rq.take()
            if got is None:
                self.counters.drop("no_recv_wqe")
                return False
            self.target = RecvTarget(got[0], [], 0)
        if len(pkt.payload):
            assert self.wview is not None
            self.wview[self.woff : end] = pkt.payload
        self.woff = end
        if not last:
            self.in_msg = _IN_WRITE
            return True
        self.in_msg = _IN_NONE
        self.wview = None
        target = self.target
        if target is not None and flags & _F_RWQE:
            self.target = None
            self.out.recv_wcs.append(
                (make_wc(target.wr_id, _RECV_WRITE, _OK, self.wlen, pkt.imm, _IMM_OPT,
                         self.cfg.qpn), pkt.se)
            )
        return True
