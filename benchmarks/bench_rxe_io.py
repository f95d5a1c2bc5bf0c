"""The rxe socket layer's throughput: 4 KiB RoCEv2 packets between two devices on lo.

A sender process pushes RDMA WRITE MIDDLE packets (4096-byte payload, full
encode with ICRC) from a device on 127.0.0.2 to a device on 127.0.0.3 in
this process, whose receive thread decodes and checks every ICRC.  Reported:
packets/s and MB/s of payload that arrived intact, the datagrams per receive
system call, and the same for a baseline of one plain ``sendto``/``recv``
per datagram without the codec (what per-packet system calls allow).

    python3 benchmarks/bench_rxe_io.py [--seconds 3] [--mode raw|udp|both] [--compiled] [--veth]

``--compiled``: the bytes-only ceiling in C (``ibal.providers.rxe.fastpath``,
cffi): a UDP GSO send of 15 RDMA WRITE MIDDLE packets per ``sendmsg``
(``UDP_SEGMENT``; each packet's ICRC over the IP ID its segment leaves with),
received by raw ``recvmmsg`` or by a UDP socket with GRO, every ICRC checked
and each payload copied once into a registered buffer; one call into C per
send and per receive batch.  ``--veth``: the compiled rows again between two
network namespaces joined by a veth pair (MTU 9000), so the datagrams cross
the IP/UDP stack of two hosts instead of one ``lo``.

Run as root (raw sockets).  In the lab guest with two CPUs:
``ibal lab run --cpus 2 -- python3 benchmarks/bench_rxe_io.py``.
"""

from __future__ import annotations

import argparse
import ipaddress
import multiprocessing as mp
import os
import select
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ibal.netns import setns
from ibal.providers.rxe import fastpath, io, mmsg
from ibal.providers.rxe.io import DeviceIO, RxMode
from ibal.wire import iba
from ibal.wire.packet import Opcode, Packet

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


def _raw_sender(kind: str, seconds: float) -> None:
    """Datagrams of PAYLOAD + 36 bytes without the codec: what the system calls cost."""
    size = PAYLOAD + 36
    batch = mmsg.SendBatch(64, slot=65536)
    body = bytes(size)
    if kind == "raw":
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
        s.bind((str(A), 0))
        io.attach_filter(s, io.DROP_ALL)
        name = mmsg.sockaddr(B.packed, 0)
        udp = struct.pack(">HHHH", 0xC000, 4791, 8 + size, 0)
        parts: tuple[bytes, ...] = (udp, body)
        gso = 0
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((str(A), 0))
        name = mmsg.sockaddr(B.packed, 4791)
        gso = size if kind == "gso" else 0
        parts = (body * 15,) if gso else (body,)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(4 if gso else 64):
            batch.add(name, parts, gso)
        batch.send(s.fileno())
    s.close()


