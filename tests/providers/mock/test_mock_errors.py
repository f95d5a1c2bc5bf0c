"""Completion statuses and async events for every error path (manual clock, no sleeps)."""

from __future__ import annotations

from typing import Any

import pytest
from mockenv import UD_QKEY, Node, connect, open_node, to_rts, ud_ready

from ibal.providers.mock import MockFabric, PacketOp
from ibal.types import (
    AccessFlags,
    AsyncEvent,
    AvAttr,
    Mtu,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    Sge,
    SrqAttr,
    SrqAttrMask,
    UdDest,
    WcStatus,
    WcType,
    WrType,
)

OK = WcStatus.SUCCESS
FLUSH = WcStatus.WR_FLUSHED_ERR


def state(node: Node, qp: object) -> QpState:
    return node.ca.query_qp(qp).state


def write(a: Node, qa: object, remote_addr: int, rkey: int, wr_id: int = 1, n: int = 4) -> None:
    a.ca.post_send(qa, [SendWr(wr_id, WrType.RDMA_WRITE, [a.sge(0, n)],
                               remote_addr=remote_addr, rkey=rkey)])


# ----------------------------------------------------------------- local errors


def test_bad_lkey_is_a_local_protection_error_and_flushes_the_rest(a: Node, b: Node) -> None:
    qa, _ = connect(a, b)
    a.ca.post_send(qa, [
        SendWr(1, WrType.RDMA_WRITE, [Sge(a.addr(0), 4, 0xBAD00)], remote_addr=b.addr(0),
               rkey=b.mr.rkey),
        SendWr(2, WrType.RDMA_WRITE, [a.sge(0, 4)], remote_addr=b.addr(0), rkey=b.mr.rkey),
    ])
    assert [(w.wr_id, w.status) for w in a.poll()] == [
        (1, WcStatus.LOCAL_PROTECTION_ERR), (2, FLUSH)]
    assert state(a, qa) is QpState.ERROR


def test_sge_outside_the_region_is_a_local_protection_error(a: Node, b: Node) -> None:
    qa, _ = connect(a, b)
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(len(a.buf) - 2, 4)])])
    assert a.poll()[0].status is WcStatus.LOCAL_PROTECTION_ERR


def test_read_into_memory_without_local_write(a: Node, b: Node) -> None:
    qa, _ = connect(a, b)
    ro = a.ca.register_mr(a.pd, memoryview(bytearray(64)), 0x100, AccessFlags.NONE)
    a.ca.post_send(qa, [SendWr(1, WrType.RDMA_READ, [Sge(0x100, 8, ro.lkey)],
                               remote_addr=b.addr(0), rkey=b.mr.rkey)])
    assert a.poll()[0].status is WcStatus.LOCAL_PROTECTION_ERR


def test_ud_message_above_the_mtu_is_a_local_length_error(a: Node, b: Node) -> None:
    ua, ub = a.qp(QpType.UD), b.qp(QpType.UD)
    ud_ready(a, ua)
    ud_ready(b, ub)
    av = a.ca.create_av(a.pd, AvAttr(1, dlid=b.lid))
    a.ca.post_send(ua, [SendWr(1, WrType.SEND, [a.sge(0, 4097)],
                               ud=UdDest(av=av, remote_qp=ub.num, remote_qkey=UD_QKEY))])
    assert a.poll()[0].status is WcStatus.LOCAL_LEN_ERR
    assert state(a, ua) is QpState.SQERR  # UD send errors: SQE, receives go on
    a.ca.modify_qp(ua, QpMod(QpState.RTS))
    a.ca.post_send(ua, [SendWr(2, WrType.SEND, [a.sge(0, 8)],
                               ud=UdDest(av=av, remote_qp=ub.num, remote_qkey=UD_QKEY))])
    assert a.poll()[0].status is OK


def test_deregistered_region_fails_outstanding_work(fabric: MockFabric) -> None:
    fabric.manual_clock(inline=False)
    a, b = open_node(fabric.cas[0]), open_node(fabric.cas[1])
    qa, _ = connect(a, b)
    fabric.run_until_idle()
    spare = bytearray(64)
    mr = a.ca.register_mr(a.pd, memoryview(spare), 0x40, AccessFlags.LOCAL_WRITE)
    a.ca.modify_qp(qa, QpMod(QpState.SQD))  # hold the send queue
    a.ca.post_send(qa, [SendWr(1, WrType.RDMA_WRITE, [Sge(0x40, 8, mr.lkey)],
                               remote_addr=b.addr(0), rkey=b.mr.rkey)])
    a.ca.deregister_mr(mr.handle)
    a.ca.modify_qp(qa, QpMod(QpState.RTS))
    fabric.run_until_idle()
    assert a.poll()[0].status is WcStatus.LOCAL_PROTECTION_ERR


