"""Faults and load on the rxe provider (issue 8): many RC QPs on one device, and a
flood of forged datagrams during a transfer.  Two devices, 127.0.0.12 and
127.0.0.13, in one process through real raw/UDP sockets."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from netns_util import need_root

from ibal.al import AlManager, Ca, QpCreate
from ibal.providers.rxe.provider import RxeProvider
from ibal.testing.helpers import active_port, mr_access, to_init, to_rtr, to_rts, wait_wcs
from ibal.types import (
    AvAttr,
    Grh,
    Mtu,
    PortAttr,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    Sge,
    WcStatus,
    WcType,
    WrType,
)

DEVICES = "rxe_l0=127.0.0.12,rxe_l1=127.0.0.13"
A_IP, B_IP = "127.0.0.12", "127.0.0.13"

Two = tuple[RxeProvider, Ca, PortAttr, Ca, PortAttr]


@pytest.fixture
def two() -> Iterator[Two]:
    need_root()
    mgr = AlManager()
    provider = RxeProvider({"devices": DEVICES})
    mgr.add_provider(provider)
    try:
        al = mgr.open_al()
        cas = sorted((al.open_ca(g) for g in al.get_ca_guids()), key=lambda c: c.name)
        ports = [active_port(c.query().ports) for c in cas]
        assert ports[0] is not None and ports[1] is not None
        yield provider, cas[0], ports[0], cas[1], ports[1]
    finally:
        mgr.close()


def _av(remote: PortAttr, local: PortAttr) -> AvAttr:
    return AvAttr(port_num=local.port_num, grh=Grh(dgid=remote.gid_table[0].gid))


N_QPS = 1000
MSG = 48


def _message(i: int) -> bytes:
    return f"pair {i:04d} ".encode().ljust(MSG, bytes([i & 0xFF]))


def test_a_thousand_rc_qps_each_move_their_own_message(two: Two) -> None:
    """1,000 RC QPs on one device, each connected to its own QP on the other;
    every pair moves a distinct message (even: SEND, odd: WRITE)."""
    _, a, pa, b, pb = two
    acc = mr_access(a.capabilities)
    pd_a, pd_b = a.alloc_pd(), b.alloc_pd()
    cq_a, cq_b = a.create_cq(2 * N_QPS), b.create_cq(2 * N_QPS)
    buf_a, buf_b = bytearray(N_QPS * MSG), bytearray(N_QPS * MSG + 64)
    mr_a, mr_b = pd_a.reg_mem(buf_a, acc), pd_b.reg_mem(buf_b, acc)
    t0 = time.monotonic()
    qa = [pd_a.create_qp(QpCreate(QpType.RC, send_cq=cq_a, recv_cq=cq_a, sq_depth=2, rq_depth=1))
          for _ in range(N_QPS)]
    qb = [pd_b.create_qp(QpCreate(QpType.RC, send_cq=cq_b, recv_cq=cq_b, sq_depth=1, rq_depth=2))
          for _ in range(N_QPS)]
    av_ab, av_ba = _av(pb, pa), _av(pa, pb)
    for x, y in zip(qa, qb, strict=True):
        for q, port in ((x, pa), (y, pb)):
            to_init(q, port.port_num, acc)
        to_rtr(x, av_ab, Mtu.MTU_1024, y.num)
        to_rtr(y, av_ba, Mtu.MTU_1024, x.num)
        to_rts(x)
        to_rts(y)
    t_setup = time.monotonic() - t0
    assert len({q.num for q in qa}) == N_QPS
    for i in range(N_QPS):
        buf_a[i * MSG : (i + 1) * MSG] = _message(i)
    t1 = time.monotonic()
    for i, (x, y) in enumerate(zip(qa, qb, strict=True)):
        src = Sge(addr=mr_a.vaddr + i * MSG, length=MSG, lkey=mr_a.lkey)
        if i % 2 == 0:
            y.post_recv(RecvWr(wr_id=i, sg_list=[Sge(mr_b.vaddr + i * MSG, MSG, mr_b.lkey)]))
            x.post_send(SendWr(wr_id=i, opcode=WrType.SEND, sg_list=[src]))
        else:
            x.post_send(SendWr(wr_id=i, opcode=WrType.RDMA_WRITE, sg_list=[src],
                               remote_addr=mr_b.vaddr + i * MSG, rkey=mr_b.rkey))  # fmt: skip
    sends = wait_wcs(cq_a, N_QPS, timeout=60)
    recvs = wait_wcs(cq_b, N_QPS // 2, timeout=60)
    t_move = time.monotonic() - t1
    by_qp = {q.num: i for i, q in enumerate(qa)}
    assert sorted((by_qp[w.qp_num], w.wr_id) for w in sends) == [(i, i) for i in range(N_QPS)]
    assert {w.status for w in sends} == {WcStatus.SUCCESS}
    by_qp_b = {q.num: i for i, q in enumerate(qb)}
    assert sorted((by_qp_b[w.qp_num], w.wr_id, w.length) for w in recvs) == [
        (i, i, MSG) for i in range(0, N_QPS, 2)
    ]
    assert {(w.status, w.wc_type) for w in recvs} == {(WcStatus.SUCCESS, WcType.RECV)}
    for i in range(N_QPS):
        assert bytes(buf_b[i * MSG : (i + 1) * MSG]) == _message(i), i
    assert bytes(buf_b[N_QPS * MSG :]) == bytes(64)
    assert not cq_a.poll(1) and not cq_b.poll(1)
    assert {q.query().state for q in qa + qb} == {QpState.RTS}
    print(f"\n{N_QPS} RC pairs: set-up {t_setup:.2f} s, one message each {t_move:.2f} s")
