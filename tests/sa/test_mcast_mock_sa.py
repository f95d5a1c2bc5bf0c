"""Multicast end to end on the mock fabric: its SA agent answers the joins, the QPs are
attached, and a UD datagram sent to the group's MLID reaches both members (and only
the one left after a leave).  Runs once the mock's SA agent is in the tree."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ibal.al import AccessLayer, AlManager, Cq, Pd, Qp, QpCreate
from ibal.providers.mock import MockFabric, MockProvider
from ibal.sa import JoinState, McastPhase, join_mcast
from ibal.status import Status
from ibal.types import AccessFlags, AvAttr, DgrmInfo, Gid, Grh, QpType, RecvWr, SendWr, UdDest

WAIT = 20.0
MGID = Gid("ff12:401b:ffff::db8:55")
QKEY = 0x0B1B


@dataclass(eq=False)
class Node:
    pd: Pd
    cq: Cq
    qp: Qp
    buf: bytearray
    mr: Any


@pytest.fixture
def al() -> Iterator[AccessLayer]:
    fabric = MockFabric(seed=0)
    for _ in range(3):
        fabric.add_ca()
    mgr = AlManager()
    mgr.add_provider(MockProvider({"fabric": fabric}))
    yield mgr.open_al()
    mgr.close(timeout=WAIT)
    fabric.close()


def node(al: AccessLayer, i: int) -> Node:
    ca = al.open_ca(al.get_ca_guids()[i])
    port = ca.query().ports[0]
    pd = ca.alloc_pd()
    cq = ca.create_cq(16)
    qp = pd.create_qp(QpCreate(QpType.UD, cq, cq))
    qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=QKEY))
    buf = bytearray(256)
    return Node(pd, cq, qp, buf, pd.reg_mem(buf, AccessFlags.LOCAL_WRITE))


def test_join_on_the_mock_sa_and_a_datagram_to_the_mlid_reaches_both_members(
    al: AccessLayer,
) -> None:
    a, b, c = (node(al, i) for i in range(3))
    full = join_mcast(b.qp, MGID, create=True, q_key=QKEY, join_state=JoinState.FULL)
    rec_b = full.wait(WAIT)
    assert rec_b.status is Status.SUCCESS and rec_b.member_rec is not None, rec_b
    mlid = rec_b.member_rec.mlid
    assert mlid >= 0xC000 and rec_b.member_rec.q_key == QKEY
    non = join_mcast(c.qp, MGID, join_state=JoinState.NON)
    rec_c = non.wait(WAIT)
    assert rec_c.status is Status.SUCCESS and rec_c.member_rec is not None, rec_c
    assert rec_c.member_rec.mlid == mlid and non.phase is McastPhase.JOINED

    av = a.pd.create_av(AvAttr(1, dlid=mlid, grh=Grh(dgid=MGID)))

    def send(wr_id: int, payload: bytes) -> None:
        a.buf[: len(payload)] = payload
        a.qp.post_send(SendWr(wr_id, sg_list=[a.mr.sge(0, len(payload))],
                              ud=UdDest(av=av, remote_qp=0xFFFFFF, remote_qkey=QKEY)))  # fmt: skip

    for n, wr in ((b, 1), (c, 2)):
        n.qp.post_recv(RecvWr(wr, [n.mr.sge(0, 256)]))
    send(10, b"to the group")
    assert [(w.wr_id, w.status.name) for w in b.cq.poll(4)] == [(1, "SUCCESS")]
    assert [(w.wr_id, w.status.name) for w in c.cq.poll(4)] == [(2, "SUCCESS")]
    assert bytes(b.buf[40:52]) == bytes(c.buf[40:52]) == b"to the group"

    # the NonMember leaves first: the group goes with its last FullMember (as OpenSM)
    non.leave(wait=True, timeout=WAIT)
    assert non.leave_status is Status.SUCCESS
    for n, wr in ((b, 3), (c, 4)):
        n.qp.post_recv(RecvWr(wr, [n.mr.sge(0, 256)]))
    send(11, b"only b now")
    assert [w.wr_id for w in b.cq.poll(4)] == [3] and c.cq.poll(4) == []
    full.leave(wait=True, timeout=WAIT)
    assert full.leave_status is Status.SUCCESS
