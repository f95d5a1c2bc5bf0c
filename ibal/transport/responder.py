"""The RC/UC responder: request packets -> memory, receive completions, responses.

RC follows rxe ``rxe_resp.c`` and roce-wire.md 2.7-2.9: the expected PSN is
executed; a newer PSN gets one PSN-sequence NAK (then silence until the gap
closes); an older one is a duplicate (SEND/WRITE re-ACKed, a READ the responder still holds
replayed, atomic answered from its saved result).  ACKs go out only for packets with
AckReq (a duplicate SEND/WRITE too, unless the policy ACKs every duplicate).
Responses leave in PSN order through one queue; READ responses are generated
lazily from it, and a READ holds a responder resource until its last response
packet has left: where the policy enforces ``resp_res``, more of them is an
invalid request.
UC has no responses: a PSN gap drops the rest of the message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ibal.transport.policy import RXE_POLICY, TransportPolicy
from ibal.transport.psn import PSN_MASK, packets_for, psn_diff
from ibal.transport.qp import (
    MAX_MSG,
    Counters,
    MemoryAccess,
    Output,
    QpConfig,
    RecvSource,
    scatter,
)
from ibal.transport.responses import ResponseQueue
from ibal.transport.rules import NakCode, atomic_result
from ibal.transport.scatter import Range
from ibal.transport.wc import make_wc
from ibal.types import AccessFlags, AsyncEvent, QpType, RecvOpt, Sge, WcStatus, WcType
from ibal.wire import packet as P
from ibal.wire.packet import Packet

_OK = WcStatus.SUCCESS
_RECV = WcType.RECV
_RECV_WRITE = WcType.RECV_RDMA_WRITE
_NO_OPT = RecvOpt.NONE
_IMM_OPT = RecvOpt.IMMEDIATE
_R_READ = int(AccessFlags.RDMA_READ)
_R_WRITE = int(AccessFlags.RDMA_WRITE)
_R_ATOMIC = int(AccessFlags.ATOMIC)

_F_SEND = P.SEND
_F_WRITE = P.WRITE
_F_READ = P.READ
_F_ATOMIC = P.ATOMIC
_F_FIRST = P.FIRST
_F_MIDDLE = P.MIDDLE
_F_LAST = P.LAST
_F_IMM = P.IMMDT
_F_IETH = P.IETH
_INV_OPT = RecvOpt.INVALIDATE
_F_RWQE = P.CONSUMES_RWQE

_IN_NONE = 0
_IN_SEND = 1
_IN_WRITE = 2

ATOMIC_CACHE = 64
"""Atomic results kept for duplicates (at least ``resp_res`` are needed)."""
MAX_QUEUED_REPLAYS = 256
"""Beyond this many queued responses, duplicate READs are dropped (a flood bound)."""



class RecvTarget:
    """The receive WQE a SEND is landing in: its buffers and the write position."""

    __slots__ = ("cap", "off", "views", "wr_id")

    def __init__(self, wr_id: int, views: list[Range], cap: int) -> None:
        self.wr_id = wr_id
        self.views = views
        self.cap = cap
        self.off = 0

    def write(self, data: bytes | memoryview) -> None:
        off = self.off
        self.off = off + len(data)
        scatter(self.views, off, data)


def resolve_recv(mem: MemoryAccess, wr_id: int, sges: Sequence[Sge]) -> RecvTarget | None:
    """The receive WR's buffers, or None if an SGE fails its L_Key check."""
    views: list[Range] = []
    cap = 0
    for s in sges:
        if not s.length:
            continue
        v = mem.recv(s.lkey, s.addr, s.length)
        if v is None:
            return None
        views.append(v)
        cap += s.length
    return RecvTarget(wr_id, views, cap)


