"""Cost of the declarative wire codec per packet, against hand-written struct code.

The field-table engine compiles each table to one ``struct`` call plus shifts;
this measures what that costs next to the code one would write by hand for the
BTH (the ratio should be about 1), and what a whole RoCEv2 packet costs to
decode and encode (headers, payload view, ICRC).

    python benchmarks/bench_wire.py [--seconds 0.5]
"""

from __future__ import annotations

import argparse
import struct
import time
import zlib
from collections.abc import Callable

from ibal.providers.rxe import wire
from ibal.wire import iba
from ibal.wire.packet import Opcode, Packet

_BTH = struct.Struct(">III")


def hand_unpack(buf: bytes) -> tuple[int, ...]:
    w0, w1, w2 = _BTH.unpack_from(buf, 0)
    return (w0 >> 24, (w0 >> 23) & 1, (w0 >> 22) & 1, (w0 >> 20) & 3, (w0 >> 16) & 15,
            w0 & 0xFFFF, w1 >> 31, (w1 >> 30) & 1, w1 & 0xFFFFFF, w2 >> 31,
            w2 & 0xFFFFFF)  # fmt: skip


def hand_pack(op: int, se: int, m: int, pad: int, tver: int, pkey: int, fecn: int, becn: int,
              qpn: int, ack: int, psn: int) -> bytes:  # fmt: skip
    return _BTH.pack((op << 24) | (se << 23) | (m << 22) | (pad << 20) | (tver << 16) | pkey,
                     (fecn << 31) | (becn << 30) | qpn, (ack << 31) | psn)  # fmt: skip


def per_call_ns(fn: Callable[[], object], seconds: float) -> float:
    n, best = 1000, float("inf")
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=0.5, help="time per measurement")
    args = ap.parse_args()
    s = args.seconds
    src, dst = bytes((10, 0, 0, 1)), bytes((10, 0, 0, 2))
    vals = (4, False, False, 0, 0, 0xFFFF, False, False, 0x11, True, 1234)
    bth = iba.BTH.pack(*vals)

    def pkt(op: Opcode, size: int) -> tuple[Packet, int, bytes]:
        p = Packet(op, 0x11, 1234, bytes(size), ack_req=True)
        p.va, p.rkey, p.dma_len = 0x1000, 0x55, size
        prefix = wire.icrc_prefix_ipv4(src, dst, 12 + 16 + size + 4, 0xC000)
        return p, prefix, wire.encode_bytes(p, prefix)

    small, sprefix, sraw = pkt(Opcode.RC_SEND_ONLY, 64)
    big, bprefix, braw = pkt(Opcode.RC_RDMA_WRITE_FIRST, 4096)
    noop = per_call_ns(lambda: None, s)
    rows = [
        ("BTH unpack (table)", per_call_ns(lambda: iba.BTH.unpack(bth), s),
         per_call_ns(lambda: hand_unpack(bth), s)),
        ("BTH pack (table)", per_call_ns(lambda: iba.BTH.pack(*vals), s),
         per_call_ns(lambda: hand_pack(*vals), s)),
        ("BTH pack+unpack (table)",
         per_call_ns(lambda: iba.BTH.unpack(iba.BTH.pack(*vals)), s),
         per_call_ns(lambda: hand_unpack(hand_pack(*vals)), s)),
        ("decode SEND_ONLY 64 B", per_call_ns(lambda: iba.decode(sraw), s), None),
        ("decode+ICRC SEND_ONLY 64 B",
         per_call_ns(lambda: (wire.icrc_ok(sraw, sprefix), iba.decode(sraw)), s), None),
        ("encode+ICRC SEND_ONLY 64 B", per_call_ns(lambda: wire.encode(small, sprefix), s), None),
        ("encode+ICRC WRITE_FIRST 4 KiB",
         per_call_ns(lambda: wire.encode(big, bprefix), s),
         per_call_ns(lambda: zlib.crc32(braw), s)),
        ("ICRC prefix (IPv4+UDP)",
         per_call_ns(lambda: wire.icrc_prefix_ipv4(src, dst, 80, 0xC000), s), None),
    ]  # fmt: skip
    print(f"call overhead of the harness: {noop:.0f} ns (included below)")
    print(f"{'operation':34} {'ns/op':>8} {'baseline ns':>12} {'ratio':>6}")
    for name, ns, base in rows:
        if base is None:
            print(f"{name:34} {ns:8.0f}")
        else:
            print(f"{name:34} {ns:8.0f} {base:12.0f} {ns / base:6.2f}")
    print("baselines: hand-written struct code for the BTH; plain zlib.crc32 of the "
          "whole datagram for the 4 KiB encode")  # fmt: skip


if __name__ == "__main__":
    main()
