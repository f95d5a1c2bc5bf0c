"""Lost, duplicated and delayed CM MADs on the mock fabric: connections establish (the
machines resend and answer duplicates) or fail with the right callback, and leave
nothing behind; a loop of connections leaves no endpoint, QP or timer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cm_world import WAIT, CmWorld, Node, cm_world, is_cm, path

from ibal.al import QpCreate
from ibal.cm import Connection, connect, listen
from ibal.cm.fsm import CmState
from ibal.cm.service import agent_of
from ibal.types import AsyncEvent, QpState, QpType, RecvWr, SendWr, WcStatus, WrType

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")

SVC = 0x77
FAST = {"remote_resp_timeout": 16, "max_cm_retries": 3}  # 2.3 s a try (life 18), 4 tries


@pytest.fixture
def world() -> Iterator[CmWorld]:
    yield from cm_world(seed=3)


def cm_to(n: Node) -> object:
    return lambda p: is_cm(p) and p.dlid == n.port.lid


def connect_pair(world: CmWorld) -> tuple[Connection, Connection]:
    lst = listen(world.a.al, SVC)
    cb = connect(world.b.al, world.b.qp(), path(world.b, world.a), SVC, callback=lambda c: None,
                 **FAST)  # type: ignore[arg-type]  # fmt: skip
    inc = lst.get(WAIT)
    ca = inc.accept(world.a.qp(), callback=lambda c: None)
    lst.close()
    return ca, cb


def test_a_lost_rep_is_recovered_by_the_req_retransmission(world: CmWorld) -> None:
    rule = world.fabric.faults.drop(predicate=cm_to(world.b), nth=1)  # the first REP
    ca, cb = connect_pair(world)
    world.settle()
    assert rule.fired == 1 and not cb.established.done
    world.step(3.0)  # the REQ is resent; the passive side answers its REP again
    cb.wait(WAIT)
    ca.wait(WAIT)
    assert cb.qp is not None and cb.qp.state is QpState.RTS


def test_a_lost_rtu_is_recovered_by_the_rep_retransmission(world: CmWorld) -> None:
    rule = world.fabric.faults.drop(predicate=cm_to(world.a), nth=2)  # REQ passes, RTU lost
    ca, cb = connect_pair(world)
    cb.wait(WAIT)
    world.settle()
    assert rule.fired == 1 and not ca.established.done
    world.step(7.0)  # the REP resent (4096 ms + 2 packet lives of 1 s), the RTU again
    ca.wait(WAIT)
    assert ca.qp is not None and ca.qp.state is QpState.RTS


def test_every_mad_twice(world: CmWorld) -> None:
    world.fabric.faults.duplicate(predicate=is_cm)
    ca, cb = connect_pair(world)
    cb.wait(WAIT)
    ca.wait(WAIT)
    cb.disconnect(timeout=WAIT)
    ca.wait_closed(WAIT)
    world.step(60.0)
    agent = agent_of(world.mgr)
    assert agent.endpoints == 0 and agent.armed_timers() == 0


def test_lost_dreqs_end_in_a_drep_timeout(world: CmWorld) -> None:
    ca, cb = connect_pair(world)
    cb.wait(WAIT)
    ca.wait(WAIT)
    world.fabric.faults.drop(predicate=cm_to(world.a))
    cb.disconnect(wait=False)
    world.step(10.0)
    assert cb.closed.done and cb.state in (CmState.TIMEWAIT, CmState.CLOSED)
    assert ca.state is CmState.ESTABLISHED  # never heard of it


def test_a_loop_of_connections_leaves_nothing(world: CmWorld) -> None:
    lst = listen(world.a.al, SVC)
    pr = path(world.b, world.a)
    for _ in range(20):
        qa, qb = world.a.qp(), world.b.qp()
        cb = connect(world.b.al, qb, pr, SVC, callback=lambda c: None)
        ca = lst.get(WAIT).accept(qa, callback=lambda c: None)
        cb.wait(WAIT)
        ca.wait(WAIT)
        cb.disconnect(timeout=WAIT)
        qa.destroy(wait=True)
        qb.destroy(wait=True)
    world.step(60.0)
    agent = agent_of(world.mgr)
    assert agent.endpoints == 0 and agent.armed_timers() == 0
    assert [k for k in agent.stats if k.startswith("dropped")] == []


def test_a_lost_rtu_is_replaced_by_the_first_send(world: CmWorld) -> None:
    """The RTU never arrives: the first SEND on the passive QP (in RTR) raises COMM_EST,
    the CM takes it as the RTU (IBA 12.9.7.2): ESTABLISHED, QP in RTS, RTU callback run."""
    rule = world.fabric.faults.drop(predicate=cm_to(world.a), nth=2)  # REQ passes, RTU lost
    seen: list[Connection] = []
    lst = listen(world.a.al, SVC)
    cb = connect(world.b.al, world.b.qp(), path(world.b, world.a), SVC, callback=lambda c: None,
                 **FAST)  # type: ignore[arg-type]  # fmt: skip
    ca = lst.get(WAIT).accept(world.a.qp(), callback=seen.append)
    lst.close()
    cb.wait(WAIT)
    world.settle()
    assert rule.fired == 1 and not ca.established.done and seen == []
    assert ca.qp is not None and ca.qp.state is QpState.RTR
    a, b = world.a, world.b
    events: list[AsyncEvent] = []
    ca.qp.add_event_listener(lambda rec: events.append(rec.code))
    ca.qp.post_recv(RecvWr(1, [a.mr.sge(0, 64)]))
    b.buf[0:4] = b"data"
    assert cb.qp is not None
    cb.qp.post_send(SendWr(2, WrType.SEND, [b.mr.sge(0, 4)]))
    ca.wait(WAIT)  # no clock step: no REP was resent, the SEND did it
    assert seen == [ca] and ca.state is CmState.ESTABLISHED and ca.qp.state is QpState.RTS
    assert events == [AsyncEvent.QP_COMM]
    assert [(w.wr_id, w.status) for w in a.cq.wait(WAIT)] == [(1, WcStatus.SUCCESS)]
    assert bytes(a.buf[0:4]) == b"data" and rule.fired == 1
    world.step(7.0)  # the REP's retry timer was cancelled: nothing more goes to B
    assert agent_of(world.mgr).armed_timers() == 0


def test_rtu_callback_before_completions_when_the_cq_is_armed_in_it(world: CmWorld) -> None:
    """docs/cm.md "Threads": the passive QP receives from RTR on, so data may complete
    before the RTU callback runs; a consumer that arms its CQ in the RTU callback (rearm,
    then poll) sees every completion after it.  Here the RTU is lost and two SENDs arrive
    first: no completion callback comes before the RTU callback, which polls both."""
    world.fabric.faults.drop(predicate=cm_to(world.a), nth=2)  # REQ passes, RTU lost
    a, b = world.a, world.b
    order: list[object] = []
    rcq = a.ca.create_cq(16, comp_cb=lambda cq, ctx: order.append(("comp", cq.poll())))
    qa = a.pd.create_qp(QpCreate(QpType.RC, a.cq, rcq))

    def on_rtu(conn: Connection) -> None:
        order.append("rtu")
        rcq.rearm()
        order.append(("polled", rcq.poll()))

    lst = listen(a.al, SVC)
    cb = connect(b.al, b.qp(), path(b, a), SVC, callback=lambda c: None, **FAST)  # type: ignore[arg-type]
    ca = lst.get(WAIT).accept(qa, callback=on_rtu)
    lst.close()
    for i in range(3):  # the QP is in RTR once accept returns
        qa.post_recv(RecvWr(i, [a.mr.sge(64 * i, 64)]))
    cb.wait(WAIT)
    assert cb.qp is not None
    cb.qp.post_send([SendWr(10 + i, WrType.SEND, [b.mr.sge(0, 4)]) for i in range(2)])
    ca.wait(WAIT)
    cb.qp.post_send(SendWr(12, WrType.SEND, [b.mr.sge(0, 4)]))  # after the RTU callback
    b.cq.wait(WAIT, min_entries=3)
    world.settle()
    assert order[0] == "rtu"  # no completion callback before it
    got = [w.wr_id for _, wcs in order[1:] for w in wcs]  # type: ignore[misc]
    assert got == [0, 1, 2] and isinstance(order[-1], tuple) and order[-1][0] == "comp"
