"""The rxe socket layer's throughput: 4 KiB RoCEv2 packets between two devices on lo.

A sender process pushes RDMA WRITE MIDDLE packets (4096-byte payload, full
encode with ICRC) from a device on 127.0.0.2 to a device on 127.0.0.3 in
this process, whose receive thread decodes and checks every ICRC.  Reported:
packets/s and MB/s of payload that arrived intact, the datagrams per receive
system call, and the same for a baseline of one plain ``sendto``/``recv``
per datagram without the codec (what per-packet system calls allow).

    python3 benchmarks/bench_rxe_io.py [--seconds 3] [--mode raw|udp|both]

Run as root (raw sockets).  In the lab guest with two CPUs:
``ibal lab run --cpus 2 -- python3 benchmarks/bench_rxe_io.py``.
"""

from __future__ import annotations

import argparse
import ipaddress
import multiprocessing as mp
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ibal.providers.rxe.io import DeviceIO, RxMode
from ibal.providers.rxe.packet import Opcode, Packet

A = ipaddress.ip_address("127.0.0.2")
B = ipaddress.ip_address("127.0.0.3")
PAYLOAD = 4096


def _sender(mode: RxMode, seconds: float, ready: threading.Event | None, go: object) -> None:
    dev = DeviceIO(lambda _p: None, rx_mode=mode, name="tx")
    dev.add_address(A)
    data = bytearray(os.urandom(PAYLOAD))
    p = Packet(Opcode.RC_RDMA_WRITE_MIDDLE, 0x12, 0, memoryview(data))
    end = time.perf_counter() + seconds
    psn = 0
    while time.perf_counter() < end:
        for _ in range(64):
            p.psn = psn = (psn + 1) & 0xFFFFFF
            dev.send(p, B.packed, 0xC000 + (psn & 0x3FFF))
        dev.flush()
    dev.close()


def bench_device(mode: RxMode, seconds: float) -> dict[str, float]:
    count = [0, 0.0, 0.0]  # packets, first time, last time

    def on_packets(pkts: list[Packet]) -> None:
        now = time.perf_counter()
        if not count[0]:
            count[1] = now
        count[0] += len(pkts)
        count[2] = now

    rx = DeviceIO(on_packets, rx_mode=mode, name="rx")
    rx.add_address(B)
    proc = mp.get_context("fork").Process(target=_sender, args=(mode, seconds, None, None))
    proc.start()
    proc.join()
    time.sleep(0.2)  # let the receive thread finish the backlog (a benchmark, not a test)
    rx.close()
    n, t0, t1 = count
    c = rx.counters
    dt = max(t1 - t0, 1e-9)
    return {
        "pps": n / dt,
        "MBps": n * PAYLOAD / dt / 1e6,
        "per_recv_call": c.rx_datagrams / max(c.rx_batches, 1),
        "bad": float(c.dropped),
    }


def _plain_sender(seconds: float) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((str(A), 0))
    buf = os.urandom(PAYLOAD + 36)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(64):
            s.sendto(buf, (str(B), 4791))
    s.close()


def bench_plain(seconds: float) -> dict[str, float]:
    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    r.bind((str(B), 4791))
    r.settimeout(0.5)
    proc = mp.get_context("fork").Process(target=_plain_sender, args=(seconds,))
    proc.start()
    buf = bytearray(65536)
    n = 0
    t0 = t1 = 0.0
    while True:
        try:
            r.recv_into(buf)
        except TimeoutError:
            if not proc.is_alive():
                break
            continue
        t1 = time.perf_counter()
        if not n:
            t0 = t1
        n += 1
    proc.join()
    r.close()
    dt = max(t1 - t0, 1e-9)
    return {"pps": n / dt, "MBps": n * PAYLOAD / dt / 1e6, "per_recv_call": 1.0, "bad": 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--mode", choices=("raw", "udp", "both"), default="both")
    args = ap.parse_args()
    rows = [("plain sendto/recv, 1 per call", bench_plain(args.seconds))]
    for mode in ("raw", "udp") if args.mode == "both" else (args.mode,):
        rows.append((f"DeviceIO rx={mode}, codec + ICRC", bench_device(mode, args.seconds)))  # type: ignore[arg-type]
    base = rows[0][1]["MBps"]
    print(f"{'what':40} {'kpps':>8} {'MB/s':>8} {'x plain':>8} {'dgrams/recv':>12} {'dropped':>8}")
    for name, r in rows:
        print(
            f"{name:40} {r['pps'] / 1e3:8.1f} {r['MBps']:8.1f} {r['MBps'] / base:8.2f}"
            f" {r['per_recv_call']:12.1f} {r['bad']:8.0f}"
        )


if __name__ == "__main__":
    main()
