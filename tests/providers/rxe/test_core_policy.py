"""The transport core's policies: the rxe reading and the IBA reading, side by side.

Each difference docs/decisions.md lists between the IBA text and kernel rxe is
driven through two cores back to back under both policies; where the mock's
engine answers the same question, its answer is checked against the IBA
policy's.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from rxeharness import Node, Wire, connect, send_wr

from ibal.ci import Handle
from ibal.providers.mock import MockCa, MockFabric
from ibal.providers.mock.packets import PacketOp
from ibal.providers.rxe.device import RXE_LIMITS
from ibal.transport.policy import IBA_POLICY, RXE_POLICY, TransportPolicy
from ibal.transport.timers import ack_timeout_seconds
from ibal.types import (
    AccessFlags,
    AvAttr,
    Mtu,
    PdType,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    SendOpt,
    SendWr,
    Sge,
    WcStatus,
    WrType,
)
from ibal.wire import packet as P
from ibal.wire.packet import Opcode, Packet

TIMEOUT = 8


def black_hole(pkt: Packet, who: str) -> list[Packet]:
    return [] if who == "a" else [pkt]


# ------------------------------------------------------------------ the mock
@dataclass
class MockPair:
    """The requester's end of a mock RC pair, and the keys of both ends' regions."""

    fabric: MockFabric
    ca: MockCa
    cq: Handle
    qp: Handle
    lkey: int
    rkey: int

    def post(self, wrs: list[SendWr]) -> None:
        self.ca.post_send(self.qp, wrs)

    def poll(self) -> list[tuple[int, WcStatus]]:
        return [(c.wr_id, c.status) for c in self.ca.poll_cq(self.cq, 16)]


def mock_rc_pair(retry_cnt: int, resp_res: int = 4) -> MockPair:
    """Two mock CAs with one RC QP each in RTS at MTU 256, on the manual clock."""
    fabric = MockFabric(seed=0)
    cas = [fabric.add_ca(), fabric.add_ca()]
    fabric.manual_clock(inline=False)
    ends = []
    access = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE
    for ca in cas:
        h = ca.open_ca(lambda _cq: None, lambda _ev: None, None)
        pd = ca.allocate_pd(h, PdType.NORMAL)
        cq, _ = ca.create_cq(h, 64, None)
        mr = ca.register_mr(pd, memoryview(bytearray(4096)), 0x10000, access)
        qp = ca.create_qp(pd, QpType.RC, QpCaps(16, 16, 1, 1, 0), cq, cq, None, True, None)
        ends.append((ca, cq, mr, qp.handle))
    for (ca, _, _, qp), (peer, _, _, pqp) in ((ends[0], ends[1]), (ends[1], ends[0])):
        ca.modify_qp(qp, QpMod(QpState.INIT, pkey_index=0, port_num=1,
                               access=AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE))
        ca.modify_qp(qp, QpMod(QpState.RTR, primary_av=AvAttr(1, dlid=peer.ports[0].lid),
                               path_mtu=Mtu.MTU_256, dest_qp=pqp.num, rq_psn=0,
                               resp_res=resp_res, rnr_nak_timeout=1))
        ca.modify_qp(qp, QpMod(QpState.RTS, sq_psn=0, local_ack_timeout=TIMEOUT,
                               retry_cnt=retry_cnt, rnr_retry_cnt=7, init_depth=4))
    (a, acq, amr, aqp), (_, _, bmr, _) = ends
    return MockPair(fabric, a, acq, aqp, amr.lkey, bmr.rkey)


# ---------------------------------------------------------------- retry_cnt 7
def test_retry_cnt_7_iba_gives_up_after_seven_retries_as_the_mock() -> None:
    a, b = connect(retry_cnt=7, timeout=TIMEOUT, policy=IBA_POLICY)
    w = Wire(a, b, fault=black_hole)
    src = a.mem.register(10)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=b.mem.register(10), wr_id=1))
    w.run()
    assert [(c.wr_id, c.status) for c in a.send_wcs] == [(1, WcStatus.TIMEOUT_RETRY_ERR)]
    # eight timeouts: the first sending and seven retries, as the mock counts them
    assert a.counters.completer_retry_err == 8 and a.counters.retry_exceeded_err == 1
    assert w.now == pytest.approx(8 * ack_timeout_seconds(TIMEOUT))

    m = mock_rc_pair(retry_cnt=7)
    m.fabric.faults.drop(op=PacketOp.RDMA_WRITE)
    m.post([SendWr(1, WrType.RDMA_WRITE, [Sge(0x10000, 10, m.lkey)], SendOpt.SIGNALED,
                   remote_addr=0x10000, rkey=m.rkey)])
    m.fabric.run_until_idle()
    took = m.fabric.settle()
    got = m.poll()
    m.fabric.close()
    assert got == [(1, WcStatus.TIMEOUT_RETRY_ERR)]
    assert m.fabric.counters.timeouts == 8
    assert took == pytest.approx(w.now)


def test_retry_cnt_7_rxe_never_gives_up() -> None:
    a, b = connect(retry_cnt=7, timeout=TIMEOUT, policy=RXE_POLICY)
    w = Wire(a, b, fault=black_hole)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, a.mem.register(10),
                             remote=b.mem.register(10), wr_id=1))
    w.run(max_time=50 * ack_timeout_seconds(TIMEOUT))
    assert a.send_wcs == [] and a.cfg.state is QpState.RTS
    assert a.counters.completer_retry_err >= 40 and a.counters.retry_exceeded_err == 0


@pytest.mark.parametrize("policy", [RXE_POLICY, IBA_POLICY], ids=lambda p: p.name)
def test_retry_cnt_below_7_is_finite_under_both(policy: TransportPolicy) -> None:
    a, b = connect(retry_cnt=3, timeout=TIMEOUT, policy=policy)
    w = Wire(a, b, fault=black_hole)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, a.mem.register(10),
                             remote=b.mem.register(10), wr_id=1))
    w.run()
    assert [c.status for c in a.send_wcs] == [WcStatus.TIMEOUT_RETRY_ERR]
    assert w.now == pytest.approx(4 * ack_timeout_seconds(TIMEOUT))


# ------------------------------------------------------------ duplicate ACKs
@pytest.mark.parametrize(("policy", "acks"), [(RXE_POLICY, 1), (IBA_POLICY, 3)],
                         ids=["rxe", "iba"])
def test_duplicate_packets_acked_by_policy(policy: TransportPolicy, acks: int) -> None:
    """A 3-packet SEND replayed packet by packet: ACKs for AckReq only, or for each."""
    a, b = connect(mtu=256, policy=policy)
    w = Wire(a, b)
    src = a.mem.register(600)
    dst = b.mem.register(600)
    b.post_recv(dst, wr_id=5)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1))
    w.run()
    assert [c.status for c in a.send_wcs] == [WcStatus.SUCCESS]
    sent = [p for who, p in w.log if who == "a"]
    assert [p.ack_req for p in sent] == [False, False, True]
    answers = []
    for p in sent:
        b.core.receive(p, w.now)
        answers += [(q.opcode, q.psn) for q in b.core.poll(w.now)]
    last = sent[-1].psn
    assert answers == [(Opcode.RC_ACKNOWLEDGE, last)] * acks
    assert b.counters.duplicate_request == 3
    assert b.counters.drops.get("duplicate", 0) == 3 - acks
    b.collect()
    assert [c.wr_id for c in b.recv_wcs] == [5]  # delivered once


# ---------------------------------------------------------- responder resources
def _reads(policy: TransportPolicy) -> tuple[Node, Node, Wire]:
    """Four 16-byte READs in flight at once against a responder with one resource."""
    a, b = connect(depth=4, policy=policy, retry_cnt=1, timeout=TIMEOUT)
    b.cfg.resp_res = 1
    w = Wire(a, b)
    remote = b.mem.register(64, fill=0x5A)
    local = a.mem.register(64)
    for i in range(4):
        a.core.post_send(send_wr(WrType.RDMA_READ, local, 16, offset=16 * i, remote=remote,
                                 wr_id=i))
    w.run()
    return a, b, w


def test_resp_res_enforced_by_rxe() -> None:
    _, b, w = _reads(RXE_POLICY)
    assert b.cfg.state is QpState.ERROR
    assert b.counters.drops["responder_resources"] == 1
    # the NAK for the second READ is the last thing the responder sent
    last = [(p.opcode, p.syndrome) for who, p in w.log if who == "b"][-1]
    assert last == (Opcode.RC_ACKNOWLEDGE, P.Nak.INVALID_REQUEST)


def test_resp_res_not_enforced_by_iba_as_the_mock() -> None:
    a, b, _ = _reads(IBA_POLICY)
    wcs = [(c.wr_id, c.status) for c in a.send_wcs]
    assert wcs == [(i, WcStatus.SUCCESS) for i in range(4)] and b.cfg.state is QpState.RTS
    assert b.counters.drops == {}

    m = mock_rc_pair(retry_cnt=7, resp_res=1)
    m.post([SendWr(i, WrType.RDMA_READ, [Sge(0x10000 + 16 * i, 16, m.lkey)], SendOpt.SIGNALED,
                   remote_addr=0x10000, rkey=m.rkey) for i in range(4)])
    assert m.fabric.ready == 4  # the four READ requests are on the wire at once
    m.fabric.run_until_idle()
    m.fabric.settle()
    got = m.poll()
    m.fabric.close()
    assert got == wcs


# -------------------------------------------------------- window and AckReq
@pytest.mark.parametrize("policy", [RXE_POLICY, IBA_POLICY], ids=lambda p: p.name)
def test_unacked_window_and_ack_req_cadence(policy: TransportPolicy) -> None:
    a, b = connect(mtu=256, policy=policy)
    npkts = 200
    src = a.mem.register(256 * npkts)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=b.mem.register(256 * npkts)))
    first = a.core.poll(0.0, 1000)
    assert len(first) == min(npkts, policy.max_unacked_psns)
    asked = [i for i, p in enumerate(first) if p.ack_req]
    want = [i for i in range(len(first))
            if (i + 1) % policy.max_pkt_per_ack == 0 or i == npkts - 1]
    assert asked == want
    w = Wire(a, b)
    for p in first:
        b.core.receive(p, 0.0)
    w.run()
    assert [c.status for c in a.send_wcs] == [WcStatus.SUCCESS]


def test_rxe_policy_is_the_device_limits() -> None:
    assert (RXE_POLICY.max_pkt_per_ack, RXE_POLICY.max_unacked_psns) == (
        RXE_LIMITS.max_pkt_per_ack, RXE_LIMITS.max_unacked_psns)


@pytest.mark.parametrize(("field", "value"), [
    ("max_unacked_psns", 0), ("max_unacked_psns", 1 << 23), ("max_pkt_per_ack", 0)])
def test_policy_rejects_values_a_core_cannot_follow(field: str, value: int) -> None:
    kw = {"name": "x", "infinite_retry_at_7": True, "ack_every_duplicate": True,
          "enforce_resp_res": True, "max_unacked_psns": 128, "max_pkt_per_ack": 64}
    kw[field] = value
    with pytest.raises(ValueError, match=field):
        TransportPolicy(**kw)  # type: ignore[arg-type]
