"""Property: over a lossy, duplicating, reordering wire, RC delivers every WR exactly once."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rxeharness import Wire, connect, send_wr

from ibal.providers.rxe.packet import Packet
from ibal.transport.psn import PSN_MASK
from ibal.types import WcStatus, WrType

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
    w = Wire(a, b, fault=fault, rng=rng, reorder=reorder)
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
