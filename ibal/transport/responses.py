"""What a responder sends, in PSN order: ACK/NAKs, atomic ACKs and READ responses.

READ responses are cut from the registered memory lazily, as the driver polls,
so a large READ costs no memory up front and an ACK queued behind it cannot
overtake it.  A READ (not a duplicate's replay) holds a responder resource
until its last response packet has left: ``reads_pending`` is what the
responder checks against ``resp_res``.
"""

from __future__ import annotations

from collections import deque

from ibal.transport.psn import PSN_MASK
from ibal.transport.qp import QpConfig
from ibal.transport.scatter import Range
from ibal.wire import packet as P
from ibal.wire.packet import Packet, Train, WqeRun

_MIDDLE = P.Opcode.RC_RDMA_READ_RESPONSE_MIDDLE
_ACKNOWLEDGE = P.Opcode.RC_ACKNOWLEDGE


class ReadJob:
    """A READ being answered: response packets are cut from ``view`` as they leave.

    ``resource`` is False for a duplicate's replay, which holds no responder
    resource (the original did).
    """

    __slots__ = ("msn", "next", "npkts", "psn", "resource", "view")

    def __init__(self, psn: int, view: Range | bytes, npkts: int, msn: int,
                 resource: bool = True) -> None:
        self.psn = psn
        self.view = view
        self.npkts = npkts
        self.next = 0
        self.msn = msn
        self.resource = resource


class ResponseQueue:
    """One RC QP's responses waiting to leave."""

    def __init__(self, cfg: QpConfig) -> None:
        self.cfg = cfg
        self.queue: deque[Packet | ReadJob] = deque()
        self.reads_pending = 0

    def __len__(self) -> int:
        return len(self.queue)

    def clear(self) -> None:
        self.queue.clear()
        self.reads_pending = 0

    def poll(self, budget: int, out: list[Packet | Train | WqeRun], trains: bool = False) -> int:
        """Append up to ``budget`` response packets, in PSN order; how many.

        ``trains``: a READ's MIDDLE responses go out as one :class:`Train` per run.
        """
        q = self.queue
        got = 0
        while q and got < budget:
            item = q[0]
            if item.__class__ is Packet:
                out.append(q.popleft())  # type: ignore[arg-type]
                got += 1
                continue
            job: ReadJob = item  # type: ignore[assignment]
            while job.next < job.npkts and got < budget:
                k = job.next
                if trains and k:
                    m = min(job.npkts - 1 - k, budget - got)
                    if m >= 2:
                        mtu = self.cfg.mtu
                        off = k * mtu
                        head = self._packet(_MIDDLE, (job.psn + k) & PSN_MASK,
                                            job.view[off : off + mtu])
                        # only rxe's socket layer polls trains, and its ranges are views
                        out.append(Train(head, job.view, off, mtu, m, 0, 1,  # type: ignore[arg-type]
                                         False))
                        job.next = k + m
                        got += m
                        continue
                out.append(self._read_packet(job))
                got += 1
            if job.next >= job.npkts:
                q.popleft()
                if job.resource:
                    self.reads_pending -= 1
        return got

    def _read_packet(self, job: ReadJob) -> Packet:
        mtu = self.cfg.mtu
        k = job.next
        job.next = k + 1
        n = job.npkts
        if n == 1:
            op = P.Opcode.RC_RDMA_READ_RESPONSE_ONLY
        elif k == 0:
            op = P.Opcode.RC_RDMA_READ_RESPONSE_FIRST
        elif k == n - 1:
            op = P.Opcode.RC_RDMA_READ_RESPONSE_LAST
        else:
            op = _MIDDLE
        off = k * mtu
        pkt = self._packet(op, (job.psn + k) & PSN_MASK, job.view[off : off + mtu])
        if op is not _MIDDLE:
            pkt.syndrome = P.AETH_ACK_UNLIMITED
            pkt.msn = job.msn
        return pkt

    def _packet(self, op: int, psn: int, payload: bytes | memoryview = b"") -> Packet:
        cfg = self.cfg
        pkt = Packet(op, cfg.dest_qpn, psn, payload, pkey=cfg.pkey)
        pkt.src_ip = cfg.src_ip
        pkt.dst_ip = cfg.dst_ip
        pkt.src_port = cfg.src_port
        return pkt

    def ack(self, psn: int, syndrome: int, msn: int) -> None:
        """Queue an ACKNOWLEDGE: an ACK, a NAK or an RNR NAK by its syndrome.

        An ACK queued behind an ACK that has not left yet replaces it: ACKs are
        cumulative (IBA 9.7.5.1.2 lets a responder coalesce them), so a batch of
        small messages that each asked for one costs the peer one ACK, not one
        per message.  NAKs and RNR NAKs are never merged.
        """
        q = self.queue
        if q and syndrome & P.AETH_TYPE_MASK == P.AETH_TYPE_ACK:
            last = q[-1]
            if (
                isinstance(last, Packet)
                and last.opcode == _ACKNOWLEDGE
                and last.syndrome & P.AETH_TYPE_MASK == P.AETH_TYPE_ACK
            ):
                last.psn, last.syndrome, last.msn = psn, syndrome, msn
                return
        pkt = self._packet(P.Opcode.RC_ACKNOWLEDGE, psn)
        pkt.syndrome = syndrome
        pkt.msn = msn
        self.queue.append(pkt)

    def atomic_ack(self, psn: int, orig: int, msn: int) -> None:
        pkt = self._packet(P.Opcode.RC_ATOMIC_ACKNOWLEDGE, psn)
        pkt.syndrome = P.AETH_ACK_UNLIMITED
        pkt.msn = msn
        pkt.orig = orig
        self.queue.append(pkt)

    def read(self, psn: int, view: Range | bytes, npkts: int, msn: int,
             resource: bool) -> None:
        """Queue a READ's responses; ``resource``: it counts against ``resp_res``."""
        self.queue.append(ReadJob(psn, view, npkts, msn, resource))
        if resource:
            self.reads_pending += 1
