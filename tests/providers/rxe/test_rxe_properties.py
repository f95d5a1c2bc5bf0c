"""Property: over a lossy, duplicating, reordering wire, RC delivers every WR exactly once."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rxeharness import Wire, connect, send_wr

from ibal.transport.psn import PSN_MASK
from ibal.types import QpType, WcStatus, WrType
from ibal.wire.packet import Packet

OPS = st.lists(
    st.tuples(st.sampled_from(["send", "write", "write_imm", "read", "fetch_add"]),
              st.integers(0, 1500)),
    min_size=1, max_size=16,
)
PROB = st.floats(min_value=0.0, max_value=0.2)


def data(n: int, seed: int) -> bytes:
    return bytes((i * 13 + seed * 7 + 1) & 0xFF for i in range(n))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, seed=st.integers(0, 2**16), drop=PROB, dup=PROB, reorder=PROB,
       mtu=st.sampled_from([256, 1024]), wrap=st.booleans())
def test_rc_exactly_once_byte_exact(
    ops: list[tuple[str, int]], seed: int, drop: float, dup: float, reorder: float, mtu: int,
    wrap: bool,
) -> None:
    rng = random.Random(seed)

    def fault(pkt: Packet, who: str) -> list[Packet]:
        if rng.random() < drop:
            return []
        if rng.random() < dup:
            return [pkt, pkt.copy()]
        return [pkt]

    psn = PSN_MASK - 5 if wrap else 0x100
    a, b = connect(mtu=mtu, psn_a=psn, psn_b=psn - 40, timeout=6, retry_cnt=7, rnr_retry=7,
                   min_rnr_timer=1, depth=4)
    w = Wire(a, b, fault=fault, rng=rng, reorder=reorder, codec=True)
    counter = b.mem.register(8)
    checks = []
    adds = []
    recv_ids = []
    for i, (op, n) in enumerate(ops):
        src = a.mem.register(max(n, 8))
        src.buf[:n] = data(n, i)
        if op == "send":
            dst = b.mem.register(max(n, 1), fill=0xAA)
            b.post_recv(dst, n, wr_id=i)
            recv_ids.append((i, n))
            a.core.post_send(send_wr(WrType.SEND, src, n, wr_id=i))
            checks.append((dst, data(n, i)))
        elif op in ("write", "write_imm"):
            dst = b.mem.register(max(n, 1), fill=0xAA)
            imm = None
            if op == "write_imm":
                imm = i
                b.post_recv(b.mem.register(1), 0, wr_id=i)
                recv_ids.append((i, n))
            a.core.post_send(send_wr(WrType.RDMA_WRITE, src, n, remote=dst, wr_id=i, imm=imm))
            checks.append((dst, data(n, i)))
        elif op == "read":
            remote = b.mem.register(max(n, 1))
            remote.buf[:n] = data(n, i + 1000)
            local = a.mem.register(max(n, 1), fill=0xAA)
            a.core.post_send(send_wr(WrType.RDMA_READ, local, n, remote=remote, wr_id=i))
            checks.append((local, data(n, i + 1000)))
        else:
            a.core.post_send(send_wr(WrType.FETCH_ADD, src, 8, remote=counter,
                                     compare_add=i + 1, wr_id=i))
            adds.append((src, i + 1))
    w.run(max_time=1000.0)
    assert [(c.wr_id, c.status) for c in a.send_wcs] == [
        (i, WcStatus.SUCCESS) for i in range(len(ops))]
    assert [(c.wr_id, c.status, c.length) for c in b.recv_wcs] == [
        (i, WcStatus.SUCCESS, n) for i, n in recv_ids]
    for region, expect in checks:
        assert bytes(region.buf[: len(expect)]) == expect
    total = 0
    for res, add in adds:  # executed once each, in order
        assert int.from_bytes(res.buf[:8], "little") == total
        total += add
    assert int.from_bytes(counter.buf, "little") == total


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(0, 1200), min_size=1, max_size=10), seed=st.integers(0, 2**16),
       drop=PROB, late=st.integers(0, 10))
def test_rc_sends_with_late_receives(sizes: list[int], seed: int, drop: float, late: int) -> None:
    """RNR NAKs mixed with loss in both directions: still exactly once, in order."""
    rng = random.Random(seed)
    a, b = connect(mtu=256, timeout=6, retry_cnt=7, rnr_retry=7, min_rnr_timer=1)
    w = Wire(a, b, fault=lambda p, who: [] if rng.random() < drop else [p], rng=rng)
    bufs = []
    for i, n in enumerate(sizes):
        src = a.mem.register(max(n, 1))
        src.buf[:n] = data(n, i)
        a.core.post_send(send_wr(WrType.SEND, src, n, wr_id=i))
        dst = b.mem.register(max(n, 1))
        bufs.append(dst)
    for i, dst in enumerate(bufs[:late]):
        b.post_recv(dst, wr_id=i)
    w.run(max_time=0.002)
    for i, dst in enumerate(bufs[late:], start=late):
        b.post_recv(dst, wr_id=i)
    w.run(max_time=1000.0)
    assert [(c.wr_id, c.status) for c in a.send_wcs] == [
        (i, WcStatus.SUCCESS) for i in range(len(sizes))]
    assert [(c.wr_id, c.length) for c in b.recv_wcs] == list(enumerate(sizes))
    for i, (dst, n) in enumerate(zip(bufs, sizes, strict=True)):
        assert bytes(dst.buf[:n]) == data(n, i)
    if late < len(sizes) and drop == 0:  # the message without a receive met an RNR NAK
        assert b.counters.send_rnr_err >= 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(1, 1200), min_size=1, max_size=12), seed=st.integers(0, 2**16),
       drop=PROB)
def test_uc_whole_messages_or_nothing(sizes: list[int], seed: int, drop: float) -> None:
    """UC under loss: a receive completes only with a whole, intact message."""
    rng = random.Random(seed)
    a, b = connect(QpType.UC, mtu=256)
    w = Wire(a, b, fault=lambda p, who: [] if rng.random() < drop else [p], rng=rng)
    dst = [b.mem.register(1200) for _ in sizes]
    for i, d in enumerate(dst):
        b.post_recv(d, wr_id=i)
    for i, n in enumerate(sizes):
        src = a.mem.register(n)
        src.buf[:] = data(n, i)
        a.core.post_send(send_wr(WrType.SEND, src, wr_id=i))
    w.run()
    assert [(c.wr_id, c.status) for c in a.send_wcs] == [
        (i, WcStatus.SUCCESS) for i in range(len(sizes))]
    # receive WQEs are used in order; a WQE may be reused after a dropped message
    for k, wc in enumerate(b.recv_wcs):
        assert wc.status is WcStatus.SUCCESS and wc.wr_id == k
        got = bytes(dst[k].buf[: wc.length])
        assert any(got == data(n, j) for j, n in enumerate(sizes) if n == wc.length)
    if drop == 0:
        assert len(b.recv_wcs) == len(sizes)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, back=OPS, seed=st.integers(0, 2**16), drop=PROB, dup=PROB, reorder=PROB)
def test_rc_both_directions(
    ops: list[tuple[str, int]], back: list[tuple[str, int]], seed: int, drop: float,
    dup: float, reorder: float,
) -> None:
    """Each QP is requester and responder at once: responses and requests interleave."""
    rng = random.Random(seed)

    def fault(pkt: Packet, who: str) -> list[Packet]:
        if rng.random() < drop:
            return []
        return [pkt, pkt.copy()] if rng.random() < dup else [pkt]

    a, b = connect(mtu=256, timeout=6, retry_cnt=7, rnr_retry=7, min_rnr_timer=1, depth=2)
    w = Wire(a, b, fault=fault, rng=rng, reorder=reorder, codec=True)
    expected = []
    for req, resp, work, tag in ((a, b, ops, 0), (b, a, back, 500)):
        counter = resp.mem.register(8)
        total = 0
        for i, (op, n) in enumerate(work):
            src = req.mem.register(max(n, 8))
            src.buf[:n] = data(n, i + tag)
            if op in ("send", "write_imm"):
                dst = resp.mem.register(max(n, 1))
                if op == "send":
                    resp.post_recv(dst, n, wr_id=i + tag)
                    req.core.post_send(send_wr(WrType.SEND, src, n, wr_id=i + tag))
                else:
                    resp.post_recv(resp.mem.register(1), 0, wr_id=i + tag)
                    req.core.post_send(send_wr(WrType.RDMA_WRITE, src, n, remote=dst,
                                               wr_id=i + tag, imm=i))
                expected.append((dst, data(n, i + tag)))
            elif op == "write":
                dst = resp.mem.register(max(n, 1))
                req.core.post_send(send_wr(WrType.RDMA_WRITE, src, n, remote=dst, wr_id=i + tag))
                expected.append((dst, data(n, i + tag)))
            elif op == "read":
                remote = resp.mem.register(max(n, 1))
                remote.buf[:n] = data(n, i + tag + 1000)
                local = req.mem.register(max(n, 1))
                req.core.post_send(send_wr(WrType.RDMA_READ, local, n, remote=remote,
                                           wr_id=i + tag))
                expected.append((local, data(n, i + tag + 1000)))
            else:
                req.core.post_send(send_wr(WrType.FETCH_ADD, src, 8, remote=counter,
                                           compare_add=1, wr_id=i + tag))
                total += 1
        expected.append((counter, total.to_bytes(8, "little")))
    w.run(max_time=1000.0)
    assert [(c.wr_id, c.status) for c in a.send_wcs] == [
        (i, WcStatus.SUCCESS) for i in range(len(ops))]
    assert [(c.wr_id, c.status) for c in b.send_wcs] == [
        (i + 500, WcStatus.SUCCESS) for i in range(len(back))]
    for region, want in expected:
        assert bytes(region.buf[: len(want)]) == want
