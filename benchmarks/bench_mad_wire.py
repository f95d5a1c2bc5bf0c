"""Cost of the MAD field tables against hand-written struct code: PortInfo and PathRecord.

For each attribute: the fast path (``Table.unpack`` then ``Table.pack``, no
checks) and the checked path (``decode`` by name, then ``encode`` with range
checks) against a hand-written ``struct`` decoder/encoder of the same fields.
Ratios only (the machine is shared).

    python benchmarks/bench_mad_wire.py [--seconds 0.5]
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from ibal.wire.mad import sa, smp

_PI = struct.Struct(">QQHHIHHBBBBBBBBBBBBBBBBHHHBBBBHHB3s")
_PR = struct.Struct(">Q16s16sHHIBBHHBBBB6s")


def pi_hand_unpack(b: bytes) -> tuple[Any, ...]:
    (mkey, gp, lid, smlid, cap, diag, lease, lport, lwe, lws, lwa, b32, b33, b34, b35, b36, b37,
     vhl, vahc, valc, b41, b42, b43, mkv, pkv, qkv, gcap, b51, b52, b53, mch, _b56) = (
        _PI.unpack_from(b, 0)[:32])  # fmt: skip
    rtl = int.from_bytes(b[57:60], "big")
    cap2, b62, b63 = struct.unpack_from(">HBB", b, 60)
    return (mkey, gp, lid, smlid, cap, diag, lease, lport, lwe, lws, lwa, b32 >> 4, b32 & 15,
            b33 >> 4, b33 & 15, b34 >> 6, b34 & 7, b35 >> 4, b35 & 15, b36 >> 4, b36 & 15,
            b37 >> 4, b37 & 15, vhl, vahc, valc, b41 >> 4, b41 & 15, b42 >> 5, b42 & 31,
            b43 >> 4, (b43 >> 3) & 1, (b43 >> 2) & 1, (b43 >> 1) & 1, b43 & 1, mkv, pkv, qkv,
            gcap, b51 >> 7, (b51 >> 5) & 3, b51 & 31, b52 & 31, b53 >> 4, b53 & 15, mch, rtl,
            cap2, b62 >> 4, b62 & 15, b63 & 31)  # fmt: skip


def pi_hand_pack(x: tuple[Any, ...]) -> bytes:
    out = bytearray(64)
    struct.pack_into(">QQHHIHHBBBB", out, 0, *x[:11])
    out[32] = x[11] << 4 | x[12]
    out[33] = x[13] << 4 | x[14]
    out[34] = x[15] << 6 | x[16]
    out[35] = x[17] << 4 | x[18]
    out[36] = x[19] << 4 | x[20]
    out[37] = x[21] << 4 | x[22]
    out[38:41] = bytes(x[23:26])
    out[41] = x[26] << 4 | x[27]
    out[42] = x[28] << 5 | x[29]
    out[43] = x[30] << 4 | x[31] << 3 | x[32] << 2 | x[33] << 1 | x[34]
    struct.pack_into(">HHHB", out, 44, *x[35:39])
    out[51] = x[39] << 7 | x[40] << 5 | x[41]
    out[52] = x[42]
    out[53] = x[43] << 4 | x[44]
    struct.pack_into(">H", out, 54, x[45])
    out[57:60] = x[46].to_bytes(3, "big")
    struct.pack_into(">HBB", out, 60, x[47], x[48] << 4 | x[49], x[50])
    return bytes(out)


def pr_hand_unpack(b: bytes) -> tuple[Any, ...]:
    sid, dgid, sgid, dlid, slid, hfr, tc, nprev, pkey, qsl, mtu, rate, life, pref, _r = (
        _PR.unpack_from(b, 0))  # fmt: skip
    return (sid, dgid, sgid, dlid, slid, hfr >> 31, (hfr >> 8) & 0xFFFFF, hfr & 0xFF, tc,
            nprev >> 7, nprev & 0x7F, pkey, qsl >> 4, qsl & 15, mtu >> 6, mtu & 63, rate >> 6,
            rate & 63, life >> 6, life & 63, pref)  # fmt: skip


def pr_hand_pack(i: tuple[Any, ...]) -> bytes:
    return _PR.pack(i[0], i[1], i[2], i[3], i[4], i[5] << 31 | i[6] << 8 | i[7], i[8],
                    i[9] << 7 | i[10], i[11], i[12] << 4 | i[13], i[14] << 6 | i[15],
                    i[16] << 6 | i[17], i[18] << 6 | i[19], i[20], bytes(6))  # fmt: skip


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
    s = ap.parse_args().seconds
    pi = smp.PORT_INFO.encode(
        gid_prefix=0xFE80 << 48, lid=7, master_sm_lid=1, capability_mask=0x50C048,
        m_key_lease_period=4089, local_port_num=1, link_width_enabled=2,
        link_width_supported=31, link_width_active=2, link_speed_supported=7, port_state=4,
        port_phys_state=5, link_down_default_state=2, link_speed_active=1,
        link_speed_enabled=1, neighbor_mtu=4, vl_cap=4, vl_arbitration_high_cap=8,
        vl_arbitration_low_cap=8, mtu_cap=4, vl_stall_count=7, operational_vls=4, guid_cap=32,
        subnet_timeout=31, link_round_trip_latency=77, capability_mask2=0x30,
    )  # fmt: skip
    pr = sa.PATH_RECORD.encode(
        dgid=bytes.fromhex("fe800000000000000000000000100001"),
        sgid=bytes.fromhex("fe800000000000000000000000100003"), dlid=1, slid=7,
        flow_label=0x12345, hop_limit=64, reversible=1, numb_path=1, p_key=0xFFFF, sl=3,
        mtu_selector=2, mtu=4, rate_selector=2, rate=3, packet_life_time_selector=2,
        packet_life_time=18,
    )  # fmt: skip
    # the hand-written code does the same work
    assert pi_hand_pack(pi_hand_unpack(pi)) == pi
    assert pi_hand_unpack(pi) == smp.PORT_INFO.unpack(pi)
    assert pr_hand_pack(pr_hand_unpack(pr)) == pr
    assert pr_hand_unpack(pr) == sa.PATH_RECORD.unpack(pr)
    rows = []
    for name, t, raw, hu, hp in (("PortInfo", smp.PORT_INFO, pi, pi_hand_unpack, pi_hand_pack),
                                 ("PathRecord", sa.PATH_RECORD, pr, pr_hand_unpack, pr_hand_pack)):
        hand = per_call_ns(lambda hu=hu, hp=hp, raw=raw: hp(hu(raw)), s)  # type: ignore[misc]
        fast = per_call_ns(lambda t=t, raw=raw: t.pack(*t.unpack(raw)), s)  # type: ignore[misc]
        checked = per_call_ns(lambda t=t, raw=raw: t.encode(t.decode(raw)), s)  # type: ignore[misc]
        rows.append((f"{name} unpack+pack (table)", fast, hand))
        rows.append((f"{name} decode+encode (checked)", checked, hand))
    print(f"python {'.'.join(map(str, sys.version_info[:3]))}")
    print(f"{'operation':36} {'ns/op':>8} {'hand ns':>8} {'ratio':>6}")
    for name, ns, base in rows:
        print(f"{name:36} {ns:8.0f} {base:8.0f} {ns / base:6.2f}")
    print("baseline: hand-written struct decode then encode of the same fields")


if __name__ == "__main__":
    main()
