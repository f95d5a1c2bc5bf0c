"""SIDR to a UD QP then a UD send lands; MRA; handoff; forged MADs naming a live
connection; listen rules (duplicates, compare data) on the mock fabric."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import pytest
from cm_world import WAIT, CmWorld, RawCm, cm_world, path, req

import ibal
import ibal.sa
from ibal.cm import ConnectionRejected, connect, listen, ops, resolve_service, wire
from ibal.cm.fsm import CmState, Deliver, UpcallKind
from ibal.cm.records import CmMra
from ibal.cm.service import agent_of
from ibal.status import InvalidSetting, InvalidState, Timeout
from ibal.types import AvAttr, QpState, QpType, RecvWr, SendWr, UdDest, WcStatus, WrType
from ibal.wire.mad import cm
from ibal.wire.mad.cm import CmAttr, RejReason, SidrStatus

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")

SVC = 0x5150


@pytest.fixture
def world() -> Iterator[CmWorld]:
    yield from cm_world()


def test_sidr_then_a_ud_send_lands(world: CmWorld) -> None:
    a, b = world.a, world.b
    server_qp = a.qp(QpType.UD)
    ibal.connect_qp(server_qp, ibal.endpoint(server_qp, 1, qkey=0x1234567), ibal.endpoint(
        server_qp, 1))  # INIT/RTR/RTS with its Q_Key
    lst = listen(a.al, SVC, ud=True)
    reply: queue.Queue[object] = queue.Queue()
    resolve_service(b.al, path(b, a), SVC, b"who?", callback=reply.put)
    inc = lst.get(WAIT)
    assert inc.sidr and inc.private_data.rstrip(b"\0") == b"who?"
    inc.answer(server_qp, private_data=b"me")
    got = reply.get(timeout=WAIT)
    assert not isinstance(got, BaseException)
    assert (got.status, got.qpn, got.qkey) == (SidrStatus.SUCCESS, server_qp.num, 0x1234567)  # type: ignore[union-attr]
    assert got.private_data[:2] == b"me"  # type: ignore[union-attr]
    # The answer is what a UD send needs.
    client_qp = b.qp(QpType.UD)
    ibal.connect_qp(client_qp, ibal.endpoint(client_qp, 1), ibal.endpoint(client_qp, 1))
    av = b.pd.create_av(AvAttr(port_num=1, dlid=a.port.lid))
    server_qp.post_recv(RecvWr(1, [a.mr.sge(0, 40 + 16)]))
    b.buf[0:8] = b"datagram"
    client_qp.post_send(SendWr(2, WrType.SEND, [b.mr.sge(0, 8)],
                               ud=UdDest(av=av, remote_qp=got.qpn, remote_qkey=got.qkey)))  # type: ignore[union-attr]  # fmt: skip
    assert [w.status for w in b.cq.wait(WAIT)] == [WcStatus.SUCCESS]
    (recv,) = a.cq.wait(WAIT)
    assert recv.status is WcStatus.SUCCESS and bytes(a.buf[40:48]) == b"datagram"


def test_sidr_nobody_listening_and_no_answer(world: CmWorld) -> None:
    agent_of(world.mgr).port(world.a.ca.guid, 1)
    r = resolve_service(world.b.al, path(world.b, world.a), SVC, timeout=WAIT)
    assert r is not None and r.status is SidrStatus.UNSUPPORTED
    world.fabric.faults.drop(predicate=lambda p: p.dst_qpn == 1 and p.dlid == world.a.port.lid)
    out: list[object] = []
    pr = path(world.b, world.a)
    resolve_service(world.b.al, pr, SVC, timeout_ms=100, retries=2, callback=out.append)
    each = wire.sidr_timeout_ms(100, pr.fields["packet_life_time"]) / 1000  # type: ignore[arg-type]
    world.step(3 * each - 0.01)  # the first try and two retries
    assert out == []
    world.step(0.02)
    assert len(out) == 1 and isinstance(out[0], Timeout)


def test_mra_stretches_the_requesters_wait(world: CmWorld) -> None:
    """The listener MRAs (service timeout 4.096 us * 2^22, ~17 s) and answers 10 s
    later: the REQ (2*64+256 ms a try, 2 retries) would have timed out long before."""
    lst = listen(world.a.al, SVC)
    ups: list[Deliver] = []
    cb = connect(world.b.al, world.b.qp(), path(world.b, world.a), SVC, callback=lambda c: None,
                 remote_resp_timeout=16, max_cm_retries=2)  # fmt: skip
    inner = cb.handle.deliver
    assert inner is not None

    def spy(h: object, up: Deliver) -> None:
        ups.append(up)
        inner(h, up)  # type: ignore[arg-type]

    cb.handle.deliver = spy  # type: ignore[assignment]
    inc = lst.get(WAIT)
    ops.mra(inc.handle, CmMra(svc_timeout=22, pdata=b"wait"))
    world.settle()
    assert [u.kind for u in ups] == [UpcallKind.MRA]
    world.step(10.0)
    assert not cb.established.done and cb.state is CmState.MRA_REQ_RCVD
    ca = inc.accept(world.a.qp(), callback=lambda c: None)
    cb.wait(WAIT)
    ca.wait(WAIT)
    assert cb.qp is not None and cb.qp.state is QpState.RTS


def test_handoff_presents_the_req_to_another_listen(world: CmWorld) -> None:
    first = listen(world.a.al, SVC)
    second = listen(world.a.al, SVC + 1)
    cb = connect(world.b.al, world.b.qp(), path(world.b, world.a), SVC, b"x",
                 callback=lambda c: None)  # fmt: skip
    inc = first.get(WAIT)
    ops.handoff(inc.handle, SVC + 1)
    again = second.get(WAIT)
    assert again.private_data[:1] == b"x" and again.service_id == SVC
    ca = again.accept(world.a.qp(), callback=lambda c: None)
    cb.wait(WAIT)
    ca.wait(WAIT)
    with pytest.raises(InvalidState):
        ops.handoff(again.handle, SVC)  # answered already
    assert first.handle.alive and inc.handle.alive is False


def test_duplicate_listens_and_compare_data(world: CmWorld) -> None:
    plain = listen(world.a.al, SVC)
    with pytest.raises(InvalidSetting):
        listen(world.a.al, SVC)
    special = listen(world.a.al, SVC, compare_offset=0, compare=b"VIP")
    with pytest.raises(InvalidSetting):
        listen(world.a.al, SVC, compare_offset=0, compare=b"VIP")
    connect(world.b.al, world.b.qp(), path(world.b, world.a), SVC, b"VIP guest",
            callback=lambda c: None)  # fmt: skip
    connect(world.b.al, world.b.qp(), path(world.b, world.a), SVC, b"anyone",
            callback=lambda c: None)  # fmt: skip
    assert special.get(WAIT).private_data[:3] == b"VIP"
    assert plain.get(WAIT).private_data[:6] == b"anyone"
    plain.close()
    special.close()
    world.settle()
    with pytest.raises(ConnectionRejected) as exc:
        connect(world.b.al, world.b.qp(), path(world.b, world.a), SVC, timeout=WAIT)
    assert exc.value.reason == RejReason.INVALID_SERVICE_ID


def test_a_req_for_a_gid_the_port_lacks_is_rejected_invalid_gid(world: CmWorld) -> None:
    raw = RawCm(world.b)
    listen(world.a.al, SVC)
    raw.send(CmAttr.REQ, req(SVC, comm_id=0x333), world.a.port.lid)  # GIDs all zero
    msg, _ = raw.next(world)
    assert msg.attr is CmAttr.REJ and msg.fields["reason"] == RejReason.INVALID_GID
    assert agent_of(world.mgr).endpoints == 0


def test_forged_mads_naming_a_live_connection_are_dropped(world: CmWorld) -> None:
    raw = RawCm(world.b)  # B's CM class is the raw one: A's agent connects to it by hand
    lst = listen(world.a.al, SVC)
    raw.send(CmAttr.REQ, req(SVC, comm_id=0x111, local_gid=world.b.port.gids[0].packed,
                             remote_gid=world.a.port.gids[0].packed), world.a.port.lid)
    inc = lst.get(WAIT)
    agent = agent_of(world.mgr)
    cep = inc.handle.cep
    assert cep is not None
    # A DREQ naming the endpoint but with another sender comm ID; an RTU from another LID.
    raw.send(CmAttr.DREQ, cm.DREQ.encode(local_comm_id=0x222, remote_comm_id=cep.local_comm_id,
                                         remote_qpn=5), world.a.port.lid)  # fmt: skip
    world.settle()
    assert agent.stats["dropped: wrong remote comm ID"] == 1
    assert inc.handle.state is CmState.REQ_RCVD
    inc.reject()
    msg, _ = raw.next(world)
    assert msg.attr is CmAttr.REJ and msg.fields["remote_comm_id"] == 0x111


def test_a_new_req_from_a_connected_qp_makes_the_old_connection_stale(world: CmWorld) -> None:
    raw = RawCm(world.b)
    lst = listen(world.a.al, SVC)
    gids = {"local_gid": world.b.port.gids[0].packed, "remote_gid": world.a.port.gids[0].packed}
    raw.send(CmAttr.REQ, req(SVC, comm_id=0x111, **gids), world.a.port.lid)
    conn = lst.get(WAIT).accept(world.a.qp(), callback=lambda c: None)
    rep, _ = raw.next(world)
    assert rep.attr is CmAttr.REP and rep.fields["remote_comm_id"] == 0x111
    local = rep.fields["local_comm_id"]
    raw.send(CmAttr.RTU, cm.RTU.encode(local_comm_id=0x111, remote_comm_id=local),
             world.a.port.lid)  # fmt: skip
    conn.wait(WAIT)
    # The same remote QP (0x99 of CA 0x55) asks again under a new comm ID.
    raw.send(CmAttr.REQ, req(SVC, comm_id=0x222, **gids), world.a.port.lid)
    got = {m.attr: m.fields for m, _ in (raw.next(world) for _ in range(2))}
    assert set(got) == {CmAttr.REJ, CmAttr.DREQ}
    assert got[CmAttr.REJ]["reason"] == RejReason.STALE_CONN
    assert got[CmAttr.REJ]["remote_comm_id"] == 0x222  # the new REQ is refused
    assert got[CmAttr.DREQ]["remote_comm_id"] == 0x111  # the old connection is torn down
    assert conn.closed.done and agent_of(world.mgr).stats["stale connections"] == 1
    assert conn.qp is not None and conn.qp.state is QpState.ERROR