# ---------------------------------------------------------------- remote access


@pytest.mark.parametrize(
    "case", ["bad rkey", "past the end", "no remote write on the MR", "no remote write on the QP"]
)
def test_remote_access_errors(a: Node, b: Node, case: str) -> None:
    extra: dict[str, Any] = (
        {"access": AccessFlags.RDMA_READ} if case == "no remote write on the QP" else {}
    )
    qa, qb = connect(a, b, **extra)
    rkey, addr = b.mr.rkey, b.addr(0)
    if case == "bad rkey":
        rkey = 0x77700
    elif case == "past the end":
        addr = b.addr(len(b.buf) - 2)
    elif case == "no remote write on the MR":
        ro = b.ca.register_mr(b.pd, memoryview(bytearray(64)), 0x200, AccessFlags.RDMA_READ)
        rkey, addr = ro.rkey, 0x200
    write(a, qa, addr, rkey)
    (wc,) = a.poll()
    assert (wc.wc_type, wc.status) == (WcType.RDMA_WRITE, WcStatus.REM_ACCESS_ERR)
    assert state(a, qa) is QpState.ERROR
    assert state(b, qb) is QpState.ERROR  # the responder goes to error too
    (ev,) = b.events
    assert (ev.code, ev.context) == (AsyncEvent.WQ_ACCESS_ERROR, f"{b.ca.name}-qp")


def test_remote_read_and_atomic_access_errors(fabric: MockFabric) -> None:
    a, b = open_node(fabric.cas[0]), open_node(fabric.cas[1])
    wo = b.ca.register_mr(b.pd, memoryview(bytearray(64)), 0x200,
                          AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE)
    for op in (WrType.RDMA_READ, WrType.FETCH_ADD):
        qa, _ = connect(a, b)
        a.ca.post_send(qa, [SendWr(1, op, [a.sge(0, 8)], remote_addr=0x200, rkey=wo.rkey)])
        assert a.poll()[0].status is WcStatus.REM_ACCESS_ERR


def test_misaligned_atomic_is_an_invalid_request(a: Node, b: Node) -> None:
    qa, _qb = connect(a, b)
    a.ca.post_send(qa, [SendWr(1, WrType.COMPARE_SWAP, [a.sge(0, 8)], remote_addr=b.addr(4),
                               rkey=b.mr.rkey)])
    assert a.poll()[0].status is WcStatus.REM_INVALID_REQ_ERR
    assert b.events[0].code is AsyncEvent.WQ_REQ_ERROR


def test_receive_buffer_too_small(a: Node, b: Node) -> None:
    qa, qb = connect(a, b)
    b.ca.post_recv(qb, [RecvWr(7, [b.sge(0, 4)]), RecvWr(8, [b.sge(0, 64)])])
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 16)])])
    assert [(w.wr_id, w.status) for w in b.poll()] == [(7, WcStatus.LOCAL_LEN_ERR), (8, FLUSH)]
    assert a.poll()[0].status is WcStatus.REM_INVALID_REQ_ERR
    assert state(a, qa) is QpState.ERROR and state(b, qb) is QpState.ERROR


def test_receive_sge_with_bad_lkey_is_a_remote_operational_error(a: Node, b: Node) -> None:
    qa, qb = connect(a, b)
    b.ca.post_recv(qb, [RecvWr(7, [Sge(b.addr(0), 64, 0x12300)])])
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 16)])])
    assert b.poll()[0].status is WcStatus.LOCAL_PROTECTION_ERR
    assert a.poll()[0].status is WcStatus.REM_OP_ERR


def test_uc_errors_at_the_responder_are_silent(a: Node, b: Node) -> None:
    qa, qb = connect(a, b, QpType.UC)
    write(a, qa, b.addr(0), 0x55500)
    assert a.poll()[0].status is OK  # UC completes when sent
    assert state(b, qb) is QpState.RTS
    assert a.ca.fabric.counters.dropped_access == 1
    a.ca.post_send(qa, [SendWr(2, WrType.SEND, [a.sge(0, 4)])])  # no receive posted: dropped
    assert a.poll()[0].status is OK and b.poll() == []


