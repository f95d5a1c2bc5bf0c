"""The C engine's receive fast path: which QPs C may continue, and their state back.

Hand-over (one owner of a QP's receive state at a time): under the CA lock,
before each run of ``rxe_rx_fast`` over a receive ring, :meth:`FastTable.arm`
copies into C the responder state of every RC QP in RTS that allows remote
writes and is either in the middle of an RDMA WRITE (expected PSN, write
position and target) or between messages (expected PSN, its PD), with MTU,
P_Key and peer.  C lands the in-order WRITE packets it predicts: MIDDLE/LAST
of the WRITE in progress, and FIRST/ONLY whose R_Key the region table
(``fastmr.MrMirror``, the CA's, kept in step with every registration change
under the same lock) accepts for the QP's PD, range and access; it stops at
the first datagram it does not predict or whose key it does not accept;
:meth:`FastTable.sync` writes the state back into the responder (PSN,
position, a WRITE C started with its target, the MSN of each WRITE C ended,
counters, one ACK for the last AckReq PSN, which the response queue would
have coalesced anyway) before the Python core sees that datagram, and NAKs
it where it must.  Between runs no QP state lives in C.
"""

from __future__ import annotations

from typing import Any, Final

from ibal.transport.psn import PSN_MASK
from ibal.transport.responder import Responder
from ibal.types import AccessFlags, QpState, QpType
from ibal.wire import packet as P

MAX_FAST_QPS: Final = 64
_R_WRITE: Final = int(AccessFlags.RDMA_WRITE)
_RTS: Final = QpState.RTS
_RC: Final = QpType.RC
_IN_WRITE: Final = Responder.IN_WRITE
_IN_NONE: Final = Responder.IN_NONE
_WRITE_FIRST: Final = int(P.Opcode.RC_RDMA_WRITE_FIRST)
_RESPONSES: Final = (int(P.Opcode.RC_RDMA_READ_RESPONSE_FIRST), int(P.Opcode.RC_ATOMIC_ACKNOWLEDGE))
"""The RC opcodes that are responses (READ responses, ACK, atomic ACK), not requests."""


class FastTable:
    """The C QP table of one engine and the QPs armed in it for the current run."""

    def __init__(self, ffi: Any, lib: Any, mrs: Any = None) -> None:
        self.ffi = ffi
        self.lib = lib
        self.table = ffi.new("struct rxe_fast_qp[]", MAX_FAST_QPS)
        self.mrs = mrs
        """The CA's ``fastmr.MrMirror`` (None: FIRST/ONLY stay with the Python core)."""
        self.armed: list[Any] = []  # the Qp of each armed entry, in table order
        self.armed_nums: set[int] = set()  # their QPNs, kept after sync for wants_arm
        self._pins: list[Any] = []  # the buffers C writes into, alive for the run

    def arm(self, qps: dict[int, Any]) -> int:
        """Fill the table from the QPs C may continue; how many were armed."""
        armed = self.armed
        armed.clear()
        self._pins.clear()
        nums = self.armed_nums
        nums.clear()
        t = self.table
        ffi = self.ffi
        from_buffer = ffi.from_buffer
        mrs = self.mrs
        for qp in qps.values():
            cfg = qp.cfg
            if cfg.qp_type is not _RC or cfg.state is not _RTS or len(cfg.dst_ip) != 4:
                continue
            if not cfg.access & _R_WRITE:
                continue
            resp = qp.core.resp
            view = resp.wview
            in_msg = resp.in_msg
            if in_msg == _IN_WRITE and view is not None:
                try:
                    dst = from_buffer(view, require_writable=True)
                except (TypeError, BufferError):
                    continue
                idle = 0
            elif in_msg == _IN_NONE and mrs is not None:
                dst = ffi.NULL
                idle = 1
            else:
                continue
            if len(armed) == MAX_FAST_QPS:
                break
            e = t[len(armed)]
            e.qpn = qp.num
            e.pkey = cfg.pkey
            e.epsn = resp.epsn
            e.mtu = cfg.mtu
            e.active = 1 - idle
            e.idle = idle
            e.pd = qp.pd.num
            e.src_ip = list(cfg.dst_ip)
            e.woff = resp.woff
            e.wlen = 0 if idle else len(view)
            e.dst = dst
            e.packets = e.last = e.ack = e.ack_psn = e.ack_last = 0
            e.started = e.msgs = e.ack_msgs = 0
            e.bytes = 0
            if not idle:
                self._pins.append(dst)
            armed.append(qp)
            nums.add(qp.num)
        return len(armed)

    def wants_arm(self, pkts: list[P.Packet], armed: int) -> bool:
        """Whether the packets the Python core just took may have changed what C may
        take: a packet to a QP that was armed (its state may have moved), or an RC
        request (it may leave its QP in or between WRITEs).  Not arming only costs
        speed: the rest of the batch goes to the Python core."""
        if self.mrs is None:
            # only a WRITE FIRST starts what C may continue
            return bool(armed) or any(p.opcode == _WRITE_FIRST for p in pkts)
        nums = self.armed_nums
        for p in pkts:
            op = p.opcode
            if p.dest_qpn in nums or (op < 0x20 and not _RESPONSES[0] <= op <= _RESPONSES[1]):
                return True
        return False

    def run(self, ring: Any, start: int, n: int) -> int:
        """``rxe_rx_fast`` over ring slots ``start`` .. ``n - 1``: where it stopped."""
        ffi = self.ffi
        return int(
            self.lib.rxe_rx_fast(
                ffi.from_buffer(ring.arena), ring.size, ffi.from_buffer(ring.msgs), start, n,
                self.table, len(self.armed),
                ffi.NULL if self.mrs is None else self.mrs.table, _R_WRITE,
            )
        )

    def sync(self, touched: dict[Any, None], counters: Any) -> None:
        """The state of every armed QP C moved, back into its responder."""
        t = self.table
        for k, qp in enumerate(self.armed):
            e = t[k]
            got = e.packets
            if not got:
                continue
            resp = qp.core.resp
            old_msn = resp.msn
            resp.epsn = e.epsn
            resp.woff = e.woff
            resp.nak_sent = False
            c = resp.counters
            c.rcvd_pkts += got
            c.rdma_recvs += got
            if e.msgs:
                resp.wview = None
                resp.in_msg = _IN_NONE
                resp.msn = (old_msn + e.msgs) & PSN_MASK
            if e.started:
                # a WRITE whose FIRST C took: its target, as the Python responder keeps it
                view = qp.core.resp.mem.remote(e.rkey, e.va, e.wlen, _R_WRITE)
                if view is None:  # C's table and the key table disagree: never expected
                    raise RuntimeError("rxe fast path: a region C accepted is gone")
                resp.wview = view
                resp.wlen = e.wlen
                resp.in_msg = _IN_WRITE
            if e.ack:
                msn = (old_msn + e.ack_msgs) & PSN_MASK
                resp.responses.ack(e.ack_psn, P.AETH_ACK_UNLIMITED, msn)
            counters.rx_datagrams += got
            counters.rx_fast += got
            counters.rx_bytes += e.bytes
            touched[qp] = None
        self.armed.clear()
        self._pins.clear()


__all__ = ["MAX_FAST_QPS", "FastTable"]
