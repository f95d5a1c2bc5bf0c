"""Shared helpers of the mock provider's tests (they call the ChannelInterface directly)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ibal.ci import Handle
from ibal.providers.mock import MockCa
from ibal.types import (
    AccessFlags,
    AvAttr,
    EventRecord,
    MrKeys,
    Mtu,
    PdType,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    Sge,
    Wc,
)

ACCESS = (
    AccessFlags.LOCAL_WRITE
    | AccessFlags.RDMA_WRITE
    | AccessFlags.RDMA_READ
    | AccessFlags.ATOMIC
    | AccessFlags.MW_BIND
)
QP_ACCESS = AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ | AccessFlags.ATOMIC
UD_QKEY = 0x11111111
BUF = 16384
BASE = 0x7000_0000


@dataclass
class Node:
    """One opened CA with a PD, a CQ and a registered buffer."""

    ca: MockCa
    h: Handle
    pd: Handle
    cq: Handle
    buf: bytearray
    mr: MrKeys
    events: list[EventRecord] = field(default_factory=list)
    notified: list[Any] = field(default_factory=list)

    @property
    def lid(self) -> int:
        return self.ca.ports[0].lid

    def sge(self, off: int, length: int) -> Sge:
        return Sge(self.mr.vaddr + off, length, self.mr.lkey)

    def addr(self, off: int) -> int:
        return self.mr.vaddr + off

    def qp(
        self,
        qp_type: QpType = QpType.RC,
        *,
        caps: QpCaps | None = None,
        srq: Handle | None = None,
        sq_signaled: bool = True,
        cq: Handle | None = None,
        context: Any = None,
    ) -> Handle:
        cq = cq if cq is not None else self.cq
        created = self.ca.create_qp(
            self.pd, qp_type, caps or QpCaps(32, 32, 4, 4, 64), cq, cq, srq, sq_signaled,
            context if context is not None else f"{self.ca.name}-qp",
        )
        return created.handle

    def poll(self, n: int = 64, cq: Handle | None = None) -> list[Wc]:
        return self.ca.poll_cq(cq if cq is not None else self.cq, n)

    def event_codes(self) -> list[str]:
        return [e.code.name for e in self.events]


def open_node(ca: MockCa, *, size: int = BUF, vaddr: int = BASE, cq_size: int = 256) -> Node:
    events: list[EventRecord] = []
    notified: list[Any] = []
    h = ca.open_ca(notified.append, events.append, f"{ca.name}-ctx")
    pd = ca.allocate_pd(h, PdType.NORMAL)
    cq, _ = ca.create_cq(h, cq_size, f"{ca.name}-cq")
    buf = bytearray(size)
    mr = ca.register_mr(pd, memoryview(buf), vaddr, ACCESS)
    return Node(ca, h, pd, cq, buf, mr, events, notified)


def to_rts(
    node: Node,
    qp: Handle,
    peer: Node,
    peer_qpn: int,
    *,
    qp_type: QpType = QpType.RC,
    access: AccessFlags = QP_ACCESS,
    mtu: Mtu = Mtu.MTU_1024,
    sq_psn: int = 0,
    rq_psn: int = 0,
    retry_cnt: int = 7,
    rnr_retry_cnt: int = 7,
    rnr_timer: int = 1,
    ack_timeout: int = 14,
    init_depth: int = 4,
    pkey_index: int = 0,
    port_num: int = 1,
) -> None:
    ca = node.ca
    rc = qp_type is QpType.RC
    ca.modify_qp(qp, QpMod(QpState.INIT, pkey_index=pkey_index, port_num=port_num, access=access))
    rtr: dict[str, Any] = {"resp_res": 4, "rnr_nak_timeout": rnr_timer} if rc else {}
    ca.modify_qp(
        qp,
        QpMod(
            QpState.RTR,
            primary_av=AvAttr(port_num, dlid=peer.ca.ports[0].lid),
            path_mtu=mtu,
            dest_qp=peer_qpn,
            rq_psn=rq_psn,
            **rtr,
        ),
    )
    rts: dict[str, Any] = (
        {
            "local_ack_timeout": ack_timeout,
            "retry_cnt": retry_cnt,
            "rnr_retry_cnt": rnr_retry_cnt,
            "init_depth": init_depth,
        }
        if rc
        else {}
    )
    ca.modify_qp(qp, QpMod(QpState.RTS, sq_psn=sq_psn, **rts))


def connect(
    a: Node, b: Node, qp_type: QpType = QpType.RC, **kw: Any
) -> tuple[Handle, Handle]:
    """A connected pair of QPs (``qa`` on ``a``, ``qb`` on ``b``), both in RTS."""
    shared = {k: kw.pop(k) for k in ("caps", "sq_signaled") if k in kw}
    qa = a.qp(qp_type, **shared)
    qb = b.qp(qp_type, **shared)
    to_rts(a, qa, b, qb.num, qp_type=qp_type, **kw)
    to_rts(b, qb, a, qa.num, qp_type=qp_type, **kw)
    return qa, qb


def ud_ready(node: Node, qp: Handle, qkey: int = UD_QKEY, pkey_index: int = 0) -> None:
    ca = node.ca
    ca.modify_qp(qp, QpMod(QpState.INIT, pkey_index=pkey_index, port_num=1, qkey=qkey))
    ca.modify_qp(qp, QpMod(QpState.RTR))
    ca.modify_qp(qp, QpMod(QpState.RTS, sq_psn=0))


def special_ready(node: Node, qp: Handle, qkey: int = 0) -> None:
    ca = node.ca
    ca.modify_qp(qp, QpMod(QpState.INIT, pkey_index=0, qkey=qkey))
    ca.modify_qp(qp, QpMod(QpState.RTR))
    ca.modify_qp(qp, QpMod(QpState.RTS, sq_psn=0))
