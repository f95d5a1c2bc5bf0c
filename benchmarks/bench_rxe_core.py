"""The rxe transport core alone: packets per second through two cores back to back.

No codec and no sockets: the requester's packets go straight into the peer's
``receive`` and the responses back, so this is the core's share of the per-packet
budget (compare with ``bench_wire.py`` for the codec's share).  Two loads:
64 KiB RDMA WRITEs at MTU 4096 (16 packets each, one ACK) and 8-byte WRITEs
(one packet, one ACK each), both with 32 WRs in flight.

    python benchmarks/bench_rxe_core.py [--seconds 2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from ibal.transport.core import QpCore
from ibal.transport.qp import QpConfig
from ibal.types import AccessFlags, QpState, QpType, SendOpt, SendWr, Sge, WrType

WINDOW = 32
VADDR = 0x100000
KEY = 7


class Memory:
    """One region, keys unchecked beyond the range: the core's cost, not a table's."""

    def __init__(self, size: int) -> None:
        self.buf = memoryview(bytearray(size))

    def local(self, lkey: int, addr: int, length: int, write: bool) -> memoryview | None:
        off = addr - VADDR
        return self.buf[off : off + length]

    def recv(self, lkey: int, addr: int, length: int) -> memoryview | None:
        return self.local(lkey, addr, length, True)

    def remote(self, rkey: int, va: int, length: int, access: int) -> memoryview | None:
        return self.local(rkey, va, length, True)

    def invalidate(self, rkey: int) -> bool:
        return False


class NoRecv:
    def take(self) -> tuple[int, Sequence[Sge]] | None:
        return None

    def drain(self) -> list[int]:
        return []


def pair(size: int) -> tuple[QpCore, QpCore]:
    cores = []
    for qpn, peer in ((0x11, 0x22), (0x22, 0x11)):
        cfg = QpConfig(qpn, QpType.RC)
        cfg.dest_qpn = peer
        cfg.mtu = 4096
        cfg.access = int(AccessFlags.RDMA_WRITE | AccessFlags.LOCAL_WRITE)
        core = QpCore(cfg, Memory(size), NoRecv())
        for s in (QpState.INIT, QpState.RTR, QpState.RTS):
            core.set_state(s)
        cores.append(core)
    return cores[0], cores[1]


def run(msg: int, seconds: float) -> tuple[float, float]:
    """(messages per second, packets per second) for WRITEs of ``msg`` bytes."""
    a, b = pair(msg)
    wr = SendWr(0, WrType.RDMA_WRITE, (Sge(VADDR, msg, KEY),), SendOpt.SIGNALED,
                remote_addr=VADDR, rkey=KEY)
    done = pkts = 0
    posted = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    now = 0.0
    while True:
        while posted - done < WINDOW:
            a.post_send(wr)
            posted += 1
        out = a.poll(now, 256)
        pkts += len(out)
        for p in out:
            b.receive(p, now)
        for p in b.poll(now, 256):
            pkts += 1
            a.receive(p, now)
        wcs = a.out.send_wcs
        done += len(wcs)
        wcs.clear()
        if done and done % 64 == 0 and time.perf_counter() > end:
            break
    dt = time.perf_counter() - t0
    return done / dt, pkts / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    for msg in (65536, 8):
        rate, pps = run(msg, args.seconds)
        gbit = rate * msg * 8 / 1e9
        print(f"WRITE {msg:>6} B: {rate:>10,.0f} msg/s {pps:>10,.0f} pkt/s {gbit:6.2f} Gbit/s")


if __name__ == "__main__":
    main()
