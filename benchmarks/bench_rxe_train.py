"""The rxe send path, packet by packet vs in trains: CPU per packet from WR to ``sendmmsg``.

A UC QP (no ACKs to wait for) posts RDMA WRITEs of 64 KiB (MTU 4096: FIRST,
14 MIDDLE, LAST) and of 8 bytes; its requester's output goes to a
``DeviceIO`` on 127.0.0.156 (to 127.0.0.157, where nothing listens), either
as ``QpCore.poll`` + ``DeviceIO.send`` per packet or as
``QpCore.poll_trains`` + ``DeviceIO.send_train`` per run of MIDDLE packets,
the two alternating in one process (each first in every other round).  Reported: process CPU
per packet, median over the rounds, and the ratio.

    python3 benchmarks/bench_rxe_train.py [--rounds 9] [--msgs 200]

Run as root (raw sockets).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_rxe_core import KEY, VADDR, Memory, NoRecv

from ibal.providers.rxe.io import DeviceIO
from ibal.transport.core import QpCore
from ibal.transport.qp import QpConfig
from ibal.types import QpState, QpType, SendOpt, SendWr, Sge, WrType
from ibal.wire.packet import Train

SRC = ipaddress.ip_address("127.0.0.156")
DST = bytes([127, 0, 0, 157])


def sender(size: int) -> QpCore:
    cfg = QpConfig(0x11, QpType.UC)
    cfg.dest_qpn = 0x22
    cfg.mtu = 4096
    cfg.src_ip = SRC.packed
    cfg.dst_ip = DST
    cfg.src_port = 0xC000
    core = QpCore(cfg, Memory(size), NoRecv())
    for s in (QpState.INIT, QpState.RTR, QpState.RTS):
        core.set_state(s)
    return core


def send_all(core: QpCore, dev: DeviceIO, wr: SendWr, msgs: int, trains: bool) -> int:
    """Post ``msgs`` WRs and send what they make; the packets sent."""
    pkts = 0
    for _ in range(msgs):
        core.post_send(wr)
        while True:
            if trains:
                items, n = core.poll_trains(0.0)
                for it in items:
                    if isinstance(it, Train):
                        dev.send_train(it, DST, 0xC000)
                    else:
                        dev.send(it, DST, 0xC000)
            else:
                out = core.poll(0.0)
                n = len(out)
                for p in out:
                    dev.send(p, DST, 0xC000)
            pkts += n
            if n < 64:
                break
        dev.flush()
        core.out.send_wcs.clear()
    return pkts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--msgs", type=int, default=200)
    args = ap.parse_args()
    with DeviceIO(lambda pkts: None, port=47915) as dev:
        dev.add_address(SRC)
        for size in (65536, 8):
            core = sender(size)
            wr = SendWr(0, WrType.RDMA_WRITE, (Sge(VADDR, size, KEY),), SendOpt.NONE,
                        remote_addr=VADDR, rkey=KEY)
            send_all(core, dev, wr, 20, True)
            send_all(core, dev, wr, 20, False)
            per: dict[bool, list[float]] = {False: [], True: []}
            msgs = args.msgs if size > 4096 else args.msgs * 16
            for r in range(args.rounds):
                # which goes first alternates: a round's first half ran slower in the guest
                for trains in ((False, True) if r % 2 else (True, False)):
                    t = time.process_time()
                    n = send_all(core, dev, wr, msgs, trains)
                    per[trains].append((time.process_time() - t) / n * 1e6)
            p, t = statistics.median(per[False]), statistics.median(per[True])
            print(f"WRITE {size:>6} B: packets {p:6.2f} us/pkt, trains {t:6.2f} us/pkt, "
                  f"ratio {p / t:.2f}x")


if __name__ == "__main__":
    main()
