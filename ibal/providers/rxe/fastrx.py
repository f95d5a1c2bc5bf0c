"""The C engine's receive fast path: which QPs C may continue, and their state back.

Hand-over (one owner of a QP's receive state at a time): under the CA lock,
before each run of ``rxe_rx_fast`` over a receive ring, :meth:`FastTable.arm`
copies into C the responder state of every RC QP in RTS whose responder is in
the middle of an RDMA WRITE (its FIRST, which resolved the R_Key, went
through the Python core): expected PSN, write position and target, MTU,
P_Key and peer.  C lands the in-order MIDDLE/LAST packets that follow and
stops at the first datagram it does not predict; :meth:`FastTable.sync`
writes the state back into the responder (PSN, position, MSN, the end of the
WRITE, counters, one ACK for the last AckReq PSN, which the response queue
would have coalesced anyway) before the Python core sees that datagram.
Between runs no QP state lives in C.
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


class FastTable:
    """The C QP table of one engine and the QPs armed in it for the current run."""

    def __init__(self, ffi: Any, lib: Any) -> None:
        self.ffi = ffi
        self.lib = lib
        self.table = ffi.new("struct rxe_fast_qp[]", MAX_FAST_QPS)
        self.armed: list[Any] = []  # the Qp of each armed entry, in table order
        self._pins: list[Any] = []  # the buffers C writes into, alive for the run

    def arm(self, qps: dict[int, Any]) -> int:
        """Fill the table from the QPs C may continue; how many were armed."""
        armed = self.armed
        armed.clear()
        self._pins.clear()
        t = self.table
        from_buffer = self.ffi.from_buffer
        for qp in qps.values():
            cfg = qp.cfg
            if cfg.qp_type is not _RC or cfg.state is not _RTS or len(cfg.dst_ip) != 4:
                continue
            resp = qp.core.resp
            view = resp.wview
            if resp.in_msg != _IN_WRITE or view is None or not cfg.access & _R_WRITE:
                continue
            if len(armed) == MAX_FAST_QPS:
                break
            try:
                dst = from_buffer(view, require_writable=True)
            except (TypeError, BufferError):
                continue
            e = t[len(armed)]
            e.qpn = qp.num
            e.pkey = cfg.pkey
            e.epsn = resp.epsn
            e.mtu = cfg.mtu
            e.active = 1
            e.src_ip = list(cfg.dst_ip)
            e.woff = resp.woff
            e.wlen = len(view)
            e.dst = dst
            e.packets = e.last = e.ack = e.ack_psn = e.ack_last = 0
            e.bytes = 0
            self._pins.append(dst)
            armed.append(qp)
        return len(armed)

    def run(self, ring: Any, start: int, n: int) -> int:
        """``rxe_rx_fast`` over ring slots ``start`` .. ``n - 1``: where it stopped."""
        ffi = self.ffi
        return int(
            self.lib.rxe_rx_fast(
                ffi.from_buffer(ring.arena), ring.size, ffi.from_buffer(ring.msgs), start, n,
                self.table, len(self.armed),
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
            if e.last:
                resp.wview = None
                resp.in_msg = _IN_NONE
                resp.msn = (old_msn + 1) & PSN_MASK
            if e.ack:
                msn = resp.msn if e.ack_last else old_msn
                resp.responses.ack(e.ack_psn, P.AETH_ACK_UNLIMITED, msn)
            counters.rx_datagrams += got
            counters.rx_fast += got
            counters.rx_bytes += e.bytes
            touched[qp] = None
        self.armed.clear()
        self._pins.clear()


__all__ = ["MAX_FAST_QPS", "FastTable"]
