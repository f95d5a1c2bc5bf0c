"""The CM over RoCE: two userspace rxe devices on loopback connect an RC QP pair through
ibal's CM (REQ/REP/RTU on QP1 with a GRH, LIDs 0xFFFF, the path from ibal.sa.roce),
an RDMA WRITE and a SEND land, then a disconnect (DREQ/DREP) moves both QPs to ERROR."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

import ibal.sa
from ibal.al import AccessLayer, AlManager, Ca, Cq, Mr, Pd, QpCreate
from ibal.cm import listen
from ibal.cm import simple as cm
from ibal.cm.api import force_apm
from ibal.cm.service import agent_of
from ibal.providers.rxe.provider import RxeProvider
from ibal.status import Unsupported
from ibal.types import AccessFlags, Gid, PortAttr, QpState, QpType, RecvWr, SendWr, WcStatus, WrType

WAIT = 20.0
ACCESS = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ
ADDRS = ("127.0.0.83", "127.0.0.84")
SVC = 0x0000_0000_0106_4853


@dataclass
class Side:
    al: AccessLayer
    ca: Ca
    pd: Pd
    cq: Cq
    buf: bytearray
    mr: Mr
    port: PortAttr
    addr: str


@pytest.fixture
def sides() -> Iterator[tuple[Side, Side]]:
    mgr = AlManager()
    try:
        mgr.add_provider(RxeProvider({"devices": f"rxe_cm0={ADDRS[0]},rxe_cm1={ADDRS[1]}"}))
        out = []
        for name, addr in zip(("rxe_cm0", "rxe_cm1"), ADDRS, strict=True):
            al = mgr.open_al()
            ca = next(c for c in (al.open_ca(g) for g in al.get_ca_guids()) if c.name == name)
            pd = ca.alloc_pd()
            buf = bytearray(4096)
            out.append(Side(al, ca, pd, ca.create_cq(64), buf, pd.reg_mem(buf, ACCESS),
                            ca.query().ports[0], addr))  # fmt: skip
        yield out[0], out[1]
    finally:
        mgr.close(timeout=WAIT)


def test_rc_connection_over_roce_through_the_cm(sides: tuple[Side, Side]) -> None:
    a, b = sides
    [path] = ibal.sa.path_records(b.al, Gid(f"::ffff:{b.addr}"), Gid(f"::ffff:{a.addr}"),
                                  port_guid=b.port.port_guid)  # fmt: skip
    assert path.fields["hop_limit"] == 64 and path.fields["dlid"] == 0
    lst = listen(a.al, SVC)
    qa = a.pd.create_qp(QpCreate(QpType.RC, a.cq, a.cq))
    qb = b.pd.create_qp(QpCreate(QpType.RC, b.cq, b.cq))
    cb = cm.connect(b.al, qb, path, SVC, b"ping", callback=lambda c: None)
    inc = lst.get(WAIT)
    req = inc.fields
    # What Linux's CM writes for a RoCE path (roce-wire.md 3.4).
    assert (req["primary_local_lid"], req["primary_remote_lid"]) == (0xFFFF, 0xFFFF)
    assert req["primary_subnet_local"] is False and req["primary_hop_limit"] == 64
    assert req["primary_local_gid"] == Gid(f"::ffff:{b.addr}").packed
    ca_ = inc.accept(qa, b"pong", callback=lambda c: None)
    cb.wait(WAIT)
    ca_.wait(WAIT)
    assert qa.state is QpState.RTS and qb.state is QpState.RTS
    assert cb.private_data[:4] == b"pong" and inc.private_data[:4] == b"ping"
    with pytest.raises(Unsupported, match="APM"):  # rxe has no alternate paths
        force_apm(qb)

    qa.post_recv(RecvWr(1, [a.mr.sge(1000, 64)]))
    b.buf[0:9] = b"over rxe!"
    qb.post_send(SendWr(2, WrType.RDMA_WRITE, [b.mr.sge(0, 9)],
                        remote_addr=a.mr.vaddr + 2000, rkey=a.mr.rkey))  # fmt: skip
    qb.post_send(SendWr(3, WrType.SEND, [b.mr.sge(0, 4)]))
    sent = b.cq.wait(WAIT, min_entries=2)
    got = a.cq.wait(WAIT)
    assert [w.status for w in sent] == [WcStatus.SUCCESS] * 2
    assert [(w.wr_id, w.status, w.length) for w in got] == [(1, WcStatus.SUCCESS, 4)]
    assert bytes(a.buf[2000:2009]) == b"over rxe!" and bytes(a.buf[1000:1004]) == b"over"

    cb.disconnect(timeout=WAIT)
    ca_.closed.wait(WAIT, "server side disconnected")
    assert qa.state is QpState.ERROR and qb.state is QpState.ERROR
    agent = agent_of(a.al.manager)
    assert [k for k in agent.stats if k.startswith("dropped")] == []
    assert agent.port(b.ca.guid, 1).stats["sent"] == 3  # REQ, RTU, DREQ
    assert agent.port(a.ca.guid, 1).stats["sent"] == 2  # REP, DREP
