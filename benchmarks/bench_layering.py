"""The cost of the layering: verbs per second through the access layer vs. the provider.

Both sides drive the same provider (``mock`` by default) with the same work,
in one run: an RC QP pair on one CA, 8-byte RDMA WRITEs posted in windows and
polled in batches, plus single verbs (``query_cq``, ``peek_cq``).  The direct
side uses only the provider contract (``ibal.ci``), as a provider author would.

    python benchmarks/bench_layering.py [--provider mock] [--seconds 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from ibal.al import AlManager, Endpoint, QpCreate
from ibal.al.connect import path_to
from ibal.ci import ChannelInterface, ProviderManager
from ibal.demo import ACCESS
from ibal.types import (
    CaAttr,
    Mtu,
    PdType,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    SendOpt,
    SendWr,
    Sge,
    WrType,
)

WINDOW = 32


class Collector:
    """A minimal CaRegistrar: keeps the CAs a provider registers."""

    def __init__(self) -> None:
        self.cas: list[ChannelInterface] = []

    def register_ca(self, ci: ChannelInterface) -> None:
        self.cas.append(ci)

    def deregister_ca(self, guid: int) -> None:
        self.cas = [c for c in self.cas if c.guid != guid]


def rc_mods(attr: CaAttr, remote_qpn: int) -> list[QpMod]:
    port = attr.ports[0]
    return [
        QpMod(QpState.INIT, pkey_index=0, port_num=port.port_num, access=ACCESS),
        QpMod(
            QpState.RTR,
            primary_av=path_to(port, Endpoint(qpn=remote_qpn, psn=0, lid=port.lid)),
            path_mtu=Mtu.MTU_1024,
            dest_qp=remote_qpn,
            rq_psn=0,
            resp_res=4,
            rnr_nak_timeout=1,
        ),
        QpMod(
            QpState.RTS, sq_psn=0, local_ack_timeout=14, retry_cnt=7, rnr_retry_cnt=7, init_depth=4
        ),
    ]


Ops = dict[str, Callable[[], int]]


def rate(fn: Callable[[], int], seconds: float) -> float:
    """Operations per second of ``fn`` (which returns how many it did)."""
    done = 0
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        done += fn()
    return done / (time.perf_counter() - start)


def direct(provider: str, options: dict[str, Any]) -> tuple[Ops, Callable[[], None]]:
    """The workload on the provider's ChannelInterface, as a provider author calls it."""
    reg = Collector()
    prov = ProviderManager().create(provider, options)
    prov.start(reg)
    ci = reg.cas[0]
    h_ca = ci.open_ca(lambda ctx: None, lambda rec: None, None)
    attr = ci.query_ca(h_ca)
    h_pd = ci.allocate_pd(h_ca, PdType.NORMAL)
    h_cq, _ = ci.create_cq(h_ca, 4 * WINDOW, "cq")
    caps = QpCaps(sq_depth=2 * WINDOW, rq_depth=4)
    a = ci.create_qp(h_pd, QpType.RC, caps, h_cq, h_cq, None, True, "a")
    b = ci.create_qp(h_pd, QpType.RC, caps, h_cq, h_cq, None, True, "b")
    for mod in rc_mods(attr, b.attr.qp_num):
        ci.modify_qp(a.handle, mod)
    for mod in rc_mods(attr, a.attr.qp_num):
        ci.modify_qp(b.handle, mod)
    buf = bytearray(4096)
    keys = ci.register_mr(h_pd, memoryview(buf), _address(buf), ACCESS)
    wrs = [
        SendWr(
            wr_id=i,
            opcode=WrType.RDMA_WRITE,
            sg_list=[Sge(keys.vaddr, 8, keys.lkey)],
            send_opt=SendOpt.SIGNALED,
            remote_addr=keys.vaddr + 2048,
            rkey=keys.rkey,
        )
        for i in range(WINDOW)
    ]

    def writes() -> int:
        ci.post_send(a.handle, wrs)
        got = 0
        while got < WINDOW:
            got += len(ci.poll_cq(h_cq, WINDOW))
        return WINDOW

    def single_post() -> int:
        ci.post_send(a.handle, wrs[:1])
        while not ci.poll_cq(h_cq, 1):
            pass
        return 1

    def query() -> int:
        ci.query_cq(h_cq)
        return 1

    def cleanup() -> None:
        ci.deregister_mr(keys.handle)
        ci.destroy_qp(a.handle)
        ci.destroy_qp(b.handle)
        ci.destroy_cq(h_cq)
        ci.deallocate_pd(h_pd)
        ci.close_ca(h_ca)
        prov.stop()

    return {OPS[0]: writes, OPS[1]: single_post, OPS[2]: query}, cleanup


