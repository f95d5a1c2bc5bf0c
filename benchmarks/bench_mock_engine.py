"""The mock's message engine vs the packet core (``ibal.transport``), per RC message.

Both run one RC QP pair at MTU 4096, one message at a time, to its completion
(SEND also posts and completes its receive): the mock through its
``ChannelInterface`` on the manual clock (delivery inside ``post_send``, so the
cost is the verb, the fabric's routing and its engine), the core as two
``QpCore`` objects whose packets (``ibal.wire.packet.Packet`` records, never
encoded) go straight to the peer, with a plain memory table.  The ratio says
what driving the mock's data path through the packet core would cost at least
(the mock's verbs, fabric and faults come on top of the core's figure).

    python benchmarks/bench_mock_engine.py [--seconds 1]
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from collections.abc import Callable, Sequence

from bench_rxe_core import VADDR as CORE_VADDR
from bench_rxe_core import Memory  # one region, keys unchecked: the core's cost alone

from ibal.providers.mock import MockFabric
from ibal.transport.core import QpCore
from ibal.transport.qp import QpConfig
from ibal.types import (
    AccessFlags,
    AvAttr,
    Mtu,
    PdType,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    Sge,
    WcStatus,
    WrType,
)

BIG = 65536
SIZES = (8, BIG)
OPS = (WrType.SEND, WrType.RDMA_WRITE, WrType.RDMA_READ)
VADDR = CORE_VADDR  # where bench_rxe_core's Memory maps its region
ACCESS = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ
QP_ACCESS = AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ


def timed(step: Callable[[], None], seconds: float) -> float:
    """Microseconds per call of ``step`` over about ``seconds``."""
    for _ in range(20):
        step()
    n = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while True:
        for _ in range(50):
            step()
        n += 50
        t = time.perf_counter()
        if t > end:
            return (t - t0) / n * 1e6


# ------------------------------------------------------------------------ mock
def mock_step(op: WrType, size: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """One message on a mock RC pair, and the fabric's close."""
    fabric = MockFabric(seed=0)
    cas = [fabric.add_ca(), fabric.add_ca()]
    fabric.manual_clock()
    nodes = []
    for ca in cas:
        h = ca.open_ca(lambda _cq: None, lambda _ev: None, None)
        pd = ca.allocate_pd(h, PdType.NORMAL)
        cq, _ = ca.create_cq(h, 256, None)
        mr = ca.register_mr(pd, memoryview(bytearray(2 * BIG)), VADDR, ACCESS)
        qp = ca.create_qp(pd, QpType.RC, QpCaps(32, 32, 1, 1, 0), cq, cq, None, True, None)
        nodes.append((ca, cq, mr, qp.handle))
    for (ca, _, _, qp), (peer, _, _, pqp) in ((nodes[0], nodes[1]), (nodes[1], nodes[0])):
        ca.modify_qp(qp, QpMod(QpState.INIT, pkey_index=0, port_num=1, access=QP_ACCESS))
        ca.modify_qp(qp, QpMod(QpState.RTR, primary_av=AvAttr(1, dlid=peer.ports[0].lid),
                               path_mtu=Mtu.MTU_4096, dest_qp=pqp.num, rq_psn=0, resp_res=1,
                               rnr_nak_timeout=1))
        ca.modify_qp(qp, QpMod(QpState.RTS, sq_psn=0, init_depth=1, local_ack_timeout=14,
                               retry_cnt=7, rnr_retry_cnt=7))
    (a, acq, amr, aqp), (b, bcq, bmr, bqp) = nodes
    wr = SendWr(1, op, (Sge(VADDR, size, amr.lkey),), SendOpt.SIGNALED,
                remote_addr=VADDR + BIG, rkey=bmr.rkey)
    rwr = RecvWr(2, (Sge(VADDR, size, bmr.lkey),))
    send = op is WrType.SEND

    def step() -> None:
        if send:
            b.post_recv(bqp, (rwr,))
        a.post_send(aqp, (wr,))
        wcs = a.poll_cq(acq, 4)
        if len(wcs) != 1 or wcs[0].status is not WcStatus.SUCCESS:
            raise RuntimeError(f"mock {op.name} {size}: {wcs}")
        if send and len(b.poll_cq(bcq, 4)) != 1:
            raise RuntimeError("mock: no receive completion")

    return step, fabric.close


# ------------------------------------------------------------------------ core
class Recvs:
    """A receive queue."""

    def __init__(self) -> None:
        self.q: deque[tuple[int, Sequence[Sge]]] = deque()

    def take(self) -> tuple[int, Sequence[Sge]] | None:
        return self.q.popleft() if self.q else None

    def drain(self) -> list[int]:
        out = [wr_id for wr_id, _ in self.q]
        self.q.clear()
        return out


def core_step(op: WrType, size: int) -> Callable[[], None]:
    """One message between two cores, packets handed over as records."""
    cores = []
    for qpn, peer in ((0x11, 0x22), (0x22, 0x11)):
        cfg = QpConfig(qpn, QpType.RC)
        cfg.dest_qpn = peer
        cfg.mtu = 4096
        cfg.access = int(QP_ACCESS)
        core = QpCore(cfg, Memory(2 * BIG), Recvs())
        for s in (QpState.INIT, QpState.RTR, QpState.RTS):
            core.set_state(s)
        cores.append(core)
    a, b = cores
    rq = b.rq
    assert isinstance(rq, Recvs)
    wr = SendWr(1, op, (Sge(VADDR, size, 1),), SendOpt.SIGNALED, remote_addr=VADDR + BIG,
                rkey=2)
    rsges = (Sge(VADDR, size, 3),)
    send = op is WrType.SEND

    def step() -> None:
        if send:
            rq.q.append((2, rsges))
        a.post_send(wr)
        swcs = a.out.send_wcs
        while not swcs:
            for p in a.poll(0.0, 256):
                b.receive(p, 0.0)
            for p in b.poll(0.0, 256):
                a.receive(p, 0.0)
        if len(swcs) != 1 or swcs[0].status is not WcStatus.SUCCESS:
            raise RuntimeError(f"core {op.name} {size}: {swcs}")
        swcs.clear()
        if send:
            if len(b.out.recv_wcs) != 1:
                raise RuntimeError("core: no receive completion")
            b.out.recv_wcs.clear()

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    print(f"{'op':<10} {'bytes':>6} {'mock us/msg':>12} {'core us/msg':>12} {'core/mock':>9}")
    for op in OPS:
        for size in SIZES:
            step, close = mock_step(op, size)
            try:
                m = timed(step, args.seconds)
            finally:
                close()
            c = timed(core_step(op, size), args.seconds)
            print(f"{op.name:<10} {size:>6} {m:>12.1f} {c:>12.1f} {c / m:>9.2f}")


if __name__ == "__main__":
    main()
