"""Fault injection: packet rules, verb failures, reproducibility with a seed."""

from __future__ import annotations

from typing import Any

import pytest
from mockenv import UD_QKEY, Node, connect, open_node, ud_ready

from ibal.clock import ManualClock
from ibal.providers.mock import MockFabric, Packet, PacketOp
from ibal.status import InsufficientResources, InvalidQpState, PostError, Status
from ibal.types import (
    AvAttr,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    UdDest,
    WcStatus,
    WrType,
)

OK = WcStatus.SUCCESS


def writes(a: Node, b: Node, qa: Any, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        a.buf[i * 8 : i * 8 + 8] = i.to_bytes(8, "little")
        a.ca.post_send(qa, [SendWr(i, WrType.RDMA_WRITE, [a.sge(i * 8, 8)],
                                   remote_addr=b.addr(8192 + i * 8), rkey=b.mr.rkey)])


def lossy_run(seed: int) -> tuple[list[tuple[int, WcStatus]], dict[str, int], float, bytes]:
    fabric = MockFabric(seed=seed)
    fabric.add_ca()
    fabric.add_ca()
    # a clock from 0, not from real time: float sums of timer deadlines then
    # round the same way in every run
    fabric.use_clock(ManualClock())
    a, b = open_node(fabric.cas[0]), open_node(fabric.cas[1])
    qa, _ = connect(a, b, retry_cnt=3, ack_timeout=8, caps=None)
    fabric.faults.drop(probability=0.3)
    fabric.faults.duplicate(probability=0.1)
    fabric.faults.delay(0.0005, probability=0.2)
    writes(a, b, qa, 24)
    elapsed = fabric.settle()
    result = [(w.wr_id, w.status) for w in a.poll(100)]
    snap = fabric.counters.snapshot()
    memory = bytes(b.buf[8192 : 8192 + 24 * 8])
    fabric.close()
    return result, snap, elapsed, memory


def test_same_seed_same_outcome() -> None:
    first, second = lossy_run(7), lossy_run(7)
    assert first == second
    result, counters, _, _ = first
    assert len(result) == 24 and counters["dropped_fault"] > 0
    assert counters["retransmitted"] > 0


def test_another_seed_another_outcome() -> None:
    outcomes = {repr(lossy_run(seed)[1]) for seed in (1, 2, 3)}
    assert len(outcomes) > 1


def test_drop_the_nth_matching_packet(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    qa, _ = connect(a, b, ack_timeout=8)
    rule = fabric.faults.drop(op=PacketOp.RDMA_WRITE, nth=2)
    writes(a, b, qa, 3)
    # the third write overtakes the lost second one: a sequence NAK resends both
    assert (rule.matched, rule.fired) == (5, 1)
    fabric.settle()
    assert [(w.wr_id, w.status) for w in a.poll()] == [(0, OK), (1, OK), (2, OK)]
    assert bytes(b.buf[8192 + 8 : 8192 + 16]) == (1).to_bytes(8, "little")


def test_drop_count_and_remove(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    qa, _ = connect(a, b, ack_timeout=8, retry_cnt=7)
    rule = fabric.faults.drop(qp=qa, count=2)  # the request and its first retry
    writes(a, b, qa, 1)
    fabric.settle()
    assert a.poll()[0].status is OK and rule.fired == 2
    rule.remove()
    assert fabric.faults.packet_rules == []
    fabric.faults.drop(qp=qa)
    fabric.faults.clear()
    writes(a, b, qa, 1, start=1)
    assert a.poll()[0].status is OK


def test_selectors(fabric: MockFabric) -> None:
    c = open_node(fabric.add_ca())
    a, b = open_node(fabric.cas[0]), open_node(fabric.cas[1])
    qa, qb = connect(a, b)
    qa2, _qc = connect(a, c)
    seen: list[Packet] = []

    def spy(pkt: Packet) -> bool:
        seen.append(pkt)
        return True

    plan = fabric.faults
    rules = {
        "dst_qp": plan.drop(dst_qp=qb, count=0),
        "src_qp int": plan.drop(src_qp=qa2.num, count=0),
        "port": plan.drop(port=c.ca.ports[0], count=0),
        "ca": plan.drop(ca=b.ca, count=0),
        "transport": plan.drop(transport=QpType.UD, count=0),
        "link": plan.drop(link=c.ca.ports[0].link, count=0),
        "acks": plan.drop(op={PacketOp.ACK}, count=0),
        "spy": plan.drop(predicate=spy, count=0),
    }
    writes(a, b, qa, 1)
    writes(a, c, qa2, 1)
    matched = {name: r.matched for name, r in rules.items()}
    # a QP number alone (no handle) matches that number on any CA
    assert matched == {"dst_qp": 1, "src_qp int": 1, "port": 2, "ca": 2, "transport": 0,
                       "link": 2, "acks": 2, "spy": 4}
    assert [p.op for p in seen] == [PacketOp.RDMA_WRITE, PacketOp.ACK] * 2
    assert all(r.fired == 0 for r in rules.values())


def test_delay_holds_a_packet_until_the_clock_moves(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    qa, _ = connect(a, b, ack_timeout=14)
    fabric.faults.delay(0.010, op=PacketOp.RDMA_WRITE, nth=1)
    writes(a, b, qa, 1)
    assert a.poll() == [] and fabric.next_deadline is not None
    fabric.advance(0.005)
    assert a.poll() == []
    fabric.advance(0.005)
    assert a.poll()[0].status is OK
    assert fabric.counters.delayed == 1 and fabric.counters.retransmitted == 0


def test_duplicated_datagrams_arrive_twice(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    ua, ub = a.qp(QpType.UD), b.qp(QpType.UD)
    ud_ready(a, ua)
    ud_ready(b, ub)
    b.ca.post_recv(ub, [RecvWr(i, [b.sge(i * 100, 100)]) for i in range(3)])
    fabric.faults.duplicate(copies=2, transport=QpType.UD)
    av = a.ca.create_av(a.pd, AvAttr(1, dlid=b.lid))
    a.ca.post_send(ua, [SendWr(1, WrType.SEND, [a.sge(0, 4)],
                               ud=UdDest(av=av, remote_qp=ub.num, remote_qkey=UD_QKEY))])
    assert [w.wr_id for w in b.poll()] == [0, 1, 2]
    assert fabric.counters.duplicated == 2


def test_lagged_datagram_sends_complete_later_in_order(a: Node, b: Node) -> None:
    """``lag_sends``: the datagram lands at once, its send completes ``seconds`` later; a
    later send of the QP (not lagged) goes out meanwhile and completes behind it; a QP
    moved to ERROR while a send lags completes it once, flushed."""
    fabric = a.ca.fabric
    ua, ub = a.qp(QpType.UD), b.qp(QpType.UD)
    ud_ready(a, ua)
    ud_ready(b, ub)
    b.ca.post_recv(ub, [RecvWr(i, [b.sge(i * 100, 100)]) for i in range(4)])
    av = a.ca.create_av(a.pd, AvAttr(1, dlid=b.lid))

    def send(wr_id: int) -> None:
        a.ca.post_send(ua, [SendWr(wr_id, WrType.SEND, [a.sge(0, 4)],
                                   ud=UdDest(av=av, remote_qp=ub.num, remote_qkey=UD_QKEY))])

    lag = fabric.faults.lag_sends(0.010, src_qp=ua.num, nth=1)
    send(1)
    send(2)
    assert [w.wr_id for w in b.poll()] == [0, 1]  # both landed
    assert a.poll() == [] and (lag.matched, lag.fired) == (2, 1)  # 2 waits behind 1
    fabric.advance(0.009)
    assert a.poll() == []
    fabric.advance(0.002)
    assert [(w.wr_id, w.status) for w in a.poll()] == [(1, OK), (2, OK)]
    assert fabric.counters.delayed == 0  # the packets themselves were not held
    fabric.faults.lag_sends(0.010, src_qp=ua.num)
    send(3)
    assert [w.wr_id for w in b.poll()] == [2]
    a.ca.modify_qp(ua, QpMod(QpState.ERROR))
    assert [(w.wr_id, w.status) for w in a.poll()] == [(3, WcStatus.WR_FLUSHED_ERR)]
    fabric.advance(0.011)
    assert a.poll() == []  # the lag's timer finds it flushed already
    with pytest.raises(ValueError):
        fabric.faults.lag_sends(-1.0)


def test_duplicated_rc_requests_execute_once(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    qa, qb = connect(a, b)
    fabric.faults.duplicate(op=PacketOp.SEND)
    b.ca.post_recv(qb, [RecvWr(1, [b.sge(0, 8)]), RecvWr(2, [b.sge(0, 8)])])
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 4)])])
    assert [w.wr_id for w in b.poll()] == [1]
    assert a.poll()[0].status is OK
    fabric.faults.clear()
    fabric.faults.duplicate(op=PacketOp.FETCH_ADD)
    a.ca.post_send(qa, [SendWr(2, WrType.FETCH_ADD, [a.sge(0, 8)], remote_addr=b.addr(64),
                               rkey=b.mr.rkey, compare_add=1)])
    assert a.poll()[0].status is OK
    assert int.from_bytes(b.buf[64:72], "little") == 1


def test_corrupted_packets_are_caught_by_the_icrc(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    qa, qb = connect(a, b, ack_timeout=8)
    fabric.faults.corrupt(op=PacketOp.SEND, nth=1)
    b.ca.post_recv(qb, [RecvWr(1, [b.sge(0, 8)])])
    a.buf[0:4] = b"good"
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 4)])])
    assert b.poll() == [] and fabric.counters.corrupted == 1
    fabric.settle()
    assert a.poll()[0].status is OK
    assert bytes(b.buf[0:4]) == b"good"  # the retransmission, intact
    fabric.faults.clear()
    fabric.faults.corrupt(op=PacketOp.ACK)  # no payload: a header bit flips
    a.ca.post_send(qa, [SendWr(2, WrType.RDMA_WRITE, [a.sge(0, 4)], remote_addr=b.addr(0),
                               rkey=b.mr.rkey)])
    assert fabric.counters.corrupted == 2


