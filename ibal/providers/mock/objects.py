"""The mock provider's handles: plain ``__slots__`` objects, one class per kind.

Handles are opaque to the access layer.  Each one knows its CA (``ca``) and
whether it is still alive, so a destroyed or foreign handle is refused with the
matching ``Invalid*Handle`` status instead of being used.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from ibal.types import (
    AccessFlags,
    ApmState,
    AvAttr,
    FmrCreate,
    Gid,
    Mtu,
    PdType,
    QpCaps,
    QpState,
    QpType,
    Wc,
    WcStatus,
    WrType,
)

if TYPE_CHECKING:
    from ibal.ci.interface import AsyncEventCallback, CompletionCallback
    from ibal.providers.mock.ca_state import CaState
    from ibal.providers.mock.memory import QpMemory
    from ibal.providers.mock.topology import MockPort

_RD_ATOMIC = frozenset({WrType.RDMA_READ, WrType.COMPARE_SWAP, WrType.FETCH_ADD})
_SUCCESS = WcStatus.SUCCESS

RecvSge = tuple[int, int, int]
"""``(addr, length, lkey)`` of one receive scatter element, copied at post time."""

RecvWqe = tuple[int, tuple[RecvSge, ...]]
"""``(wr_id, sges)``: a posted receive."""


class OpenCa:
    """The single open instance of a CA (`ci_open_ca`)."""

    __slots__ = ("alive", "async_event_cb", "ca", "completion_cb", "context")

    def __init__(
        self,
        ca: CaState,
        completion_cb: CompletionCallback,
        async_event_cb: AsyncEventCallback,
        context: Any,
    ) -> None:
        self.ca = ca
        self.completion_cb = completion_cb
        self.async_event_cb = async_event_cb
        self.context = context
        self.alive = True

    def __repr__(self) -> str:
        return f"<mock CA handle {self.ca.name}{'' if self.alive else ' closed'}>"


class MockPd:
    __slots__ = ("alive", "ca", "pd_type", "users")

    def __init__(self, ca: CaState, pd_type: PdType) -> None:
        self.ca = ca
        self.pd_type = pd_type
        self.alive = True
        self.users = 0  # QPs, SRQs, AVs, MRs and MWs using it

    def __repr__(self) -> str:
        return f"<mock PD {self.pd_type.name} on {self.ca.name}>"


class MockAv:
    __slots__ = ("alive", "attr", "ca", "pd")

    def __init__(self, ca: CaState, pd: MockPd, attr: AvAttr) -> None:
        self.ca = ca
        self.pd = pd
        self.attr = attr
        self.alive = True

    def __repr__(self) -> str:
        return f"<mock AV dlid=0x{self.attr.dlid:x} on {self.ca.name}>"


class MockCq:
    __slots__ = (
        "alive",
        "ca",
        "context",
        "entries",
        "notify",
        "notify_n",
        "overflowed",
        "size",
        "users",
    )

    NOTIFY_OFF = 0
    NOTIFY_NEXT = 1
    NOTIFY_SOLICITED = 2

    def __init__(self, ca: CaState, size: int, context: Any) -> None:
        self.ca = ca
        self.size = size
        self.context = context
        self.entries: deque[Wc] = deque()
        self.notify = 0
        self.notify_n = 0
        self.overflowed = 0
        self.users = 0
        self.alive = True

    def __repr__(self) -> str:
        return f"<mock CQ size={self.size} entries={len(self.entries)} on {self.ca.name}>"


class MockSrq:
    __slots__ = ("alive", "ca", "context", "limit", "max_sge", "max_wr", "pd", "users", "wqes")

    def __init__(
        self, ca: CaState, pd: MockPd, max_wr: int, max_sge: int, limit: int, context: Any
    ) -> None:
        self.ca = ca
        self.pd = pd
        self.max_wr = max_wr
        self.max_sge = max_sge
        self.limit = limit
        self.context = context
        self.wqes: deque[RecvWqe] = deque()
        self.users = 0
        self.alive = True

    def __repr__(self) -> str:
        return f"<mock SRQ {len(self.wqes)}/{self.max_wr} on {self.ca.name}>"


class MockMr:
    """A memory region: ``length`` bytes at I/O address ``vaddr``.

    The bytes are reached only through ``mv`` (one contiguous consumer buffer)
    or ``pages`` (physical registration: separate page buffers made contiguous
    at ``vaddr``), starting ``base`` bytes into that backing store; the data
    path reaches them through a QP's ``mem`` (:mod:`ibal.providers.mock.memory`).
    """

    __slots__ = (
        "acc",
        "access",
        "alive",
        "base",
        "ca",
        "length",
        "lkey",
        "mv",
        "page_size",
        "pages",
        "parent",
        "pd",
        "phys",
        "rkey",
        "shares",
        "vaddr",
        "windows",
    )

    def __init__(self, ca: CaState, pd: MockPd) -> None:
        self.ca = ca
        self.pd = pd
        self.alive = True
        self.vaddr = 0
        self.length = 0
        self.access = AccessFlags.NONE
        self.acc = 0
        self.lkey = 0
        self.rkey = 0
        self.mv: memoryview | None = None
        self.pages: tuple[memoryview, ...] = ()
        self.page_size = 0
        self.base = 0
        self.phys = False
        self.windows = 0  # memory windows bound to it
        self.shares = 0  # shared regions over its pages
        self.parent: MockMr | None = None

    def __repr__(self) -> str:
        return (
            f"<mock MR 0x{self.vaddr:x}+{self.length} lkey=0x{self.lkey:x} "
            f"rkey=0x{self.rkey:x} on {self.ca.name}>"
        )


class MockMw:
    __slots__ = (
        "acc", "access", "addr", "alive", "ca", "length", "mr", "mw_type", "pd", "qp", "rkey",
        "valid",
    )  # fmt: skip

    def __init__(self, ca: CaState, pd: MockPd, rkey: int, mw_type: int = 1) -> None:
        self.ca = ca
        self.pd = pd
        self.rkey = rkey
        self.mw_type = mw_type
        self.valid = mw_type == 1  # a type 2 window's R_Key is invalid until bound
        self.qp: MockQp | None = None  # type 2: the QP it was bound through (IBA type 2B)
        self.mr: MockMr | None = None
        self.addr = 0
        self.length = 0
        self.access = AccessFlags.NONE
        self.acc = 0
        self.alive = True

    def __repr__(self) -> str:
        bound = f"0x{self.addr:x}+{self.length}" if self.mr is not None else "unbound"
        return f"<mock MW rkey=0x{self.rkey:x} {bound} on {self.ca.name}>"


class MockFmr:
    """A fast memory region: limits, and the current mapping as a physical
    :class:`MockMr` in the key table (``None`` while unmapped)."""

    __slots__ = ("acc", "alive", "ca", "create", "key", "maps", "mr", "pd")

    def __init__(self, ca: CaState, pd: MockPd, create: FmrCreate, key: int) -> None:
        self.ca = ca
        self.pd = pd
        self.create = create
        self.acc = int(create.access)
        self.key = key  # the key byte turns over at every map (stale keys miss)
        self.maps = 0  # maps since the last unmap
        self.mr: MockMr | None = None
        self.alive = True

    def __repr__(self) -> str:
        state = "unmapped" if self.mr is None else f"mapped {self.maps}x"
        return f"<mock FMR {state} on {self.ca.name}>"


class MockMcast:
    __slots__ = ("alive", "gid", "lid", "qp")

    def __init__(self, qp: MockQp, gid: Gid, lid: int) -> None:
        self.qp = qp
        self.gid = gid
        self.lid = lid
        self.alive = True

    def __repr__(self) -> str:
        return f"<mock mcast {self.gid} lid=0x{self.lid:x} qp=0x{self.qp.num:x}>"


class SendWqe:
    """A posted send (or bind) work request as the send queue holds it."""

    __slots__ = (
        "bind",
        "compare",
        "done",
        "fence",
        "imm",
        "inline",
        "inv",
        "is_rd_atomic",
        "length",
        "local",
        "npsn",
        "opcode",
        "psn",
        "remote_addr",
        "result",
        "rkey",
        "sges",
        "signaled",
        "solicited",
        "status",
        "swap",
        "ud",
        "wr_id",
    )

    def __init__(self, wr_id: int, opcode: WrType, signaled: bool) -> None:
        self.wr_id = wr_id
        self.opcode = opcode
        self.signaled = signaled
        self.solicited = False
        self.fence = False
        self.imm: int | None = None
        self.sges: tuple[RecvSge, ...] = ()
        self.inline: bytes | None = None
        self.length = 0
        self.remote_addr = 0
        self.rkey = 0
        self.compare = 0
        self.swap = 0
        self.ud: tuple[AvAttr, int, int, int] | None = None  # av, qpn, qkey, pkey_index
        self.bind: tuple[MockMw, MockMr | None, int, int, AccessFlags, int] | None = None
        self.inv: int | None = None  # SEND with invalidate: the peer's R_Key to invalidate
        # LOCAL_INV / type 2 BIND_MW: done in send-queue order, nothing on the wire
        self.local: tuple[Any, ...] | None = None
        self.is_rd_atomic = opcode in _RD_ATOMIC
        self.psn: int | None = None
        self.npsn = 1
        self.done = False
        self.status = _SUCCESS
        self.result: bytes | None = None


class MockQp:
    __slots__ = (
        "acc",
        "access",
        "alive",
        "alt_av",
        "alt_port",
        "apm_state",
        "atomic_cache",
        "av",
        "ca",
        "caps",
        "comm_est",
        "context",
        "dest_qp",
        "epsn",
        "init_depth",
        "local_ack_timeout",
        "mcasts",
        "mem",
        "mtu_bytes",
        "nak_sent",
        "num",
        "path_mtu",
        "pd",
        "pkey_index",
        "port",
        "port_num",
        "qkey",
        "qp_type",
        "rd_atomic_out",
        "recv_cq",
        "resp_res",
        "retry_cnt",
        "retry_left",
        "rnr_blocked",
        "rnr_left",
        "rnr_nak_timeout",
        "rnr_retry_cnt",
        "rq",
        "rq_psn",
        "send_cq",
        "send_idx",
        "special",
        "sq",
        "sq_psn",
        "sq_signaled",
        "sqd_notify",
        "srq",
        "state",
        "timer_armed",
        "timer_gen",
        "transport",
    )
    mem: QpMemory
    """The QP's ``MemoryAccess`` over the key tables (set by the verb that made it)."""

    def __init__(
        self,
        ca: CaState,
        pd: MockPd,
        qp_type: QpType,
        num: int,
        caps: QpCaps,
        send_cq: MockCq,
        recv_cq: MockCq,
        srq: MockSrq | None,
        sq_signaled: bool,
        context: Any,
    ) -> None:
        self.ca = ca
        self.pd = pd
        self.qp_type = qp_type
        # What the wire does: RC, UC or datagram (UD, MAD, QP0, QP1).
        self.transport = (
            qp_type if qp_type in (QpType.RC, QpType.UC) else QpType.UD
        )
        self.special = qp_type in (QpType.QP0, QpType.QP1)
        self.num = num
        self.caps = caps
        self.send_cq = send_cq
        self.recv_cq = recv_cq
        self.srq = srq
        self.sq_signaled = sq_signaled
        self.context = context
        self.alive = True
        self.state = QpState.RESET
        self.port: MockPort | None = None
        self.port_num = 0
        self.pkey_index = 0
        self.qkey = 0
        self.access = AccessFlags.NONE
        self.acc = 0
        self.av: AvAttr | None = None
        self.path_mtu: Mtu | None = None
        self.mtu_bytes = 4096
        self.dest_qp = 0
        self.rq_psn = 0
        self.sq_psn = 0
        self.epsn = 0
        self.resp_res = 0
        self.init_depth = 0
        self.rnr_nak_timeout = 0
        self.local_ack_timeout = 0
        self.retry_cnt = 0
        self.rnr_retry_cnt = 0
        self.retry_left = 0
        self.rnr_left = 0
        self.apm_state = ApmState.MIGRATED
        self.alt_av: AvAttr | None = None  # the alternate path (APM), its port
        self.alt_port: MockPort | None = None
        self.sq: deque[SendWqe] = deque()
        self.send_idx = 0  # sq[:send_idx] transmitted, sq[send_idx:] waiting
        self.rq: deque[RecvWqe] = deque()
        self.rd_atomic_out = 0
        self.timer_gen = 0
        self.timer_armed = False
        self.rnr_blocked = False
        self.comm_est = False
        self.nak_sent = False
        self.atomic_cache: dict[int, bytes] = {}
        self.sqd_notify = False
        self.mcasts = 0

    def __repr__(self) -> str:
        return (
            f"<mock QP 0x{self.num:x} {self.qp_type.name} {self.state.name} on {self.ca.name}"
            f"{'' if self.alive else ' destroyed'}>"
        )


def migrate_qp(qp: MockQp) -> None:
    """The alternate path becomes the primary: forced, or an incoming
    migration the responder accepted.  No alternate is left until one is loaded again."""
    assert qp.alt_av is not None and qp.alt_port is not None
    qp.av, qp.port, qp.port_num = qp.alt_av, qp.alt_port, qp.alt_av.port_num
    qp.alt_av = qp.alt_port = None
    qp.apm_state = ApmState.MIGRATED