def _address(buf: bytearray) -> int:
    import ctypes

    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def through_al(provider: str, options: dict[str, Any]) -> tuple[Ops, Callable[[], None]]:
    """The same workload through the access layer's public API."""
    mgr = AlManager()
    mgr.start_provider(provider, options)
    al = mgr.open_al()
    ca = al.open_ca(al.get_ca_guids()[0])
    attr = ca.query()
    pd = ca.alloc_pd()
    cq = ca.create_cq(4 * WINDOW)
    create = QpCreate(QpType.RC, send_cq=cq, recv_cq=cq, sq_depth=2 * WINDOW, rq_depth=4)
    a, b = pd.create_qp(create), pd.create_qp(create)
    for mod in rc_mods(attr, b.num):
        a.modify(mod)
    for mod in rc_mods(attr, a.num):
        b.modify(mod)
    buf = bytearray(4096)
    mr = pd.reg_mem(buf, ACCESS)
    wrs = [
        SendWr(
            wr_id=i,
            opcode=WrType.RDMA_WRITE,
            sg_list=[mr.sge(0, 8)],
            send_opt=SendOpt.SIGNALED,
            remote_addr=mr.vaddr + 2048,
            rkey=mr.rkey,
        )
        for i in range(WINDOW)
    ]

    def writes() -> int:
        a.post_send(wrs)
        got = 0
        while got < WINDOW:
            got += len(cq.poll(WINDOW))
        return WINDOW

    def single_post() -> int:
        a.post_send(wrs[:1])
        while not cq.poll(1):
            pass
        return 1

    def query() -> int:
        cq.query()
        return 1

    def cleanup() -> None:
        al.close()
        mgr.close()

    return {OPS[0]: writes, OPS[1]: single_post, OPS[2]: query}, cleanup


OPS = (
    "RDMA WRITE 8 B, window 32 (msg/s)",
    "post_send + poll_cq, 1 WR (pairs/s)",
    "query_cq (calls/s)",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", default="mock")
    parser.add_argument("--seconds", type=float, default=0.5, help="per measurement")
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds; median kept")
    args = parser.parse_args()
    options: dict[str, Any] = {"cas": 1} if args.provider == "mock" else {}
    low_ops, low_done = direct(args.provider, options)
    high_ops, high_done = through_al(args.provider, options)
    try:
        print(f"provider: {args.provider}; median of {args.rounds} alternating rounds")
        print(f"{'operation':<40} {'direct':>12} {'through AL':>12} {'AL/direct':>10}")
        for name in OPS:
            # Alternate the two sides so drift in machine load hits both alike.
            lows, highs = [], []
            for _ in range(args.rounds):
                lows.append(rate(low_ops[name], args.seconds))
                highs.append(rate(high_ops[name], args.seconds))
            lo, hi = statistics.median(lows), statistics.median(highs)
            print(f"{name:<40} {lo:>12,.0f} {hi:>12,.0f} {hi / lo:>10.2f}")
    finally:
        high_done()
        low_done()


if __name__ == "__main__":
    main()