# ------------------------------------------------------------- P_Key and Q_Key


def test_pkey_mismatch_drops_and_counts(fabric: MockFabric) -> None:
    ca = fabric.add_ca(pkeys=[0x8001])
    c = open_node(ca)
    a = open_node(fabric.cas[0])
    qa, qc = a.qp(), c.qp()
    to_rts(a, qa, c, qc.num, retry_cnt=1, ack_timeout=8)
    to_rts(c, qc, a, qa.num, pkey_index=1)  # c's QP is in partition 0x8001
    write(a, qa, c.addr(0), c.mr.rkey)
    assert a.poll() == []
    port = ca.ports[0]
    assert port.pkey_violations == 1
    assert c.ca.query_ca(c.h).ports[0].pkey_violations == 1
    fabric.settle()
    assert a.poll()[0].status is WcStatus.TIMEOUT_RETRY_ERR
    assert port.pkey_violations == 2  # the one retry was dropped too


def test_limited_members_cannot_talk_to_each_other(fabric: MockFabric) -> None:
    x = open_node(fabric.add_ca(pkeys=[0x7FFF]))
    y = open_node(fabric.add_ca(pkeys=[0x7FFF]))
    qx, qy = x.qp(), y.qp()
    to_rts(x, qx, y, qy.num, pkey_index=1, retry_cnt=0, ack_timeout=8)
    to_rts(y, qy, x, qx.num, pkey_index=1)
    write(x, qx, y.addr(0), y.mr.rkey)
    fabric.settle()
    assert x.poll()[0].status is WcStatus.TIMEOUT_RETRY_ERR
    assert y.ca.ports[0].pkey_violations == 1


def test_qkey_mismatch_drops_and_counts(a: Node, b: Node) -> None:
    ua, ub = a.qp(QpType.UD), b.qp(QpType.UD)
    ud_ready(a, ua)
    ud_ready(b, ub)
    b.ca.post_recv(ub, [RecvWr(1, [b.sge(0, 100)])])
    av = a.ca.create_av(a.pd, AvAttr(1, dlid=b.lid))
    a.ca.post_send(ua, [SendWr(1, WrType.SEND, [a.sge(0, 4)],
                               ud=UdDest(av=av, remote_qp=ub.num, remote_qkey=0x1234))])
    assert a.poll()[0].status is OK  # UD: the sender never knows
    assert b.poll() == []
    assert b.ca.ports[0].qkey_violations == 1
    assert b.ca.fabric.counters.qkey_violations == 1


# ------------------------------------------------------------------ RNR, retry


def test_rnr_retries_after_the_rnr_timer_then_succeeds(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    qa, qb = connect(a, b, rnr_timer=14, rnr_retry_cnt=3)  # 1.28 ms
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 4)])])
    assert a.poll() == [] and fabric.counters.rnr_naks == 1
    fabric.advance(0.0012)  # not yet
    assert fabric.counters.rnr_naks == 1
    fabric.advance(0.0001)  # the retry: still no receive
    assert fabric.counters.rnr_naks == 2
    b.ca.post_recv(qb, [RecvWr(9, [b.sge(0, 16)])])
    fabric.advance(0.00128)
    assert a.poll()[0].status is OK and b.poll()[0].wr_id == 9
    assert fabric.counters.rnr_retries == 2


def test_rnr_retry_count_exhausted(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    qa, qb = connect(a, b, rnr_timer=1, rnr_retry_cnt=2)
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 4)]),
                        SendWr(2, WrType.SEND, [a.sge(0, 4)])])
    fabric.settle()
    assert [(w.wr_id, w.status) for w in a.poll()] == [(1, WcStatus.RNR_RETRY_ERR), (2, FLUSH)]
    assert fabric.counters.rnr_naks == 3  # first try and two retries
    assert state(a, qa) is QpState.ERROR
    assert state(b, qb) is QpState.RTS  # an RNR is not an error at the responder