def test_fail_the_nth_call_of_a_verb(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    qa, _ = connect(a, b)
    fault = fabric.faults.fail_verb("post_send", Status.INSUFFICIENT_RESOURCES, nth=2)
    writes(a, b, qa, 1)
    with pytest.raises(InsufficientResources) as err:
        writes(a, b, qa, 1, start=1)
    assert isinstance(err.value, PostError) and err.value.failed_index == 0
    writes(a, b, qa, 1, start=2)  # only once
    assert fault.fired == 1 and fault.calls == 3
    assert [w.wr_id for w in a.poll()] == [0, 2]


def test_fail_a_verb_on_one_ca_only(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    fabric.faults.fail_verb("create_cq", Status.INSUFFICIENT_RESOURCES, ca=b.ca, count=2)
    a.ca.create_cq(a.h, 4, None)
    for _ in range(2):
        with pytest.raises(InsufficientResources):
            b.ca.create_cq(b.h, 4, None)
    b.ca.create_cq(b.h, 4, None)


def test_fail_verb_with_a_state_status(a: Node) -> None:
    fabric = a.ca.fabric
    fabric.faults.fail_verb("post_recv", Status.INVALID_QP_STATE, failed_index=1)
    qp = a.qp(QpType.UD)
    ud_ready(a, qp)
    with pytest.raises(InvalidQpState) as err:
        a.ca.post_recv(qp, [RecvWr(1, [])])
    assert isinstance(err.value, PostError) and err.value.failed_index == 1
    with pytest.raises(ValueError):
        fabric.faults.fail_verb("poll_cq", Status.SUCCESS)


def test_counters_can_be_reset(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    qa, _ = connect(a, b)
    writes(a, b, qa, 2)
    snap = fabric.counters.snapshot()
    assert (snap["sent"], snap["delivered"], snap["acks"], snap["completions"]) == (4, 4, 2, 2)
    fabric.counters.reset()
    assert set(fabric.counters.snapshot().values()) == {0}


@pytest.mark.parametrize("qp_type", [QpType.UD, QpType.UC], ids=["UD", "UC"])
@pytest.mark.parametrize("how", ["latency", "delay fault"])
def test_reusing_the_buffer_after_a_completion_keeps_the_sent_bytes(
    a: Node, b: Node, qp_type: QpType, how: str
) -> None:
    """UD/UC complete at transmit: an in-flight packet must not see later buffer writes."""
    fabric = a.ca.fabric
    if qp_type is QpType.UD:
        qa, qb = a.qp(QpType.UD), b.qp(QpType.UD)
        ud_ready(a, qa)
        ud_ready(b, qb)
        av = a.ca.create_av(a.pd, AvAttr(1, dlid=b.lid))
        ud: UdDest | None = UdDest(av=av, remote_qp=qb.num, remote_qkey=UD_QKEY)
        grh = 40
    else:
        qa, qb = connect(a, b, QpType.UC)
        ud = None
        grh = 0
    if how == "latency":
        fabric.latency = 0.010
    else:
        fabric.faults.delay(0.010, op=PacketOp.SEND)
    b.ca.post_recv(qb, [RecvWr(7, [b.sge(4096, 256)])])
    a.buf[0:8] = b"original"
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 8)], ud=ud)])
    assert [(w.wr_id, w.status) for w in a.poll()] == [(1, OK)]
    a.buf[0:8] = b"REUSED!!"  # the sender owns its buffer again once the send completed
    assert b.poll() == []
    fabric.advance(0.010)
    (got,) = b.poll()
    assert (got.wr_id, got.status, got.length) == (7, OK, grh + 8)
    assert bytes(b.buf[4096 + grh : 4096 + grh + 8]) == b"original"
