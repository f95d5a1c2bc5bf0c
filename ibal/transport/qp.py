"""The state an rxe QP's transport core works on, and the interfaces it needs.

:class:`QpConfig` holds the attributes ``modify_qp`` set (the provider writes
them; the core reads them).  :class:`MemoryAccess` is how the core reaches
registered memory: the provider implements it over its MR/MW tables, bound to
the QP's protection domain.  :class:`Output` collects what the core produces
for its driver: completions and async events (packets are pulled with
``QpCore.poll``).  :class:`Counters` is shared by every QP of a device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ibal.transport.scatter import Range
from ibal.types import AsyncEvent, QpState, QpType, SendOpt, SendWr, Sge, Wc, WcStatus, WrType

RXE_MAX_UNACKED_PSNS = 128
"""The requester stops sending this many PSNs past the oldest unacknowledged one."""
RXE_MAX_PKT_PER_ACK = 64
"""AckReq is forced after this many packets without it (rxe ``RXE_MAX_PKT_PER_ACK``)."""
MAX_MSG = 1 << 31


class MemoryAccess(Protocol):
    """Translation of keys to memory, with the checks an HCA's tables make.

    Every method returns a writable range of exactly ``length`` bytes: a
    ``memoryview``, or a :class:`~ibal.transport.scatter.Scatter` of several
    where the region is not one buffer; or ``None`` when the key is unknown,
    in another PD, lacks the access, or the range falls outside the region (the
    core never learns which).  Called on the thread that drives the core; must
    not block.
    """

    def local(self, lkey: int, addr: int, length: int, write: bool) -> Range | None:
        """An SGE of a send WR (``write`` for READ/atomic results): the QP's PD."""
        ...

    def recv(self, lkey: int, addr: int, length: int) -> Range | None:
        """An SGE of a receive WR (local write needed): the PD of the QP or its SRQ."""
        ...

    def remote(self, rkey: int, va: int, length: int, access: int) -> Range | None:
        """An R_Key'd range (``access`` is an ``AccessFlags`` value): MR or bound MW."""
        ...

    def invalidate(self, rkey: int) -> bool:
        """SEND with invalidate: invalidate ``rkey`` of the QP's PD; False if not allowed."""
        ...


def scatter(views: Sequence[Range], off: int, data: bytes | memoryview) -> None:
    """Write ``data`` at byte ``off`` of ``views`` laid end to end (a WQE's SGEs)."""
    pos = 0
    n = len(data)
    for v in views:
        vl = len(v)
        if off >= vl:
            off -= vl
            continue
        take = min(vl - off, n - pos)
        v[off : off + take] = data[pos : pos + take]
        pos += take
        off = 0
        if pos >= n:
            return


class RecvSource(Protocol):
    """Where the responder takes receive WQEs: the QP's receive queue or its SRQ."""

    def take(self) -> tuple[int, Sequence[Sge]] | None:
        """The oldest receive WR as ``(wr_id, sg_list)``, removed; None if empty."""
        ...

    def drain(self) -> list[int]:
        """Remove every receive WR (to flush them); their wr_ids in order."""
        ...


class Counters:
    """Device counters (kernel rxe ``hw_counters`` names) and drops per reason.

    ``rdma_sends``/``rdma_recvs`` count RDMA WRITE/READ/atomic request packets
    sent and executed.
    """

    __slots__ = (
        "completer_retry_err",
        "drops",
        "duplicate_request",
        "out_of_seq_request",
        "rcvd_pkts",
        "rcvd_rnr_err",
        "rcvd_seq_err",
        "rdma_recvs",
        "rdma_sends",
        "retry_exceeded_err",
        "retry_rnr_exceeded_err",
        "send_rnr_err",
        "sent_pkts",
    )

    def __init__(self) -> None:
        self.sent_pkts = 0
        self.rcvd_pkts = 0
        self.duplicate_request = 0
        self.out_of_seq_request = 0
        self.rcvd_rnr_err = 0
        self.send_rnr_err = 0
        self.rcvd_seq_err = 0
        self.retry_exceeded_err = 0
        self.retry_rnr_exceeded_err = 0
        self.completer_retry_err = 0
        self.rdma_sends = 0
        self.rdma_recvs = 0
        self.drops: dict[str, int] = {}

    def drop(self, reason: str) -> None:
        d = self.drops
        d[reason] = d.get(reason, 0) + 1

    def snapshot(self) -> dict[str, int]:
        out = {name: getattr(self, name) for name in Counters.__slots__ if name != "drops"}
        for reason, n in self.drops.items():
            out[f"drop_{reason}"] = n
        return out