def test_rnr_retry_seven_is_infinite(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    qa, qb = connect(a, b, rnr_timer=1, rnr_retry_cnt=7)
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 4)])])
    fabric.settle(max_timers=50)
    assert a.poll() == [] and fabric.counters.rnr_naks == 51
    b.ca.post_recv(qb, [RecvWr(9, [b.sge(0, 16)])])
    fabric.settle(max_timers=5)
    assert a.poll()[0].status is OK


def test_lost_request_is_retransmitted_after_the_ack_timeout(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    qa, _ = connect(a, b, ack_timeout=10, retry_cnt=3)  # 4.19 ms
    fabric.faults.drop(op=PacketOp.RDMA_WRITE, nth=1)
    a.buf[0:4] = b"late"
    write(a, qa, b.addr(100), b.mr.rkey)
    assert a.poll() == [] and bytes(b.buf[100:104]) == bytes(4)
    fabric.advance(0.004)
    assert a.poll() == []
    fabric.advance(0.0002)
    assert a.poll()[0].status is OK and bytes(b.buf[100:104]) == b"late"
    assert fabric.counters.retransmitted == 1 and fabric.counters.timeouts == 1


def test_lost_ack_gives_a_duplicate_that_is_not_executed_twice(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    qa, qb = connect(a, b, ack_timeout=10)
    fabric.faults.drop(op=PacketOp.ACK, nth=1)
    b.ca.post_recv(qb, [RecvWr(1, [b.sge(0, 16)]), RecvWr(2, [b.sge(0, 16)])])
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [a.sge(0, 4)])])
    fabric.settle()
    assert a.poll()[0].status is OK
    assert [w.wr_id for w in b.poll()] == [1]  # the retransmission consumed nothing
    assert fabric.counters.duplicates_received == 1