class Responder:
    """One RC QP's receive side (the base of UC's)."""

    IN_NONE = _IN_NONE
    IN_SEND = _IN_SEND
    IN_WRITE = _IN_WRITE
    """What ``in_msg`` says is in progress."""

    def __init__(
        self,
        cfg: QpConfig,
        mem: MemoryAccess,
        rq: RecvSource,
        out: Output,
        counters: Counters,
        on_fatal: Callable[[], None],
        policy: TransportPolicy = RXE_POLICY,
    ) -> None:
        self.cfg = cfg
        self.mem = mem
        self.rq = rq
        self.ack_every_duplicate = policy.ack_every_duplicate
        self.enforce_resp_res = policy.enforce_resp_res
        self.out = out
        self.counters = counters
        self.on_fatal = on_fatal
        self.uc = cfg.qp_type is QpType.UC
        self.epsn = cfg.rq_psn
        self.msn = 0
        self.nak_sent = False
        self.drop_msg = False
        self.in_msg = _IN_NONE
        self.target: RecvTarget | None = None
        self.wview: Range | None = None
        self.woff = 0
        self.wlen = 0
        self.responses = ResponseQueue(cfg)
        self.atomic_cache: dict[int, int] = {}
        self.reads: list[tuple[int, int, int, int, int]] = []
        """The last ``max(1, resp_res)`` READs executed: (first PSN, last PSN, R_Key, VA,
        length), kernel rxe's READ resources; only these may be replayed."""

    def set_psn(self, psn: int) -> None:
        self.epsn = psn & PSN_MASK

    def _resources_used(self) -> bool:
        """Whether every responder resource is held by a READ still being answered."""
        return self.responses.reads_pending >= max(1, self.cfg.resp_res)

    def _ack(self, psn: int, syndrome: int = P.AETH_ACK_UNLIMITED) -> None:
        self.responses.ack(psn, syndrome, self.msn)

    def _fatal(self, pkt: Packet, code: NakCode, reason: str,
               event: AsyncEvent | None = None) -> None:
        """A class C/J error: NAK ``pkt``'s PSN and take the QP to ERROR."""
        self.counters.drop(reason)
        if event is not None:
            self.out.events.append(event)
        self.in_msg = _IN_NONE
        self.wview = None
        self.on_fatal()  # flushes, and clears the response queue ...
        if not self.uc:  # ... so that the NAK is the last thing this QP sends
            self._ack(pkt.psn, P.AETH_TYPE_NAK | code)

    def _recv_error(self, pkt: Packet, target_wr_id: int, status: WcStatus, code: NakCode,
                    reason: str) -> None:
        self.target = None
        self.out.recv_wcs.append(
            (make_wc(target_wr_id, _RECV, status, 0, None, _NO_OPT, self.cfg.qpn), False)
        )
        self._fatal(pkt, code, reason)

    # ----------------------------------------------------------------- receive
    def receive(self, pkt: Packet) -> None:
        """Process one request packet addressed to this QP (state and P_Key checked)."""
        flags = P.OP_FLAGS[pkt.opcode]
        d = psn_diff(pkt.psn, self.epsn)
        if d:
            if d > 0:
                self.counters.out_of_seq_request += 1
                self.counters.drop("out_of_sequence")
                if not self.nak_sent:
                    self.nak_sent = True
                    self._ack(self.epsn, P.Nak.PSN_SEQ_ERR)
                return
            self.counters.duplicate_request += 1
            self._duplicate(pkt, flags)
            return
        if not self._check_sequence(pkt, flags):
            return
        if flags & _F_SEND:
            done = self._send(pkt, flags)
        else:
            if flags & _F_WRITE:
                done = self._write(pkt, flags)
            elif flags & _F_READ:
                done = self._read(pkt)
            else:
                done = self._atomic(pkt)
            self.counters.rdma_recvs += done
        if not done:
            return
        self.nak_sent = False
        if flags & _F_READ:
            return  # epsn moved by the READ's response count
        self.epsn = (self.epsn + 1) & PSN_MASK
        if pkt.ack_req and not flags & _F_ATOMIC:
            self._ack(pkt.psn)

    def _check_sequence(self, pkt: Packet, flags: int) -> bool:
        """Opcode order, payload lengths and the QP's access: else NAK invalid request."""
        kind = _IN_SEND if flags & _F_SEND else _IN_WRITE if flags & _F_WRITE else _IN_NONE
        first = flags & _F_FIRST
        if self.in_msg:
            if first or kind != self.in_msg:
                self._fatal(pkt, NakCode.INVALID_REQUEST, "missing_last", AsyncEvent.WQ_REQ_ERROR)
                return False
        elif flags & (_F_MIDDLE | _F_LAST) and not first:
            self._fatal(pkt, NakCode.INVALID_REQUEST, "missing_first", AsyncEvent.WQ_REQ_ERROR)
            return False
        n = len(pkt.payload)
        mtu = self.cfg.mtu
        last = flags & _F_LAST
        if kind and (
            (not last and n != mtu) or (last and not first and not 0 < n <= mtu) or n > mtu
        ):
            self._fatal(pkt, NakCode.INVALID_REQUEST, "bad_length", AsyncEvent.WQ_REQ_ERROR)
            return False
        need = (
            0 if kind == _IN_SEND else _R_WRITE if kind == _IN_WRITE
            else _R_READ if flags & _F_READ else _R_ATOMIC
        )
        if need and not self.cfg.access & need:
            self._fatal(pkt, NakCode.INVALID_REQUEST, "qp_access", AsyncEvent.WQ_REQ_ERROR)
            return False
        return True

    def _take_target(self, pkt: Packet) -> RecvTarget | None:
        """The receive WQE for a message, or None after an RNR NAK / error."""
        got = self.rq.take()
        if got is None:
            self.counters.send_rnr_err += 1
            self.counters.drop("no_recv_wqe")
            if not self.uc:
                self._ack(pkt.psn, P.rnr_nak_syndrome(self.cfg.min_rnr_timer))
            return None
        wr_id, sges = got
        target = resolve_recv(self.mem, wr_id, sges)
        if target is None:
            self._recv_error(pkt, wr_id, WcStatus.LOCAL_PROTECTION_ERR, NakCode.REMOTE_OP,
                             "recv_lkey")
        return target

    def _send(self, pkt: Packet, flags: int) -> bool:
        target = self.target
        if flags & _F_FIRST:
            if target is None:
                target = self._take_target(pkt)
                if target is None:
                    return False
                self.target = target
            target.off = 0
        assert target is not None
        payload = pkt.payload
        if target.off + len(payload) > target.cap:
            self._recv_error(pkt, target.wr_id, WcStatus.LOCAL_LEN_ERR, NakCode.INVALID_REQUEST,
                             "recv_too_small")
            return False
        if len(payload):
            target.write(payload)
        if not flags & _F_LAST:
            self.in_msg = _IN_SEND
            return True
        status = _OK
        if flags & _F_IETH and not self.mem.invalidate(pkt.inv_rkey):
            self._recv_error(pkt, target.wr_id, WcStatus.REM_INVALID_REQ_ERR,
                             NakCode.INVALID_REQUEST, "bad_invalidate")
            return False
        self.target = None
        self.in_msg = _IN_NONE
        self.msn = (self.msn + 1) & PSN_MASK
        if flags & _F_IMM:
            wc = make_wc(target.wr_id, _RECV, status, target.off, pkt.imm, _IMM_OPT, self.cfg.qpn)
        elif flags & _F_IETH:
            wc = make_wc(target.wr_id, _RECV, status, target.off, None, _INV_OPT, self.cfg.qpn,
                         invalidated_rkey=pkt.inv_rkey)
        else:
            wc = make_wc(target.wr_id, _RECV, status, target.off, None, _NO_OPT, self.cfg.qpn)
        self.out.recv_wcs.append((wc, pkt.se))
        return True

    def _write(self, pkt: Packet, flags: int) -> bool:
        first = flags & _F_FIRST
        if first:
            length = pkt.dma_len
            if length > MAX_MSG:
                self._fatal(pkt, NakCode.INVALID_REQUEST, "bad_length", AsyncEvent.WQ_REQ_ERROR)
                return False
            view = None
            if length:
                view = self.mem.remote(pkt.rkey, pkt.va, length, _R_WRITE)
                if view is None:
                    self._fatal(pkt, NakCode.REMOTE_ACCESS, "bad_rkey",
                                AsyncEvent.WQ_ACCESS_ERROR)
                    return False
            woff = 0
            wlen = length
        else:
            view = self.wview
            woff = self.woff
            wlen = self.wlen
        payload = pkt.payload
        n = len(payload)
        end = woff + n
        last = flags & _F_LAST
        if end > wlen or (last and end != wlen):
            self._fatal(pkt, NakCode.INVALID_REQUEST, "bad_length", AsyncEvent.WQ_REQ_ERROR)
            return False
        target = None
        if flags & _F_RWQE:
            # Check for a receive WQE before any byte lands, so an RNR retry is clean.
            target = self.target
            if target is None:
                got = self.rq.take()
                if got is None:
                    self.counters.send_rnr_err += 1
                    self.counters.drop("no_recv_wqe")
                    if not self.uc:
                        self._ack(pkt.psn, P.rnr_nak_syndrome(self.cfg.min_rnr_timer))
                    if first:
                        self.wview = None
                    return False
                target = RecvTarget(got[0], [], 0)
        if n:
            assert view is not None
            view[woff:end] = payload
        if not last:
            self.wview = view
            self.woff = end
            self.wlen = wlen
            self.in_msg = _IN_WRITE
            return True
        self.wview = None
        self.in_msg = _IN_NONE
        self.msn = (self.msn + 1) & PSN_MASK
        if target is not None:
            self.target = None
            self.out.recv_wcs.append(
                (make_wc(target.wr_id, _RECV_WRITE, _OK, wlen, pkt.imm, _IMM_OPT, self.cfg.qpn),
                 pkt.se)
            )
        return True

    def _read(self, pkt: Packet) -> bool:
        length = pkt.dma_len
        if length > MAX_MSG:
            self._fatal(pkt, NakCode.INVALID_REQUEST, "bad_length", AsyncEvent.WQ_REQ_ERROR)
            return False
        if self.enforce_resp_res and self._resources_used():
            self._fatal(pkt, NakCode.INVALID_REQUEST, "responder_resources",
                        AsyncEvent.WQ_REQ_ERROR)
            return False
        view: Range | bytes = b""
        if length:
            v = self.mem.remote(pkt.rkey, pkt.va, length, _R_READ)
            if v is None:
                self._fatal(pkt, NakCode.REMOTE_ACCESS, "bad_rkey", AsyncEvent.WQ_ACCESS_ERROR)
                return False
            view = v
        npkts = packets_for(length, self.cfg.mtu)
        reads = self.reads
        reads.append((pkt.psn, (pkt.psn + npkts - 1) & PSN_MASK, pkt.rkey, pkt.va, length))
        if len(reads) > max(1, self.cfg.resp_res):
            del reads[0]
        self.msn = (self.msn + 1) & PSN_MASK
        self.responses.read(pkt.psn, view, npkts, self.msn, True)
        self.epsn = (self.epsn + npkts) & PSN_MASK
        return True

    def _atomic(self, pkt: Packet) -> bool:
        if pkt.va & 7:
            self._fatal(pkt, NakCode.INVALID_REQUEST, "misaligned_atomic",
                        AsyncEvent.WQ_REQ_ERROR)
            return False
        if self.enforce_resp_res and self._resources_used():
            self._fatal(pkt, NakCode.INVALID_REQUEST, "responder_resources",
                        AsyncEvent.WQ_REQ_ERROR)
            return False
        view = self.mem.remote(pkt.rkey, pkt.va, 8, _R_ATOMIC)
        if view is None:
            self._fatal(pkt, NakCode.REMOTE_ACCESS, "bad_rkey", AsyncEvent.WQ_ACCESS_ERROR)
            return False
        old = int.from_bytes(view, "little")
        new = atomic_result(pkt.opcode == P.Opcode.RC_COMPARE_SWAP, old, pkt.compare,
                            pkt.swap_add)
        if new != old:
            view[:] = new.to_bytes(8, "little")
        cache = self.atomic_cache
        cache[pkt.psn] = old
        if len(cache) > max(ATOMIC_CACHE, self.cfg.resp_res):
            del cache[next(iter(cache))]
        self.msn = (self.msn + 1) & PSN_MASK
        self.responses.atomic_ack(pkt.psn, old, self.msn)
        return True

    def _duplicate(self, pkt: Packet, flags: int) -> None:
        if flags & _F_READ:
            # Replayed only as kernel rxe's duplicate_request does: a READ still held,
            # the same R_Key, a sub-range of it (a retransmit resumes part way); anything
            # else is a forgery that would make us send what the PD holds, many times over
            length = pkt.dma_len
            held = self._held_read(pkt.psn)
            if held is None:
                self.counters.drop("duplicate_read_unknown")
                return
            _, _, rkey, va, held_len = held
            if pkt.rkey != rkey or pkt.va < va or pkt.va + length > va + held_len:
                self.counters.drop("duplicate_read_mismatch")
                return
            if length > MAX_MSG or len(self.responses) >= MAX_QUEUED_REPLAYS:
                self.counters.drop("duplicate_read")
                return
            view: Range | bytes = b""
            if length:
                v = self.mem.remote(pkt.rkey, pkt.va, length, _R_READ)
                if v is None:
                    self.counters.drop("duplicate_read")
                    return
                view = v
            self.responses.read(pkt.psn, view, packets_for(length, self.cfg.mtu), self.msn,
                                False)
        elif flags & _F_ATOMIC:
            orig = self.atomic_cache.get(pkt.psn)
            if orig is None:
                self.counters.drop("duplicate_atomic_unknown")
                return
            self.responses.atomic_ack(pkt.psn, orig, self.msn)
        elif pkt.ack_req or self.ack_every_duplicate:
            self._ack((self.epsn - 1) & PSN_MASK)
        else:
            self.counters.drop("duplicate")

    def _held_read(self, psn: int) -> tuple[int, int, int, int, int] | None:
        for held in reversed(self.reads):
            if psn_diff(psn, held[0]) >= 0 and psn_diff(psn, held[1]) <= 0:
                return held
        return None

    # ------------------------------------------------------------------- flush
    def flush_target(self) -> int | None:
        """The receive WQE a message was landing in when the QP failed (to flush it)."""
        t = self.target
        self.target = None
        self.responses.clear()
        return None if t is None else t.wr_id
