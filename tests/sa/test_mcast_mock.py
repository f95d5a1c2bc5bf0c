"""``join_mcast`` on the mock fabric with a scripted SA (the requests it gets, the answers
the test gives): attach, UD traffic to the MLID, callbacks, leave, rejoin, teardown.

The SA side is proved against OpenSM in test_mcast_ibsim.py; here the SA is a
small requester that records each request and answers when the test says.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from ibal import compat
from ibal.al import AccessLayer, AlManager, Ca, Cq, Dependent, Pd, Qp, QpCreate
from ibal.clock import ManualClock
from ibal.providers.mock import MockFabric, MockProvider
from ibal.sa.mcast import (
    JoinState,
    McastPhase,
    McastRec,
    McastReq,
    MemberRec,
    join_mcast,
    join_mcast_req,
    leave_mcast,
)
from ibal.sa.mcast_fsm import LEAVE_MASK, join_mask
from ibal.status import (
    InvalidGid,
    InvalidMcastHandle,
    InvalidParameter,
    InvalidPkey,
    InvalidPort,
    InvalidQpHandle,
    InvalidServiceType,
    Status,
)
from ibal.types import (
    AccessFlags,
    AsyncEvent,
    AvAttr,
    DgrmInfo,
    EventRecord,
    Gid,
    Grh,
    QpType,
    RecvWr,
    SendWr,
    UdDest,
    WrType,
)
from ibal.wire.mad.consts import Method, SaAttr

WAIT = 10.0
MGID = Gid("ff12:401b:ffff::db8:1")
QKEY = 0x0B1B
ERR_REQ_INVALID = 0x0200


@dataclass
class Req:
    method: int
    attr_id: int
    data: bytes
    comp_mask: int
    callback: Callable[[Any], None] | None
    canceled: bool = False
    answered: bool = False

    def cancel(self) -> None:
        self.canceled = True

    @property
    def rec(self) -> MemberRec:
        return MemberRec.decode(self.data)


@dataclass(frozen=True)
class Answer:
    status: Status
    mad_status: int = 0
    records: tuple[bytes, ...] = ()


class SaLife(Dependent):
    """What an ``SaPort`` is to its AL: a dependent that cancels its requests when it goes."""

    def __init__(self, al: AccessLayer, sa: ScriptedSa) -> None:
        self.sa = sa
        super().__init__(al)

    def on_destroying(self) -> None:
        for r in self.sa.requests:
            if not r.answered and r.callback is not None:
                r.answered = True
                r.callback(Answer(Status.CANCELED))


@dataclass
class ScriptedSa:
    """An ``SaPort``-shaped requester: records requests, answers on demand.

    With ``al`` it lives as an ``SaPort`` does: a dependent of the AL that
    refuses requests once dying and cancels those pending."""

    port_guid: int
    al: AccessLayer | None = None
    requests: list[Req] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: queue.Queue[Req] = field(default_factory=queue.Queue)
    life: SaLife | None = None

    def __post_init__(self) -> None:
        if self.al is not None:
            self.life = SaLife(self.al, self)

    def request(self, method: int, attr_id: int, data: bytes = b"", comp_mask: int = 0, *,
                attr_mod: int = 0, timeout_ms: int = 1000, retry_cnt: int = 3,
                callback: Callable[[Any], None] | None = None) -> Req:  # fmt: skip
        if self.life is not None:
            self.life.check()
        r = Req(method, attr_id, bytes(data), comp_mask, callback)
        with self.lock:
            self.requests.append(r)
        self.sent.put(r)
        return r

    def answer(self, r: Req, status: Status = Status.SUCCESS, mad_status: int = 0,
               mlid: int = 0xC001, mgid: Gid | None = None) -> None:  # fmt: skip
        records: tuple[bytes, ...] = ()
        if status is Status.SUCCESS and r.method == Method.SET:
            rec = r.rec
            rec = MemberRec(**{**{f: getattr(rec, f) for f in rec.__slots__}, "mlid": mlid,
                               "mgid": mgid or rec.mgid, "q_key": QKEY})  # fmt: skip
            records = (rec.encode() + bytes(4),)
        assert r.callback is not None and not r.answered
        r.answered = True
        r.callback(Answer(status, mad_status, records))


@dataclass(eq=False)
class Node:
    ca: Ca
    pd: Pd
    cq: Cq
    qp: Qp
    port_guid: int
    buf: bytearray
    mr: Any

    def recv(self, wr_id: int) -> None:
        self.qp.post_recv(RecvWr(wr_id, [self.mr.sge(0, 256)]))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def fabric() -> Iterator[MockFabric]:
    fabric = MockFabric(seed=0)
    for _ in range(3):
        fabric.add_ca()
    yield fabric
    fabric.close()


@pytest.fixture
def al(clock: ManualClock, fabric: MockFabric) -> Iterator[AccessLayer]:
    mgr = AlManager(clock=clock)
    mgr.add_provider(MockProvider({"fabric": fabric}))
    yield mgr.open_al()
    mgr.close(timeout=WAIT)


def node(al: AccessLayer, i: int, qp_type: QpType = QpType.UD) -> Node:
    ca = al.open_ca(al.get_ca_guids()[i])
    port = ca.query().ports[0]
    pd = ca.alloc_pd()
    cq = ca.create_cq(16)
    qp = pd.create_qp(QpCreate(qp_type, cq, cq))
    if qp_type is QpType.UD:
        qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=QKEY))
    buf = bytearray(512)
    mr = pd.reg_mem(buf, AccessFlags.LOCAL_WRITE)
    return Node(ca, pd, cq, qp, port.port_guid, buf, mr)


def flush(al: AccessLayer) -> None:
    assert al.manager.queues.flush(WAIT)


def joined(al: AccessLayer, n: Node, sa: ScriptedSa, mlid: int = 0xC001, **kw: Any) -> Any:
    seen: list[McastRec] = []
    m = join_mcast(n.qp, MGID, sa=sa, callback=seen.append, **kw)
    sa.answer(sa.requests[-1], mlid=mlid)
    flush(al)
    return m, seen


def test_join_attaches_the_qp_and_traffic_to_the_mlid_reaches_two_members(
    al: AccessLayer,
) -> None:
    a, b, c = (node(al, i) for i in range(3))
    sa_b, sa_c = ScriptedSa(b.port_guid), ScriptedSa(c.port_guid)
    m_b, seen_b = joined(al, b, sa_b, join_state=JoinState.FULL)
    m_c, _ = joined(al, c, sa_c, join_state=JoinState.NON)
    (req_b,) = sa_b.requests
    assert (req_b.method, req_b.attr_id) == (Method.SET, SaAttr.MCMEMBER_RECORD)
    assert req_b.comp_mask == join_mask((), create=False)
    assert req_b.rec.mgid == MGID and req_b.rec.join_state is JoinState.FULL
    assert req_b.rec.port_gid == b.ca.query_port(1).gids[0]
    assert sa_c.requests[0].rec.join_state is JoinState.NON
    assert [r.status for r in seen_b] == [Status.SUCCESS] and not seen_b[0].rejoin
    assert seen_b[0].membership is m_b and seen_b[0].member_rec is not None
    assert seen_b[0].member_rec.mlid == 0xC001 and m_b.wait(0) is seen_b[0]
    assert m_b.phase is McastPhase.JOINED and m_b.attachment is not None
    assert (m_b.attachment.gid, m_b.attachment.lid) == (MGID, 0xC001)
    # a datagram to the MLID reaches both attached QPs
    b.recv(1)
    c.recv(2)
    av = a.pd.create_av(AvAttr(1, dlid=0xC001, grh=Grh(dgid=MGID)))
    a.buf[:5] = b"hello"
    a.qp.post_send(SendWr(7, WrType.SEND, [a.mr.sge(0, 5)],
                          ud=UdDest(av=av, remote_qp=0xFFFFFF, remote_qkey=QKEY)))  # fmt: skip
    assert [w.wr_id for w in b.cq.poll(4)] == [1]
    assert [w.wr_id for w in c.cq.poll(4)] == [2]
    assert bytes(b.buf[40:45]) == bytes(c.buf[40:45]) == b"hello"
    # leave: detached at once, Delete sent, destroy callback after its answer
    destroyed = threading.Event()
    m_b.leave(lambda ctx: destroyed.set())
    assert m_b.attachment is None and not m_b.alive
    delete = sa_b.requests[-1]
    assert (delete.method, delete.comp_mask) == (Method.DELETE, LEAVE_MASK)
    assert (delete.rec.mgid, delete.rec.join_state) == (MGID, JoinState.FULL)
    flush(al)
    assert not destroyed.is_set()
    sa_b.answer(delete)
    assert destroyed.wait(WAIT) and m_b.leave_status is Status.SUCCESS
    with pytest.raises(InvalidMcastHandle):
        m_b.leave()
    b.recv(3)
    c.recv(4)
    a.qp.post_send(SendWr(8, WrType.SEND, [a.mr.sge(0, 5)],
                          ud=UdDest(av=av, remote_qp=0xFFFFFF, remote_qkey=QKEY)))  # fmt: skip
    assert [w.wr_id for w in c.cq.poll(4)] == [4] and b.cq.poll(4) == []
    leave_mcast(m_c)
    sa_c.answer(sa_c.requests[-1], Status.TIMEOUT)
    flush(al)
    assert m_c.leave_status is Status.TIMEOUT and not m_c.alive


def test_first_join_error_reaches_the_callback_with_error_status(al: AccessLayer) -> None:
    n = node(al, 1)
    sa = ScriptedSa(n.port_guid)
    seen: list[McastRec] = []
    m = join_mcast(n.qp, MGID, sa=sa, callback=seen.append, context="ctx")
    sa.answer(sa.requests[0], Status.REMOTE_ERROR, ERR_REQ_INVALID)
    flush(al)
    assert [(r.status, r.error_status, r.context, r.membership) for r in seen] == [
        (Status.REMOTE_ERROR, ERR_REQ_INVALID, "ctx", None)
    ]
    assert m.wait(0).status is Status.REMOTE_ERROR
    assert not m.alive and m.attachment is None and len(sa.requests) == 1


def test_timeout_has_no_error_status(al: AccessLayer) -> None:
    n = node(al, 1)
    sa = ScriptedSa(n.port_guid)
    m = join_mcast(n.qp, MGID, sa=sa)
    sa.answer(sa.requests[0], Status.TIMEOUT, 0x1234)
    rec = m.wait(WAIT)
    assert (rec.status, rec.error_status) == (Status.TIMEOUT, 0)


def test_client_reregister_rejoins_and_moves_the_attachment(
    al: AccessLayer, clock: ManualClock, fabric: MockFabric
) -> None:
    n = node(al, 1)
    sa = ScriptedSa(n.port_guid)
    m, seen = joined(al, n, sa)

    def inject(code: AsyncEvent) -> None:
        fabric.cas[1].inject_async_event(EventRecord(code, None, 0, 1))
        flush(al)

    inject(AsyncEvent.CLIENT_REREGISTER)
    assert len(sa.requests) == 2 and sa.requests[1].method == Method.SET
    assert sa.requests[1].data == sa.requests[0].data
    sa.answer(sa.requests[1], mlid=0xC002)
    flush(al)
    assert [(r.status, r.rejoin) for r in seen] == [(Status.SUCCESS, False), (Status.SUCCESS, True)]
    assert m.attachment is not None and m.attachment.lid == 0xC002
    # again; the SA does not answer this time: retried after the back-off
    inject(AsyncEvent.CLIENT_REREGISTER)
    sa.answer(sa.requests[2], Status.TIMEOUT)
    flush(al)
    assert seen[-1].status is Status.TIMEOUT and seen[-1].rejoin
    assert m.attachment is not None  # still attached while the SA is away
    clock.advance(0.9)
    flush(al)
    assert len(sa.requests) == 3
    clock.advance(0.2)
    flush(al)
    assert len(sa.requests) == 4
    sa.answer(sa.requests[3], mlid=0xC002)
    flush(al)
    assert seen[-1].status is Status.SUCCESS and seen[-1].rejoin
    assert m.phase is McastPhase.JOINED


def test_bad_requests_raise_at_once(al: AccessLayer) -> None:
    n = node(al, 1)
    other = node(al, 2)
    sa = ScriptedSa(n.port_guid)
    rc = n.pd.create_qp(QpCreate(QpType.RC, n.cq, n.cq))
    with pytest.raises(InvalidServiceType):
        join_mcast(rc, MGID, sa=sa)
    with pytest.raises(InvalidPort):
        join_mcast(n.qp, MGID, port_guid=other.port_guid, sa=sa)
    with pytest.raises(InvalidPkey):
        join_mcast(n.qp, MGID, p_key=0x7001, sa=sa)
    with pytest.raises(InvalidGid):
        join_mcast(n.qp, "fe80::1", sa=sa)
    with pytest.raises(InvalidParameter):
        join_mcast(n.qp, None, sa=sa)  # only a create may leave the MGID to the SA
    with pytest.raises(InvalidParameter):
        join_mcast(n.qp, MGID, join_state=JoinState(0), sa=sa)
    with pytest.raises(InvalidMcastHandle):
        compat.ib_leave_mcast(n.qp)
    with pytest.raises(InvalidQpHandle):
        compat.ib_join_mcast(n.cq, None)
    assert sa.requests == []


def test_create_carries_the_qp_keys_and_the_sa_assigned_mgid(al: AccessLayer) -> None:
    n = node(al, 1)
    sa = ScriptedSa(n.port_guid)
    m = join_mcast(n.qp, create=True, sa=sa, sl=3, tclass=5, mtu=4)
    (req,) = sa.requests
    assert req.comp_mask == join_mask(("mtu", "mtu_selector", "scope"), create=True)
    rec = req.rec
    assert (rec.mgid, rec.q_key, rec.p_key, rec.sl, rec.tclass) == (Gid(0), QKEY, 0xFFFF, 3, 5)
    assert (rec.mtu_selector, rec.mtu) == (2, 4)
    assigned = Gid("ff12:601b:ffff::1:2")
    sa.answer(req, mgid=assigned, mlid=0xC00A)
    assert m.wait(WAIT).member_rec.mgid == assigned  # type: ignore[union-attr]
    assert m.attachment is not None and m.attachment.gid == assigned


def test_destroying_the_qp_or_closing_the_al_leaves(al: AccessLayer) -> None:
    n0, n1, n2 = node(al, 0), node(al, 1), node(al, 2)
    sa0 = ScriptedSa(n0.port_guid, al)
    m0, _ = joined(al, n0, sa0)
    # SA ports opened after the first join: an AL's dependents go newest first
    sa1, sa2 = ScriptedSa(n1.port_guid, al), ScriptedSa(n2.port_guid, al)
    m1, _ = joined(al, n1, sa1)
    m2, _ = joined(al, n2, sa2)
    n1.qp.destroy(wait=True)
    assert not m1.alive and sa1.requests[-1].method == Method.DELETE
    sa1.answer(sa1.requests[-1])
    al.close()
    for m, sa in ((m0, sa0), (m2, sa2)):
        # the Delete went out while the SA port still ran, then the close cancelled it
        assert not m.alive and [r.method for r in sa.requests] == [Method.SET, Method.DELETE]
        assert sa.requests[-1].rec.mgid == MGID and sa.requests[-1].answered
        assert m.leave_status is Status.CANCELED
    assert m1.leave_status is Status.SUCCESS  # its answer still counts, though not awaited


def test_ibal_request_shape_with_sync(al: AccessLayer) -> None:
    n = node(al, 1)
    sa = ScriptedSa(n.port_guid)
    seen: list[McastRec] = []

    def answer_soon() -> None:  # the SA's side, while the joining thread waits
        sa.answer(sa.sent.get(timeout=WAIT), mlid=0xC00B)

    helper = threading.Thread(target=answer_soon)
    helper.start()
    req = McastReq(MemberRec(mgid=MGID, join_state=JoinState.SENDONLY), callback=seen.append,
                   context=7, sync=True)  # fmt: skip
    m = join_mcast_req(n.qp, req, sa=sa)
    helper.join()
    assert m.phase is McastPhase.JOINED and m.wait(0).context == 7
    flush(al)
    assert [r.member_rec.mlid for r in seen if r.member_rec] == [0xC00B]
    assert sa.requests[0].rec.join_state is JoinState.SENDONLY
    assert sa.requests[0].comp_mask == join_mask((), create=False)
    with pytest.raises(InvalidParameter):
        join_mcast_req(n.qp, "not a request", sa=sa)  # type: ignore[arg-type]


def test_await_gives_the_join_outcome(al: AccessLayer) -> None:
    import asyncio

    n = node(al, 1)
    sa = ScriptedSa(n.port_guid)

    async def main() -> McastRec:
        m = join_mcast(n.qp, MGID, sa=sa)
        answering = threading.Thread(
            target=lambda: sa.answer(sa.sent.get(timeout=WAIT), mlid=0xC00C)
        )
        answering.start()
        rec = await m
        answering.join()
        assert await m is rec  # the outcome stays
        return rec

    rec = asyncio.run(main())
    assert rec.status is Status.SUCCESS and rec.member_rec is not None
    assert rec.member_rec.mlid == 0xC00C