class QpConfig:
    """The attributes of one QP the core needs (written by ``modify_qp``)."""

    __slots__ = (
        "access",
        "dest_qpn",
        "dst_ip",
        "init_depth",
        "local_ack_timeout",
        "min_rnr_timer",
        "mtu",
        "pkey",
        "pkey_index",
        "qkey",
        "qp_type",
        "qpn",
        "resp_res",
        "retry_cnt",
        "rnr_retry",
        "rq_psn",
        "sq_psn",
        "src_ip",
        "src_port",
        "state",
    )

    def __init__(self, qpn: int, qp_type: QpType) -> None:
        self.qpn = qpn
        self.qp_type = qp_type
        self.state = QpState.RESET
        self.dest_qpn = 0
        self.pkey = 0xFFFF
        self.pkey_index = 0
        self.qkey = 0
        self.access = 0
        self.mtu = 256
        self.sq_psn = 0
        self.rq_psn = 0
        self.retry_cnt = 7
        self.rnr_retry = 7
        self.local_ack_timeout = 14
        self.min_rnr_timer = 12
        self.init_depth = 1
        self.resp_res = 1
        self.src_ip = b""
        self.dst_ip = b""
        self.src_port = 0xC000


class Output:
    """What the core produced since its driver last looked; the driver empties the lists."""

    __slots__ = ("events", "recv_wcs", "send_wcs")

    def __init__(self) -> None:
        self.send_wcs: list[Wc] = []
        self.recv_wcs: list[tuple[Wc, bool]] = []
        """Receive completions with whether the message was solicited."""
        self.events: list[AsyncEvent] = []


class SendWqe:
    """A send WR as the requester and completer track it.

    ``first_psn`` is None until the first packet leaves; ``npkts`` is how many
    PSNs it takes (a READ: one per response packet).  ``got`` counts the READ
    response packets received (the retry point of a READ).
    """

    __slots__ = (
        "data",
        "done",
        "fence",
        "first_psn",
        "got",
        "imm",
        "inv_rkey",
        "length",
        "local",
        "npkts",
        "opcode",
        "rd_atomic",
        "sges",
        "signaled",
        "solicited",
        "status",
        "targets",
        "wr",
    )

    def __init__(self, wr: SendWr, mtu: int, inline: bytes | None, inv_rkey: int | None) -> None:
        self.wr = wr
        opcode = wr.opcode
        opt = int(wr.send_opt)  # IntFlag arithmetic is slow on this path
        self.opcode = opcode
        sges = wr.sg_list
        self.sges = sges
        if inline is not None:
            length = len(inline)
        else:
            length = 0
            for s in sges:
                length += s.length
        atomic = opcode is _CMP_SWAP or opcode is _FETCH_ADD
        self.rd_atomic = atomic or opcode is _READ
        if atomic:
            length = 8
            self.npkts = 1
        else:
            self.npkts = 1 if length <= mtu else (length + mtu - 1) // mtu
        self.length = length
        self.signaled = bool(opt & _SIGNALED)
        self.solicited = bool(opt & _SOLICITED)
        self.fence = bool(opt & _FENCE)
        self.imm = bool(opt & _IMMEDIATE)
        self.inv_rkey = inv_rkey
        # LOCAL_INV / BIND_MW: done by the requester in queue order, nothing on the wire
        self.local: Callable[[], WcStatus] | None = None
        self.first_psn: int | None = None
        self.got = 0
        self.done = False
        self.status = WcStatus.SUCCESS
        self.data: Range | bytes | None = inline
        self.targets: list[Range] | None = None


_CMP_SWAP = WrType.COMPARE_SWAP
_FETCH_ADD = WrType.FETCH_ADD
_READ = WrType.RDMA_READ
_SIGNALED = int(SendOpt.SIGNALED)
_SOLICITED = int(SendOpt.SOLICITED)
_FENCE = int(SendOpt.FENCE)
_IMMEDIATE = int(SendOpt.IMMEDIATE)


class UdAv(Protocol):
    """What the core needs of the provider's AV handle a UD send WR names."""

    dst_ip: bytes
