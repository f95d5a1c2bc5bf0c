"""Two AL instances connect RC QPs through the CM on the mock fabric (Pythonic shape).

Paths come from the mock's SA (``ibal.sa.path_records``); data moves after the
RTU (bytes land); disconnects from either side; REJ with reason and ARI, and
for nobody listening; time-outs by stepping the clock; closing an AL
mid-connection leaves no endpoint, timer or callback.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator

import pytest
from cm_world import WAIT, CmWorld, cm_world, path

from ibal.cm import Connection, ConnectionRejected, connect, listen
from ibal.cm.fsm import CmState
from ibal.cm.service import agent_of
from ibal.status import InvalidSetting, Timeout
from ibal.types import QpState, RecvWr, SendWr, WcStatus, WrType
from ibal.wire.mad.cm import RejReason

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")

SVC = 0x0000_0000_0106_1C06


@pytest.fixture
def world() -> Iterator[CmWorld]:
    yield from cm_world()


def established(world: CmWorld) -> tuple[Connection, Connection]:
    """B connects to A's listener; both QPs in RTS."""
    lst = listen(world.a.al, SVC)
    qa, qb = world.a.qp(), world.b.qp()
    cb = connect(world.b.al, qb, path(world.b, world.a), SVC, b"hello from b",
                 callback=lambda c: None)  # fmt: skip
    inc = lst.get(WAIT)
    assert inc.service_id == SVC and inc.private_data.rstrip(b"\0") == b"hello from b"
    ca = inc.accept(qa, b"welcome", callback=lambda c: None)
    cb.wait(WAIT)
    ca.wait(WAIT)
    assert cb.private_data.rstrip(b"\0") == b"welcome"
    return ca, cb


def test_rc_connection_through_the_cm_moves_data(world: CmWorld) -> None:
    ca, cb = established(world)
    assert ca.qp is not None and cb.qp is not None
    assert ca.qp.state is QpState.RTS and cb.qp.state is QpState.RTS
    assert ca.state is CmState.ESTABLISHED and cb.state is CmState.ESTABLISHED
    qa, qb = ca.qp, cb.qp
    assert qa.query().dest_qp == qb.num and qb.query().dest_qp == qa.num
    a, b = world.a, world.b
    qa.post_recv(RecvWr(1, [a.mr.sge(1000, 64)]))
    b.buf[0:5] = b"write"
    b.buf[100:104] = b"send"
    qb.post_send(SendWr(2, WrType.RDMA_WRITE, [b.mr.sge(0, 5)],
                        remote_addr=a.mr.vaddr + 2000, rkey=a.mr.rkey))  # fmt: skip
    qb.post_send(SendWr(3, WrType.SEND, [b.mr.sge(100, 4)]))
    sent = b.cq.wait(WAIT, min_entries=2)
    got = a.cq.wait(WAIT)
    assert [w.status for w in sent] == [WcStatus.SUCCESS, WcStatus.SUCCESS]
    assert [(w.wr_id, w.status, w.length) for w in got] == [(1, WcStatus.SUCCESS, 4)]
    assert bytes(a.buf[2000:2005]) == b"write" and bytes(a.buf[1000:1004]) == b"send"


@pytest.mark.parametrize("side", ["client", "server"])
def test_disconnect_from_either_side(world: CmWorld, side: str) -> None:
    ca, cb = established(world)
    me, peer = (cb, ca) if side == "client" else (ca, cb)
    gone: queue.Queue[Connection] = queue.Queue()
    peer.on_disconnect = gone.put
    me.disconnect(timeout=WAIT)
    assert gone.get(timeout=WAIT) is peer
    assert me.qp is not None and peer.qp is not None
    assert me.qp.state is QpState.ERROR and peer.qp.state is QpState.ERROR
    agent = agent_of(world.mgr)
    assert agent.endpoints == 2  # both in timewait
    world.step(60.0)
    assert agent.endpoints == 0 and agent.armed_timers() == 0