def test_lost_read_response_reads_again(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    qa, _ = connect(a, b, ack_timeout=10)
    fabric.faults.drop(op=PacketOp.READ_RESP, nth=1)
    b.buf[0:4] = b"data"
    a.ca.post_send(qa, [SendWr(1, WrType.RDMA_READ, [a.sge(64, 4)], remote_addr=b.addr(0),
                               rkey=b.mr.rkey)])
    fabric.settle()
    assert a.poll()[0].status is OK and bytes(a.buf[64:68]) == b"data"


def test_lost_atomic_response_replays_the_saved_result(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    qa, _ = connect(a, b, ack_timeout=10)
    fabric.faults.drop(op=PacketOp.ATOMIC_ACK, nth=1)
    a.ca.post_send(qa, [SendWr(1, WrType.FETCH_ADD, [a.sge(64, 8)], remote_addr=b.addr(0),
                               rkey=b.mr.rkey, compare_add=5)])
    fabric.settle()
    assert a.poll()[0].status is OK
    assert int.from_bytes(b.buf[0:8], "little") == 5  # executed once
    assert int.from_bytes(a.buf[64:72], "little") == 0


def test_out_of_order_packet_gets_a_sequence_nak(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    qa, _ = connect(a, b, ack_timeout=10)
    fabric.faults.drop(op=PacketOp.RDMA_WRITE, nth=1)
    write(a, qa, b.addr(0), b.mr.rkey, wr_id=1)
    write(a, qa, b.addr(8), b.mr.rkey, wr_id=2)  # arrives ahead of its time: NAK
    assert fabric.counters.naks == 1
    assert [(w.wr_id, w.status) for w in a.poll()] == [(1, OK), (2, OK)]
    assert fabric.counters.retransmitted == 2


def test_link_down_ends_in_timeout_retry_error(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    qa, _ = connect(a, b, ack_timeout=8, retry_cnt=2)
    fabric.set_link(b.ca.ports[0], up=False)
    assert b.event_codes() == ["PORT_DOWN"] and b.events[0].port_num == 1
    assert b.events[0].context == f"{b.ca.name}-ctx"
    write(a, qa, b.addr(0), b.mr.rkey)
    fabric.settle()
    assert a.poll()[0].status is WcStatus.TIMEOUT_RETRY_ERR
    assert fabric.counters.timeouts == 3
    fabric.set_link(b.ca.ports[0], up=True)
    assert b.event_codes() == ["PORT_DOWN", "PORT_ACTIVE"]


# -------------------------------------------------------------- flush and state


def test_error_state_flushes_everything(a: Node, b: Node) -> None:
    a.ca.fabric.manual_clock(inline=False)
    qa, qb = connect(a, b)
    b.ca.post_recv(qb, [RecvWr(i, [b.sge(0, 8)]) for i in range(3)])
    a.ca.post_send(qa, [SendWr(10 + i, WrType.SEND, [a.sge(0, 4)]) for i in range(2)])
    a.ca.modify_qp(qa, QpMod(QpState.ERROR))
    b.ca.modify_qp(qb, QpMod(QpState.ERROR))
    assert [(w.wr_id, w.status) for w in a.poll()] == [(10, FLUSH), (11, FLUSH)]
    assert [(w.wr_id, w.status, w.wc_type) for w in b.poll()] == [
        (i, FLUSH, WcType.RECV) for i in range(3)]
    b.ca.post_recv(qb, [RecvWr(5, [b.sge(0, 8)])])  # posted in ERROR: flushed at once
    assert [(w.wr_id, w.status) for w in b.poll()] == [(5, FLUSH)]
    # IBA 10.8.3: sends posted in ERROR complete flushed, signaled or not.
    a.ca.post_send(qa, [SendWr(1, WrType.SEND, [], SendOpt.NONE),
                        SendWr(2, WrType.RDMA_WRITE, [a.sge(0, 4)], SendOpt.SIGNALED)])
    assert [(w.wr_id, w.status, w.wc_type) for w in a.poll()] == [
        (1, FLUSH, WcType.SEND), (2, FLUSH, WcType.RDMA_WRITE)]
    a.ca.fabric.run_until_idle()  # packets already on the wire find a dead QP
    assert a.poll() == [] and b.poll() == []


def test_reset_discards_without_completions(a: Node, b: Node) -> None:
    _qa, qb = connect(a, b)
    b.ca.post_recv(qb, [RecvWr(1, [b.sge(0, 8)])])
    b.ca.modify_qp(qb, QpMod(QpState.RESET))
    assert b.poll() == [] and state(b, qb) is QpState.RESET


def test_qp_comm_when_the_first_packet_arrives_in_rtr(a: Node, b: Node) -> None:
    qa, qb = a.qp(), b.qp(context="responder")
    to_rts(a, qa, b, qb.num)
    b.ca.modify_qp(qb, QpMod(QpState.INIT, pkey_index=0, port_num=1,
                             access=AccessFlags.RDMA_WRITE))
    b.ca.modify_qp(qb, QpMod(QpState.RTR, primary_av=AvAttr(1, dlid=a.lid), path_mtu=Mtu.MTU_1024,
                             dest_qp=qa.num, rq_psn=0, resp_res=1, rnr_nak_timeout=1))
    write(a, qa, b.addr(0), b.mr.rkey)
    write(a, qa, b.addr(0), b.mr.rkey, wr_id=2)
    assert [(e.code, e.context) for e in b.events] == [(AsyncEvent.QP_COMM, "responder")]
    assert [w.status for w in a.poll()] == [OK, OK]  # RTR receives and acknowledges


def test_sq_drained_event(a: Node, b: Node) -> None:
    fabric = a.ca.fabric
    fabric.manual_clock(inline=False)
    qa, _ = connect(a, b)
    write(a, qa, b.addr(0), b.mr.rkey)
    a.ca.modify_qp(qa, QpMod(QpState.SQD, sqd_event=True))
    assert a.ca.query_qp(qa).sq_draining and a.events == []
    write(a, qa, b.addr(0), b.mr.rkey, wr_id=2)  # queues in SQD
    fabric.run_until_idle()
    assert a.event_codes() == ["SQ_DRAINED"] and not a.ca.query_qp(qa).sq_draining
    assert [w.wr_id for w in a.poll()] == [1]
    a.ca.modify_qp(qa, QpMod(QpState.RTS))
    fabric.run_until_idle()
    assert [w.wr_id for w in a.poll()] == [2]


def test_srq_limit_event_fires_once_when_armed(a: Node, b: Node) -> None:
    srq = b.ca.create_srq(b.pd, SrqAttr(8, 1, 0), "my-srq").handle
    qa, qb = a.qp(), b.qp(srq=srq)
    to_rts(a, qa, b, qb.num)
    to_rts(b, qb, a, qa.num)
    b.ca.post_srq_recv(srq, [RecvWr(i, [b.sge(0, 8)]) for i in range(4)])
    b.ca.modify_srq(srq, SrqAttr(srq_limit=3), SrqAttrMask.LIMIT)
    assert b.ca.query_srq(srq).srq_limit == 3
    for i in range(3):
        a.ca.post_send(qa, [SendWr(i, WrType.SEND, [a.sge(0, 4)])])
    assert [(e.code, e.context) for e in b.events] == [(AsyncEvent.SRQ_LIMIT_REACHED, "my-srq")]
    assert b.ca.query_srq(srq).srq_limit == 0  # disarmed


def test_last_wqe_reached_for_a_qp_on_an_srq(a: Node, b: Node) -> None:
    srq = b.ca.create_srq(b.pd, SrqAttr(8, 1, 0), "srq").handle
    qb = b.qp(srq=srq, context="on-srq")
    b.ca.modify_qp(qb, QpMod(QpState.ERROR))
    assert [(e.code, e.context) for e in b.events] == [
        (AsyncEvent.SRQ_QP_LAST_WQE_REACHED, "on-srq")]


def test_cq_overflow_raises_cq_error(a: Node, b: Node) -> None:
    small, _ = b.ca.create_cq(b.h, 2, "tiny")
    qa, qb = a.qp(), b.qp(cq=small)
    to_rts(a, qa, b, qb.num)
    to_rts(b, qb, a, qa.num)
    b.ca.post_recv(qb, [RecvWr(i, [b.sge(0, 8)]) for i in range(3)])
    a.ca.post_send(qa, [SendWr(i, WrType.SEND, [a.sge(0, 4)]) for i in range(3)])
    assert [(e.code, e.context) for e in b.events] == [(AsyncEvent.CQ_ERROR, "tiny")]
    assert len(b.poll(cq=small)) == 2


def test_destroyed_qp_makes_no_more_completions(fabric: MockFabric) -> None:
    fabric.manual_clock(inline=False)
    a, b = open_node(fabric.cas[0]), open_node(fabric.cas[1])
    qa, _ = connect(a, b)
    write(a, qa, b.addr(0), b.mr.rkey, wr_id=1)
    fabric.run_until_idle()
    write(a, qa, b.addr(0), b.mr.rkey, wr_id=2)
    a.ca.destroy_qp(qa)
    fabric.run_until_idle()
    assert [w.wr_id for w in a.poll()] == [1]  # already in the CQ: still there


def test_ud_to_a_missing_qp_is_dropped(a: Node, b: Node) -> None:
    ua = a.qp(QpType.UD)
    ud_ready(a, ua)
    av = a.ca.create_av(a.pd, AvAttr(1, dlid=b.lid))
    a.ca.post_send(ua, [SendWr(1, WrType.SEND, [a.sge(0, 4)],
                               ud=UdDest(av=av, remote_qp=0x999, remote_qkey=UD_QKEY))])
    assert a.poll()[0].status is OK
    assert a.ca.fabric.counters.dropped_no_dest == 1


def test_unsignaled_send_queue_space_is_released(a: Node, b: Node) -> None:
    qa, _ = connect(a, b, caps=QpCaps(2, 2, 1, 1, 0), sq_signaled=False)
    for i in range(10):
        a.ca.post_send(qa, [SendWr(i, WrType.RDMA_WRITE, [a.sge(0, 4)], send_opt=SendOpt.NONE,
                                   remote_addr=b.addr(0), rkey=b.mr.rkey)])
    assert a.poll() == []


def test_bind_behind_a_lost_request_does_not_hide_its_retry(a: Node, b: Node) -> None:
    from ibal.types import BindWr

    fabric = a.ca.fabric
    qa, _ = connect(a, b, ack_timeout=10)
    mw, rkey = a.ca.create_mw(a.pd)
    fabric.faults.drop(op=PacketOp.RDMA_WRITE, nth=1)
    write(a, qa, b.addr(0), b.mr.rkey, wr_id=1)  # lost
    a.ca.bind_mw(mw, qa, BindWr(a.mr.handle, a.addr(0), 8, AccessFlags.RDMA_READ, rkey,
                                wr_id=2))
    write(a, qa, b.addr(8), b.mr.rkey, wr_id=3)  # overtakes: sequence NAK for write 1
    fabric.settle()
    assert [(w.wr_id, w.wc_type, w.status) for w in a.poll()] == [
        (1, WcType.RDMA_WRITE, OK), (2, WcType.MW_BIND, OK), (3, WcType.RDMA_WRITE, OK)]
