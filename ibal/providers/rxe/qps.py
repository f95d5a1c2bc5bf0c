"""QPs, SRQs and AVs of an rxe CA: the objects around the transport core.

A :class:`Qp` owns a :class:`~ibal.transport.core.QpCore` (the
protocol), its :class:`~ibal.transport.qp.QpConfig` (what ``modify_qp``
set) and the attributes ``query_qp`` reports that the core does not need.
Receive WRs wait in a :class:`RecvQueue` or a :class:`Srq`, the core's
:class:`~ibal.transport.qp.RecvSource`.  An :class:`Av` turns a GID into
the IP address the socket layer sends to (the core's ``UdAv``).

Threading: used under the CA lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from ipaddress import IPv6Address
from typing import Any

from ibal.providers.rxe.cq import Cq
from ibal.providers.rxe.memory import Pd, Resource
from ibal.transport.core import QpCore
from ibal.transport.qp import QpConfig
from ibal.types import (
    AccessFlags,
    ApmState,
    AvAttr,
    Gid,
    Mtu,
    QpAttr,
    QpCaps,
    QpState,
    QpType,
    Sge,
)

RecvWqe = tuple[int, tuple[Sge, ...]]


def gid_to_ip(gid: Gid) -> bytes:
    """The IP address a RoCEv2 GID stands for: 4 bytes if IPv4-mapped, else 16."""
    # a Gid is an IPv6Address already: IPv6Address(gid) would format and parse it again
    raw = gid.packed if isinstance(gid, IPv6Address) else IPv6Address(gid).packed
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return raw[12:]
    return raw


def is_multicast_ip(ip: bytes) -> bool:
    return (len(ip) == 4 and 224 <= ip[0] <= 239) or (len(ip) == 16 and ip[0] == 0xFF)


class Av(Resource):
    """An address vector; ``dst_ip`` is what the transport core sends to."""

    __slots__ = ("attr", "dst_ip", "pd")

    def __init__(self, ca: object, pd: Pd, attr: AvAttr, dst_ip: bytes) -> None:
        super().__init__(ca)
        self.pd = pd
        self.attr = attr
        self.dst_ip = dst_ip


class RecvQueue:
    """A QP's own receive queue (the core's ``RecvSource``)."""

    __slots__ = ("wqes",)

    def __init__(self) -> None:
        self.wqes: deque[RecvWqe] = deque()

    def __len__(self) -> int:
        return len(self.wqes)

    def take(self) -> tuple[int, Sequence[Sge]] | None:
        return self.wqes.popleft() if self.wqes else None

    def drain(self) -> list[int]:
        ids = [w[0] for w in self.wqes]
        self.wqes.clear()
        return ids


class Srq(Resource):
    """A shared receive queue with its limit event (armed by a non-zero limit)."""

    __slots__ = ("context", "limit", "limit_hit", "max_sge", "max_wr", "pd", "users", "wqes")

    def __init__(self, ca: object, pd: Pd, max_wr: int, max_sge: int, limit: int,
                 context: Any) -> None:
        super().__init__(ca)
        self.pd = pd
        self.max_wr = max_wr
        self.max_sge = max_sge
        self.limit = limit
        self.context = context
        self.users = 0
        self.limit_hit = False
        self.wqes: deque[RecvWqe] = deque()

    def __len__(self) -> int:
        return len(self.wqes)

    def take(self) -> tuple[int, Sequence[Sge]] | None:
        if not self.wqes:
            return None
        wqe = self.wqes.popleft()
        if self.limit and len(self.wqes) < self.limit:
            self.limit = 0  # the event disarms the limit (IBA 10.2.9.3)
            self.limit_hit = True
        return wqe

    def drain(self) -> list[int]:
        return []  # an SRQ's WQEs belong to no QP: a QP's flush leaves them


class SrqSource:
    """One QP's view of its SRQ: takes WQEs from the SRQ, flushes none."""

    __slots__ = ("srq",)

    def __init__(self, srq: Srq) -> None:
        self.srq = srq

    def take(self) -> tuple[int, Sequence[Sge]] | None:
        return self.srq.take()

    def drain(self) -> list[int]:
        return []


class Qp(Resource):
    """A QP: its core, its queues and the attributes ``query_qp`` reports."""

    __slots__ = (
        "access", "av", "caps", "cfg", "context", "core", "dest_qp", "init_depth", "last_wqe",
        "local_ack_timeout", "mcasts", "path_mtu", "pd", "port_num", "recv_cq", "resp_res",
        "retry_cnt", "rnr_nak_timeout", "rnr_retry_cnt", "rq", "send_cq", "sq_psn",
        "sq_signaled", "srq",
    )  # fmt: skip

    def __init__(self, ca: object, pd: Pd, qp_type: QpType, qpn: int, caps: QpCaps,
                 send_cq: Cq, recv_cq: Cq, srq: Srq | None, sq_signaled: bool,
                 context: Any, core: QpCore, cfg: QpConfig, rq: RecvQueue) -> None:
        super().__init__(ca)
        self.pd = pd
        self.caps = caps
        self.send_cq = send_cq
        self.recv_cq = recv_cq
        self.srq = srq
        self.sq_signaled = sq_signaled
        self.context = context
        self.core = core
        self.cfg = cfg
        self.rq = rq
        self.mcasts = 0
        self.reset_attrs()

    def reset_attrs(self) -> None:
        self.last_wqe = False  # SRQ_QP_LAST_WQE_REACHED raised (once per trip to ERROR)
        self.port_num = 1 if self.cfg.qp_type is QpType.QP1 else 0
        self.access = AccessFlags.NONE
        self.av: AvAttr | None = None
        self.path_mtu = Mtu.MTU_256
        self.dest_qp = 0
        self.sq_psn = 0
        self.resp_res = 0
        self.init_depth = 0
        self.rnr_nak_timeout = 0
        self.local_ack_timeout = 0
        self.retry_cnt = 0
        self.rnr_retry_cnt = 0

    @property
    def num(self) -> int:
        return self.cfg.qpn

    @property
    def qp_type(self) -> QpType:
        return self.cfg.qp_type

    @property
    def state(self) -> QpState:
        return self.cfg.state

    def attr(self) -> QpAttr:
        cfg = self.cfg
        return QpAttr(
            qp_type=cfg.qp_type,
            qp_num=cfg.qpn,
            state=cfg.state,
            caps=self.caps,
            sq_signaled=self.sq_signaled,
            dest_qp=self.dest_qp,
            port_num=self.port_num,
            pkey_index=cfg.pkey_index,
            qkey=cfg.qkey,
            access=self.access,
            primary_av=self.av,
            alternate_av=None,
            path_mtu=self.path_mtu,
            sq_psn=self.sq_psn,
            rq_psn=cfg.rq_psn,
            resp_res=self.resp_res,
            init_depth=self.init_depth,
            rnr_nak_timeout=self.rnr_nak_timeout,
            local_ack_timeout=self.local_ack_timeout,
            retry_cnt=self.retry_cnt,
            rnr_retry_cnt=self.rnr_retry_cnt,
            apm_state=ApmState.MIGRATED,
            sq_draining=cfg.state is QpState.SQD and self.core.req.outstanding,
        )


class McastAttach(Resource):
    """One QP attached to one multicast group."""

    __slots__ = ("gid", "ip", "lid", "qp")

    def __init__(self, ca: object, qp: Qp, gid: Gid, lid: int, ip: bytes) -> None:
        super().__init__(ca)
        self.qp = qp
        self.gid = gid
        self.lid = lid
        self.ip = ip
