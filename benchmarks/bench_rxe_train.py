"""The rxe send path, packet by packet, in trains, and whole WQEs in C: CPU per packet
from WR to ``sendmmsg``.

A UC QP (no ACKs to wait for) posts RDMA WRITEs of 64 KiB (MTU 4096: FIRST,
14 MIDDLE, LAST) and of 8 bytes; its requester's output goes to a
``DeviceIO`` on 127.0.0.156 (to 127.0.0.157, where nothing listens), as
``QpCore.poll`` + ``DeviceIO.send`` per packet ("packets"), as
``QpCore.poll_trains`` + ``DeviceIO.send_train`` per run of MIDDLE packets
("trains"), both on the Python engine, then on the C engine in trains
(``rxe_fill_train``) and as whole-WQE runs (``poll_trains(runs=True)`` +
``DeviceIO.send_run``, ``rxe_fill_wqe``), the modes rotating in one process
(each first in turn).  Reported: process CPU per packet, median over the
rounds, and each mode's ratio to "packets".

    python3 benchmarks/bench_rxe_train.py [--rounds 9] [--msgs 200]

Run as root (raw sockets).  Without the compiled engine only the Python modes run.
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

from ibal.providers.rxe import fastpath
from ibal.providers.rxe.io import DeviceIO
from ibal.transport.core import QpCore
from ibal.transport.qp import QpConfig
from ibal.types import QpState, QpType, SendOpt, SendWr, Sge, WrType
from ibal.wire.packet import Train, WqeRun

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


def send_all(core: QpCore, dev: DeviceIO, wr: SendWr, msgs: int, mode: str) -> int:
    """Post ``msgs`` WRs and send what they make (``mode``: packets, trains, runs);
    the packets sent."""
    pkts = 0
    trains = mode != "packets"
    runs = mode == "runs"
    for _ in range(msgs):
        core.post_send(wr)
        while True:
            if trains:
                items, n = core.poll_trains(0.0, runs=runs)
                for it in items:
                    if isinstance(it, WqeRun):
                        dev.send_run(it, DST, 0xC000)
                    elif isinstance(it, Train):
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
    modes = [("python", "packets"), ("python", "trains")]
    if fastpath.compiled() is not None:
        modes += [("c", "trains"), ("c", "runs")]
    devs = {e: DeviceIO(lambda pkts: None, port=47915 + k, engine=e)  # type: ignore[arg-type]
            for k, e in enumerate(sorted({e for e, _ in modes}))}
    try:
        for dev in devs.values():
            dev.add_address(SRC)
        for size in (65536, 8):
            core = sender(size)
            wr = SendWr(0, WrType.RDMA_WRITE, (Sge(VADDR, size, KEY),), SendOpt.NONE,
                        remote_addr=VADDR, rkey=KEY)
            for e, mode in modes:
                send_all(core, devs[e], wr, 20, mode)
            per: dict[tuple[str, str], list[float]] = {m: [] for m in modes}
            msgs = args.msgs if size > 4096 else args.msgs * 16
            for r in range(args.rounds):
                # the order rotates: a round's first part ran slower in the guest
                for e, mode in modes[r % len(modes):] + modes[: r % len(modes)]:
                    t = time.process_time()
                    n = send_all(core, devs[e], wr, msgs, mode)
                    per[(e, mode)].append((time.process_time() - t) / n * 1e6)
            base = statistics.median(per[modes[0]])
            row = ", ".join(f"{e} {mode} {statistics.median(v):6.2f} us/pkt "
                            f"({base / statistics.median(v):.2f}x)" for (e, mode), v in per.items())
            print(f"WRITE {size:>6} B: {row}")
    finally:
        for dev in devs.values():
            dev.close()


if __name__ == "__main__":
    main()
