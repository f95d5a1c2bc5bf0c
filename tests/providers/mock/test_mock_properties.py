"""Property: RC delivers every operation exactly once, in order, whatever the (moderate) loss."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mockenv import connect, open_node

from ibal.providers.mock import MockFabric
from ibal.types import RecvWr, SendWr, WcStatus, WcType, WrType

OPS = st.lists(st.sampled_from(["write", "send", "read", "fetch_add"]), min_size=1, max_size=24)
PROB = st.floats(min_value=0.0, max_value=0.15)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=OPS, seed=st.integers(0, 2**16), drop=PROB, dup=PROB, delay=PROB,
    mtu_packets=st.sampled_from([8, 3000]),
)
def test_rc_exactly_once_in_order(
    ops: list[str], seed: int, drop: float, dup: float, delay: float, mtu_packets: int
) -> None:
    fabric = MockFabric(seed=seed)
    fabric.add_ca()
    fabric.add_ca()
    fabric.manual_clock()
    try:
        a, b = open_node(fabric.cas[0]), open_node(fabric.cas[1])
        qa, qb = connect(a, b, ack_timeout=8, retry_cnt=7, rnr_retry_cnt=7)
        fabric.faults.drop(probability=drop)
        fabric.faults.duplicate(probability=dup)
        fabric.faults.delay(0.0003, probability=delay)
        sends = ops.count("send")
        b.ca.post_recv(qb, [RecvWr(100 + i, [b.sge(12000 + i * 64, 64)]) for i in range(sends)])
        b.buf[4000 : 4000 + mtu_packets] = bytes(i % 251 for i in range(mtu_packets))
        expected_types = []
        for i, op in enumerate(ops):
            a.buf[i * 8 : i * 8 + 8] = (i + 1).to_bytes(8, "little")
            if op == "write":
                wr = SendWr(i, WrType.RDMA_WRITE, [a.sge(i * 8, 8)], remote_addr=b.addr(i * 8),
                            rkey=b.mr.rkey)
                expected_types.append(WcType.RDMA_WRITE)
            elif op == "send":
                wr = SendWr(i, WrType.SEND, [a.sge(i * 8, 8)])
                expected_types.append(WcType.SEND)
            elif op == "read":
                wr = SendWr(i, WrType.RDMA_READ, [a.sge(5000 + i * 16, 8)],
                            remote_addr=b.addr(4000 + i), rkey=b.mr.rkey)
                expected_types.append(WcType.RDMA_READ)
            else:
                wr = SendWr(i, WrType.FETCH_ADD, [a.sge(9000 + i * 8, 8)],
                            remote_addr=b.addr(11000), rkey=b.mr.rkey, compare_add=1)
                expected_types.append(WcType.FETCH_ADD)
            a.ca.post_send(qa, [wr])
        fabric.settle(max_seconds=60)
        done = a.poll(1000)
        assert [(w.wr_id, w.wc_type, w.status) for w in done] == [
            (i, t, WcStatus.SUCCESS) for i, t in enumerate(expected_types)
        ]
        received = b.poll(1000)
        assert [w.wr_id for w in received] == [100 + i for i in range(sends)]
        fetched = []
        for i, op in enumerate(ops):
            mine = (i + 1).to_bytes(8, "little")
            if op == "write":
                assert bytes(b.buf[i * 8 : i * 8 + 8]) == mine
            elif op == "read":
                assert bytes(a.buf[5000 + i * 16 : 5008 + i * 16]) == bytes(
                    b.buf[4000 + i : 4008 + i]
                )
            elif op == "fetch_add":
                fetched.append(int.from_bytes(a.buf[9000 + i * 8 : 9008 + i * 8], "little"))
        assert fetched == list(range(len(fetched)))  # each executed once, in order
        assert int.from_bytes(b.buf[11000:11008], "little") == len(fetched)
        send_indexes = [i for i, op in enumerate(ops) if op == "send"]
        for k, index in enumerate(send_indexes):
            assert bytes(b.buf[12000 + k * 64 : 12008 + k * 64]) == (index + 1).to_bytes(
                8, "little"
            )
    finally:
        fabric.close()