def test_reject_with_reason_ari_and_private_data(world: CmWorld) -> None:
    lst = listen(world.a.al, SVC)
    qb = world.b.qp()
    cb = connect(world.b.al, qb, path(world.b, world.a), SVC, callback=lambda c: None)
    lst.get(WAIT).reject(RejReason.CONSUMER_DEFINED, ari=b"\x01\x02", private_data=b"no")
    with pytest.raises(ConnectionRejected) as exc:
        cb.wait(WAIT)
    assert exc.value.reason == RejReason.CONSUMER_DEFINED
    assert exc.value.ari[:2] == b"\x01\x02" and exc.value.private_data[:2] == b"no"
    assert qb.state is QpState.ERROR


def test_nobody_listening_is_rejected_invalid_service_id(world: CmWorld) -> None:
    agent_of(world.mgr).port(world.a.ca.guid, 1)  # A's port serves the CM class
    with pytest.raises(ConnectionRejected) as exc:
        connect(world.b.al, world.b.qp(), path(world.b, world.a), SVC, timeout=WAIT)
    assert exc.value.reason == RejReason.INVALID_SERVICE_ID


def test_no_answer_times_out_after_the_retries(world: CmWorld) -> None:
    world.fabric.faults.drop(predicate=lambda p: p.dst_qpn == 1 and p.dlid == world.a.port.lid)
    listen(world.a.al, SVC)
    cb = connect(world.b.al, world.b.qp(), path(world.b, world.a), SVC, callback=lambda c: None,
                 remote_resp_timeout=16, max_cm_retries=2)  # 2*64+256 ms a try
    world.step(0.3)
    assert not cb.established.done
    world.step(10.0)
    with pytest.raises(Timeout):
        cb.wait(0)
    assert cb.qp is not None and cb.qp.state is QpState.ERROR


def test_private_data_limits(world: CmWorld) -> None:
    with pytest.raises(InvalidSetting, match="92"):
        connect(world.b.al, world.b.qp(), path(world.b, world.a), SVC, bytes(93))


def test_closing_the_al_mid_connection_leaves_nothing(world: CmWorld) -> None:
    ca, cb = established(world)
    agent = agent_of(world.mgr)
    late: list[Connection] = []
    cb.on_disconnect = late.append
    world.b.al.close(timeout=WAIT)  # B leaves: its connection sends DREQ
    world.settle()
    assert ca.closed.done and ca.state is CmState.TIMEWAIT  # A heard the DREQ
    world.step(60.0)
    assert agent.endpoints == 0 and agent.armed_timers() == 0
    assert late == [] and not cb.handle.alive  # B's handle died with its AL: no callback


def test_destroying_the_qp_tears_the_connection_down(world: CmWorld) -> None:
    ca, cb = established(world)
    assert cb.qp is not None
    cb.qp.destroy(wait=True)
    world.settle()
    assert not cb.handle.alive and ca.closed.done
    world.step(60.0)
    assert agent_of(world.mgr).endpoints == 0


def test_a_rep_that_beats_the_request_call_is_not_lost(world: CmWorld,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The REP's upcall may run on the misc queue before ``ops.request`` returns to
    ``connect`` (a fast peer, a busy caller): it must still establish the connection.
    Made certain here: the request call returns only after the queues delivered the REP."""
    from ibal.cm import ops, simple

    qa = world.a.qp()
    accepted: list[Connection] = []
    lst = listen(world.a.al, SVC,
                 callback=lambda inc: accepted.append(inc.accept(qa, callback=lambda c: None)))
    real = ops.request

    def late_return(*args: object, **kw: object) -> object:
        handle = real(*args, **kw)  # type: ignore[arg-type]
        world.settle()  # the REQ, the accept, its REP and the REP's upcall, all delivered
        world.settle()
        return handle

    monkeypatch.setattr(simple.ops, "request", late_return)
    cb = connect(world.b.al, world.b.qp(), path(world.b, world.a), SVC, timeout=WAIT)
    assert cb.state is CmState.ESTABLISHED and cb.qp is not None
    assert cb.qp.state is QpState.RTS
    assert repr(cb).startswith("<Connection ESTABLISHED")
    world.settle()
    assert accepted and accepted[0].state is CmState.ESTABLISHED  # the RTU came
    lst.close()