def bench_syscalls(kind: str, rx: str, seconds: float) -> dict[str, float]:
    """Bytes only: ``kind`` raw|udp|gso sender, ``rx`` raw|udp|gro receiver (recvmmsg)."""
    if rx == "raw":
        r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
        r.bind((str(B), 0))
        io.attach_filter(r, io.roce_ipv4_filter())
        keep = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        keep.bind((str(B), 4791))
        io.attach_filter(keep, io.DROP_ALL)
    else:
        r = keep = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        r.bind((str(B), 4791))
        if rx == "gro":
            r.setsockopt(mmsg.SOL_UDP, mmsg.UDP_GRO, 1)
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    ring = mmsg.RecvRing(64, 65536)
    proc = mp.get_context("fork").Process(target=_raw_sender, args=(kind, seconds))
    proc.start()
    n = calls = 0
    t0 = t1 = 0.0
    size = PAYLOAD + 36
    poller = select.poll()
    poller.register(r.fileno(), select.POLLIN)
    while True:
        if not poller.poll(500):
            if not proc.is_alive():
                break
            continue
        k = ring.recv(r.fileno())
        if not k:
            continue
        calls += 1
        t1 = time.perf_counter()
        if not n:
            t0 = t1
        for i in range(k):
            n += max(ring.length(i) // size, 1)
    proc.join()
    r.close()
    keep.close()
    dt = max(t1 - t0, 1e-9)
    return {
        "pps": n / dt,
        "MBps": n * PAYLOAD / dt / 1e6,
        "per_recv_call": n / max(calls, 1),
        "bad": 0.0,
    }


TRAIN = 15  # 15 x 4112-byte segments: the most one UDP send may carry (65,507 bytes)
NS = ("ibalbench0", "ibalbench1")
VETH = ("10.77.0.1", "10.77.0.2")


def _enter(ns: str | None) -> None:
    if ns:
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            setns(fd)
        finally:
            os.close(fd)


def _c_sender(src: str, dst: str, seconds: float, ns: str | None) -> None:
    """GSO trains from registered memory: one ``rxe_send_train`` per ``sendmsg``."""
    _enter(ns)
    ffi, lib = fastpath.ffi_lib()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = DO: DF, IDs 0.. per send
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    s.bind((src, 0))
    sport = s.getsockname()[1]
    mem = bytearray(os.urandom(TRAIN * PAYLOAD))
    payload = ffi.from_buffer(mem)
    bth = bytes(iba.encode_headers(Packet(Opcode.RC_RDMA_WRITE_MIDDLE, 0x12, 0, memoryview(b""))))
    scratch = ffi.new("uint8_t[]", 16 * fastpath.MAX_TRAIN)
    a, b = socket.inet_aton(src), socket.inet_aton(dst)
    fd = s.fileno()
    psn = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(16):
            if lib.rxe_send_train(fd, a, b, sport, 4791, bth, psn, payload, PAYLOAD, TRAIN, 0,
                                  scratch) > 0:  # fmt: skip
                psn = (psn + TRAIN) & 0xFFFFFF
    s.close()


def bench_compiled(rx: str, seconds: float, veth: bool) -> dict[str, float]:
    """The compiled bytes-only row: C GSO sender, C ``rx`` (raw|gro) receiver."""
    ffi, lib = fastpath.ffi_lib()
    src, dst = VETH if veth else (str(A), str(B))
    if veth:
        _enter(NS[1])  # this (main) thread receives in the second namespace
    if rx == "raw":
        r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
        r.bind((dst, 0))
        io.attach_filter(r, io.roce_ipv4_filter())
        keep = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        keep.bind((dst, 4791))
        io.attach_filter(keep, io.DROP_ALL)
    else:
        r = keep = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        r.bind((dst, 4791))
        r.setsockopt(mmsg.SOL_UDP, mmsg.UDP_GRO, 1)
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    ring = ffi.gc(lib.rxe_ring_new(64, 65536), lib.rxe_ring_free)
    mem = bytearray(256 * PAYLOAD)  # the registered buffer the payloads land in
    cmem = ffi.from_buffer(mem)
    st = ffi.new("struct rxe_bench_stats *")
    local = socket.inet_aton(dst)
    seg = 12 + PAYLOAD + 4
    proc = mp.get_context("fork").Process(
        target=_c_sender, args=(src, dst, seconds, NS[0] if veth else None)
    )
    proc.start()
    poller = select.poll()
    poller.register(r.fileno(), select.POLLIN)
    t0 = t1 = 0.0
    n0 = 0
    fd = r.fileno()
    while True:
        if not poller.poll(500):
            if not proc.is_alive():
                break
            continue
        if lib.rxe_recv_bench(fd, ring, rx == "raw", seg, local, cmem, len(mem), PAYLOAD, st) > 0:
            t1 = time.perf_counter()
            if not t0:
                t0, n0 = t1, st.packets
    proc.join()
    r.close()
    keep.close()
    if veth:
        _enter_root()
    n = st.packets - n0
    dt = max(t1 - t0, 1e-9)
    return {
        "pps": n / dt,
        "MBps": n * PAYLOAD / dt / 1e6,
        "per_recv_call": st.packets / max(st.calls, 1),
        "bad": float(st.bad_icrc + st.short_),
    }


_ROOT_NS = os.open("/proc/self/ns/net", os.O_RDONLY)


def _enter_root() -> None:
    setns(_ROOT_NS)


def _ip(*args: str) -> None:
    import subprocess

    subprocess.run(["ip", *args], check=True)


def veth_up() -> None:
    """Two namespaces, a veth pair between them (MTU 9000: a 4112-byte segment fits)."""
    for ns in NS:
        _ip("netns", "add", ns)
    _ip("link", "add", "ibv0", "netns", NS[0], "mtu", "9000", "type", "veth",
        "peer", "name", "ibv1", "netns", NS[1], "mtu", "9000")  # fmt: skip
    for ns, dev, addr in zip(NS, ("ibv0", "ibv1"), VETH, strict=True):
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
        _ip("-n", ns, "link", "set", dev, "up")
        _ip("-n", ns, "link", "set", "lo", "up")


def veth_down() -> None:
    import subprocess

    for ns in NS:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--mode", choices=("raw", "udp", "both"), default="both")
    ap.add_argument("--syscalls", action="store_true", help="also the bytes-only rows")
    ap.add_argument("--compiled", action="store_true", help="also the compiled bytes-only rows")
    ap.add_argument("--veth", action="store_true", help="the compiled rows across a veth pair")
    ap.add_argument("--no-device", action="store_true", help="skip the DeviceIO rows")
    args = ap.parse_args()
    rows = [("plain sendto/recv, 1 per call", bench_plain(args.seconds))]
    if args.compiled:
        for rx in ("raw", "gro"):
            rows.append(
                (f"C: GSO send -> {rx} recv, ICRCs, copy", bench_compiled(rx, args.seconds, False))
            )
    if args.veth:
        veth_up()
        try:
            for rx in ("raw", "gro"):
                rows.append(
                    (
                        f"C over veth: GSO -> {rx}, ICRCs, copy",
                        bench_compiled(rx, args.seconds, True),
                    )
                )
        finally:
            veth_down()
    if args.syscalls:
        for kind, rx in (
            ("raw", "raw"),
            ("raw", "udp"),
            ("udp", "udp"),
            ("gso", "raw"),
            ("gso", "gro"),
        ):
            rows.append(
                (
                    f"bytes only: {kind} sendmmsg -> {rx} recvmmsg",
                    bench_syscalls(kind, rx, args.seconds),
                )
            )
    for mode in () if args.no_device else ("raw", "udp") if args.mode == "both" else (args.mode,):
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
