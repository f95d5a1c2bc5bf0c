"""The compiled rxe byte work (fastpath.c) against its Python twin and the wire reference.

Each C function is compared with the Python function it mirrors on the same
input: CRC-32 and ICRC against ``zlib``/``wire``, the GSO train on a real
socket against ``train_bytes`` and the reference decoder, the landing of
received datagrams (good, corrupted, truncated, forged) against
``land_datagram``: same counters, same memory.
"""

from __future__ import annotations

import ipaddress
import os
import select
import socket
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from netns_util import need_root

from ibal.providers.rxe import fastpath, io, mmsg, wire
from ibal.status import InvalidSetting, Unsupported
from ibal.wire import iba
from ibal.wire.packet import Opcode, Packet

A = socket.inet_aton("127.0.0.171")
B = socket.inet_aton("127.0.0.172")
ROOT = Path(__file__).resolve().parents[3]
MTU = 1024
SEG = 12 + MTU + 4
BTH = bytes(iba.encode_headers(Packet(Opcode.RC_RDMA_WRITE_MIDDLE, 0x12, 0, memoryview(b""))))


def need_c() -> tuple[Any, Any]:
    """The compiled module; skip naming what builds it (fail with IBAL_LAB_REQUIRED=1)."""
    if fastpath.compiled() is None:
        what = (
            "the compiled rxe engine is not built (needs gcc and the Python headers, "
            "Debian packages gcc and python3-dev; then pip install -e .)"
        )
        if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
            pytest.fail(f"{what} (IBAL_LAB_REQUIRED is set)", pytrace=False)
        pytest.skip(what)
    return fastpath.ffi_lib()


@pytest.fixture(scope="module")
def c() -> tuple[Any, Any]:
    return need_c()


@pytest.fixture(scope="module", params=[True, False], ids=["clmul", "tables"])
def crc_code(request: pytest.FixtureRequest, c: tuple[Any, Any]) -> Iterator[Any]:
    _ffi, lib = c
    lib.rxe_crc_use_clmul(1 if request.param else 0)
    try:
        yield lib
    finally:
        lib.rxe_crc_use_clmul(1)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=5000), seed=st.integers(0, 2**32 - 1), skip=st.integers(0, 15))
def test_crc32_is_zlibs(crc_code: Any, data: bytes, seed: int, skip: int) -> None:
    part = data[skip:]
    assert crc_code.rxe_crc32(seed, part, len(part)) == zlib.crc32(part, seed)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(16, 4200),
    sport=st.integers(0, 0xFFFF),
    ident=st.integers(0, 0xFFFF),
    data=st.data(),
)
def test_icrc_is_the_references(
    c: tuple[Any, Any], n: int, sport: int, ident: int, data: st.DataObject
) -> None:
    _ffi, lib = c
    pkt = data.draw(st.binary(min_size=n, max_size=n))
    pre = wire.icrc_prefix_ipv4(A, B, n, sport, ident=ident)
    assert lib.rxe_icrc_prefix_ipv4(A, B, n, sport, ident, 0x4000, 4791) == pre
    assert fastpath.icrc_prefix_ipv4(A, B, n, sport, ident, 0x4000, 4791) == pre
    assert lib.rxe_icrc(pkt, n, pre) == wire.icrc(pkt, pre) == fastpath.icrc(pkt, pre)


def _udp_rx(gro: bool) -> socket.socket:
    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r.bind(("127.0.0.172", 0))
    if gro:
        r.setsockopt(mmsg.SOL_UDP, mmsg.UDP_GRO, 1)
    return r


def _df_sender() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = DO
    s.bind(("127.0.0.171", 0))
    return s


def test_send_train_leaves_as_the_twin_says_and_the_reference_accepts_it(
    c: tuple[Any, Any],
) -> None:
    ffi, lib = c
    n = 5
    payload = bytearray(os.urandom(n * MTU))
    with _df_sender() as s, _udp_rx(gro=False) as r:
        dport = r.getsockname()[1]
        sport = s.getsockname()[1]
        scratch = ffi.new("uint8_t[]", 16 * fastpath.MAX_TRAIN)
        sent = lib.rxe_send_train(
            s.fileno(), A, B, sport, dport, BTH, 0xFFFFFE, ffi.from_buffer(payload), MTU, n, 0,
            scratch,
        )  # fmt: skip
        assert sent == n * SEG
        # without GRO the receiving UDP socket gets the train cut into its datagrams
        got = [r.recv(65536) for _ in range(n)]
    twin = fastpath.train_bytes(A, B, sport, dport, BTH, 0xFFFFFE, payload, MTU, n, 0)
    assert got == twin
    for k, d in enumerate(got):
        # the reference checks segment k's ICRC over IP ID k
        assert wire.icrc_ok(d, wire.icrc_prefix_ipv4(A, B, len(d), sport, ident=k, dport=dport))
        p = iba.decode(d)
        assert p.opcode == Opcode.RC_RDMA_WRITE_MIDDLE
        assert p.psn == (0xFFFFFE + k) & 0xFFFFFF
        assert bytes(p.payload) == payload[k * MTU : (k + 1) * MTU]


def test_send_train_refuses_what_one_send_cannot_carry(c: tuple[Any, Any]) -> None:
    ffi, lib = c
    big = bytearray(64 * 4096)
    scratch = ffi.new("uint8_t[]", 16 * fastpath.MAX_TRAIN)
    with _df_sender() as s:
        fd = s.fileno()
        for mtu, n in ((4096, 16), (1024, 0), (1024, 65), (1022, 2), (0, 1)):
            r = lib.rxe_send_train(fd, A, B, 1, 4791, BTH, 0, ffi.from_buffer(big), mtu, n, 0,
                                   scratch)  # fmt: skip
            assert r == -22, (mtu, n)  # EINVAL, nothing sent


def _stats(ffi: Any, s: Any) -> tuple[int, ...]:
    return (s.datagrams, s.packets, s.bytes, s.bad_icrc, s.short_)


def _twin_stats(s: fastpath.BenchStats) -> tuple[int, ...]:
    return (s.datagrams, s.packets, s.bytes, s.bad_icrc, s.short_)


def _raw_datagram(
    segs: list[bytes], ident: int, sport: int = 0xC000, tot: int | None = None
) -> bytes:
    body = b"".join(segs)
    udp_len = 8 + len(body)
    ip = struct.pack(
        ">BBHHHBBH4s4s", 0x45, 0, tot if tot is not None else 20 + udp_len, ident, 0x4000, 64,
        17, 0, A, B,
    )  # fmt: skip
    return ip + struct.pack(">HHHH", sport, 4791, udp_len, 0) + body


def _segments(n: int, ident: int, sport: int = 0xC000, psn: int = 7) -> list[bytes]:
    payload = os.urandom(n * MTU)
    return fastpath.train_bytes(A, B, sport, 4791, BTH, psn, payload, MTU, n, ident)


def _land_both(
    c: tuple[Any, Any], d: bytes, raw: bool, gro: int = 0
) -> tuple[tuple[int, ...], bytes]:
    ffi, lib = c
    mem_c = bytearray(8 * MTU)
    mem_py = bytearray(8 * MTU)
    sc = ffi.new("struct rxe_bench_stats *")
    lib.rxe_land_datagram(
        d, len(d), raw, SEG, A, 0xC000, B, gro, ffi.from_buffer(mem_c), len(mem_c), MTU, sc
    )
    sp = fastpath.BenchStats()
    fastpath.land_datagram(d, raw, SEG, (A, 0xC000), B, gro, mem_py, MTU, sp)
    assert _stats(ffi, sc) == _twin_stats(sp)
    assert mem_c == mem_py
    return _twin_stats(sp), bytes(mem_c)


def test_a_raw_train_lands_every_packet_once(c: tuple[Any, Any]) -> None:
    segs = _segments(3, ident=40)
    stats, mem = _land_both(c, _raw_datagram(segs, ident=40), raw=True)
    assert stats == (1, 3, 3 * MTU, 0, 0)
    for k, s in enumerate(segs):
        slot = (7 + k) % 8
        assert mem[slot * MTU : (slot + 1) * MTU] == s[12 : 12 + MTU]


def test_a_gro_train_lands_every_packet_once(c: tuple[Any, Any]) -> None:
    segs = _segments(4, ident=0)
    stats, mem = _land_both(c, b"".join(segs), raw=False, gro=SEG)
    assert stats == (1, 4, 4 * MTU, 0, 0)
    assert mem[7 * MTU : 8 * MTU] == segs[0][12:-4]


def test_a_segment_checked_over_the_wrong_ip_id_is_dropped_and_counted(
    c: tuple[Any, Any],
) -> None:
    segs = _segments(2, ident=41)  # ICRCs over IDs 41, 42; the header says 40
    stats, mem = _land_both(c, _raw_datagram(segs, ident=40), raw=True)
    assert stats == (1, 0, 0, 2, 0)
    assert mem == bytes(len(mem))


@pytest.mark.parametrize(
    "forge",
    [
        lambda d: d[:27],  # shorter than IP + UDP
        lambda d: b"\x46" + d[1:],  # IP options
        lambda d: d[:9] + b"\x06" + d[10:],  # not UDP
        lambda d: d[:2] + struct.pack(">H", len(d) + 4) + d[4:],  # IP length lies
        lambda d: d[:6] + b"\x20\x00" + d[8:],  # a fragment
        lambda d: d[:24] + struct.pack(">H", 9) + d[26:],  # UDP length lies
        lambda d: d[:22] + b"\x12\xb6" + d[24:],  # another port
        lambda d: d[:28],  # no payload
        lambda d: d[:40],  # a segment shorter than BTH + ICRC
        lambda d: d[:100] + bytes([d[100] ^ 1]) + d[101:],  # a flipped payload bit
    ],
)
def test_forged_raw_datagrams_are_counted_and_land_nothing(c: tuple[Any, Any], forge: Any) -> None:
    d = forge(_raw_datagram(_segments(1, ident=3), ident=3))
    stats, mem = _land_both(c, d, raw=True)
    assert stats[1] == 0 and stats[3] + stats[4] == 1
    assert mem == bytes(len(mem))


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=3 * SEG),
    raw=st.booleans(),
    gro=st.sampled_from([0, 1, 13, SEG, SEG - 1, 0xFFFFFFFF]),
)
def test_any_bytes_land_the_same_in_c_and_in_the_twin(
    c: tuple[Any, Any], data: bytes, raw: bool, gro: int
) -> None:
    _land_both(c, data, raw, gro)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 3),
    ident=st.integers(0, 0xFFFF),
    flips=st.lists(st.integers(0, 28 + 3 * SEG - 1), max_size=3),
    cut=st.integers(0, 3 * SEG + 28),
)
def test_damaged_trains_land_the_same_in_c_and_in_the_twin(
    c: tuple[Any, Any], n: int, ident: int, flips: list[int], cut: int
) -> None:
    d = bytearray(_raw_datagram(_segments(n, ident=ident), ident=ident))
    for f in flips:
        if f < len(d):
            d[f] ^= 0x40
    _land_both(c, bytes(d[:cut]), raw=True)
    _land_both(c, bytes(d[28:cut]), raw=False, gro=SEG)


def test_recv_bench_lands_a_gso_train_sent_through_the_kernel(c: tuple[Any, Any]) -> None:
    need_root()  # the raw receive socket
    ffi, lib = c
    n = 6
    payload = bytearray(os.urandom(n * MTU))
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    keep = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        raw.bind(("127.0.0.172", 0))
        io.attach_filter(raw, io.roce_ipv4_filter())
        keep.bind(("127.0.0.172", 4791))
        io.attach_filter(keep, io.DROP_ALL)
        with _df_sender() as s:
            scratch = ffi.new("uint8_t[]", 16 * fastpath.MAX_TRAIN)
            assert lib.rxe_send_train(
                s.fileno(), A, B, s.getsockname()[1], 4791, BTH, 16, ffi.from_buffer(payload),
                MTU, n, 0, scratch,
            ) == n * SEG  # fmt: skip
        ring = ffi.gc(lib.rxe_ring_new(8, 65536), lib.rxe_ring_free)
        mem = bytearray(8 * MTU)
        stats = ffi.new("struct rxe_bench_stats *")
        assert select.select([raw], [], [], 20)[0]
        got = lib.rxe_recv_bench(raw.fileno(), ring, 1, SEG, B, ffi.from_buffer(mem), len(mem),
                                 MTU, stats)  # fmt: skip
    finally:
        raw.close()
        keep.close()
    assert got == 1  # lo hands the raw socket the train in one piece
    assert (stats.packets, stats.bad_icrc, stats.short_) == (n, 0, 0)
    for k in range(n):
        slot = (16 + k) % 8
        assert mem[slot * MTU : (slot + 1) * MTU] == payload[k * MTU : (k + 1) * MTU]


# ----------------------------------------------------------------- engine choice


def test_the_engine_variable_chooses(c: tuple[Any, Any]) -> None:
    assert fastpath.choose("python") == "python"
    assert fastpath.choose("c") == "c"
    assert fastpath.choose("auto") == "c"
    assert fastpath.choose(" C ") == "c"
    with pytest.raises(InvalidSetting, match="IBAL_RXE_ENGINE='fast'"):
        fastpath.choose("fast")


def test_without_the_build_auto_warns_once_and_c_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fastpath, "_loaded", [None])  # as where setup could not compile
    monkeypatch.setattr(fastpath, "_warned", [])
    with pytest.warns(RuntimeWarning, match="pure Python") as record:
        assert fastpath.choose("auto") == "python"
        assert fastpath.choose("auto") == "python"
    assert len(record) == 1
    with pytest.raises(Unsupported, match="not built"):
        fastpath.choose("c")
    assert fastpath.payload_crc32("python") is zlib.crc32


def test_the_c_payload_crc_is_zlibs(c: tuple[Any, Any]) -> None:
    crc = fastpath.payload_crc32("c")
    buf = bytearray(os.urandom(9000))
    for n in (0, 1, 255, 256, 4096, 9000):
        for view in (bytes(buf[:n]), memoryview(buf)[3 : 3 + n], buf[:n]):
            assert crc(view, 0x5A5A) == zlib.crc32(view, 0x5A5A)


@pytest.mark.parametrize("engine", ["c", "python"])
def test_ibal_info_says_which_engine_the_device_runs(
    engine: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    need_root()
    if engine == "c":
        need_c()
    env = dict(os.environ, IBAL_RXE_ENGINE=engine, IBAL_RXE_DEVICES="rxe0=127.0.0.173")
    env["XDG_CONFIG_HOME"] = str(tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "ibal.cli", "info", "-p", "rxe"],
        capture_output=True, text=True, env=env, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"ibal rxe 0.1 ({engine} engine)" in r.stdout


def test_an_unknown_engine_is_refused_with_the_variable_named(tmp_path: Any) -> None:
    need_root()
    env = dict(os.environ, IBAL_RXE_ENGINE="turbo", IBAL_RXE_DEVICES="rxe0=127.0.0.174")
    env["XDG_CONFIG_HOME"] = str(tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "ibal.cli", "info", "-p", "rxe"],
        capture_output=True, text=True, env=env, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 1
    assert "IBAL_RXE_ENGINE='turbo'" in r.stderr


# ----------------------------------------------------------------- bounded fuzz

FUZZ_EXAMPLES = int(os.environ.get("IBAL_FUZZ_EXAMPLES", "300"))
"""Examples of the receive-entry fuzz; CI's sanitizer run raises it."""
GUARD = 4096


@st.composite
def _mutated(draw: st.DrawFn) -> tuple[bytes, bool, int]:
    raw = draw(st.booleans())
    n = draw(st.integers(1, 3))
    ident = draw(st.integers(0, 0xFFFF))
    segs = _segments(n, ident=ident if raw else 0, psn=draw(st.integers(0, 0xFFFFFF)))
    d = bytearray(_raw_datagram(segs, ident) if raw else b"".join(segs))
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "grow", "field"]))
        if kind == "flip" and d:
            i = draw(st.integers(0, len(d) - 1))
            d[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del d[draw(st.integers(0, len(d))) :]
        elif kind == "grow":
            d += draw(st.binary(min_size=1, max_size=64))
        elif kind == "field" and len(d) >= 28:
            at = draw(st.sampled_from([2, 6, 24, 1 if raw else 29]))
            d[at : at + 2] = draw(st.integers(0, 0xFFFF)).to_bytes(2, "big")
    gro = 0 if raw else draw(st.sampled_from([0, SEG, 1, 17, 0xFFFFFFFF]))
    return bytes(d), raw, gro


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(case=st.one_of(_mutated(), st.tuples(st.binary(max_size=9000), st.booleans(),
                                            st.integers(0, 0xFFFFFFFF))))  # fmt: skip
def test_fuzz_the_receive_entry_point(c: tuple[Any, Any], case: tuple[bytes, bool, int]) -> None:
    """Whatever arrives: no sanitizer report, every datagram counted, nothing written
    outside the registered range, and the same verdict as the twin."""
    ffi, lib = c
    d, raw, gro = case
    mem = bytearray(GUARD + 8 * MTU + GUARD)
    base = ffi.from_buffer(mem)
    st_c = ffi.new("struct rxe_bench_stats *")
    lib.rxe_land_datagram(d, len(d), raw, SEG, A, 0xC000, B, gro, base + GUARD, 8 * MTU, MTU, st_c)
    assert mem[:GUARD] == bytes(GUARD) and mem[-GUARD:] == bytes(GUARD)
    assert st_c.datagrams == 1
    assert st_c.packets + st_c.bad_icrc + st_c.short_ >= 1
    twin = fastpath.BenchStats()
    inner = bytearray(8 * MTU)
    fastpath.land_datagram(d, raw, SEG, (A, 0xC000), B, gro, inner, MTU, twin)
    assert _stats(ffi, st_c) == _twin_stats(twin)
    assert mem[GUARD:-GUARD] == inner


# ----------------------------------------------------------------- trains


def _train_frames(
    tmp_path: Path, engine: str, data: bytes, n: int, mtu: int, since: int, psn: int
) -> list[bytes]:
    from ibal.providers.rxe.io import DeviceIO
    from ibal.wire.packet import Train
    from ibal.wire.pcap import PcapWriter, read_pcap

    path = tmp_path / f"{engine}.pcap"
    cap = PcapWriter(path, wire.LINKTYPE_ETHERNET)
    dev = DeviceIO(lambda pkts: None, port=47913, capture=cap, engine=engine)  # type: ignore[arg-type]
    try:
        dev.add_address(ipaddress.ip_address("127.0.0.175"))
        head = Packet(Opcode.RC_RDMA_WRITE_MIDDLE, 0x34, psn, memoryview(data)[mtu : 2 * mtu])
        head.dst_ip = bytes([127, 0, 0, 176])
        dev.send_train(Train(head, memoryview(data), mtu, mtu, n, since, 64, True),
                       head.dst_ip, 0xC002)  # fmt: skip
        dev.flush()
    finally:
        dev.close()
        cap.close()
    return [r.data for r in read_pcap(path)[1]]


@pytest.mark.parametrize(("n", "mtu", "since", "psn"), [
    (1, 256, 0, 0), (7, 1024, 60, 0xFFFFFE), (150, 4096, 63, 5), (65, 512, 1, 0xFFFF00),
])  # fmt: skip
def test_a_train_leaves_byte_for_byte_as_the_python_engine_sends_it(
    c: tuple[Any, Any], tmp_path: Path, n: int, mtu: int, since: int, psn: int
) -> None:
    need_root()
    data = os.urandom(mtu * (n + 2))
    got = _train_frames(tmp_path, "c", data, n, mtu, since, psn)
    assert got == _train_frames(tmp_path, "python", data, n, mtu, since, psn)
    assert len(got) == n
    for k, f in enumerate(got):
        frame = wire.split_ethernet(f)
        assert frame is not None
        p = wire.decode_frame(frame)  # the reference's ICRC check
        assert p.psn == (psn + k) & 0xFFFFFF
        assert p.ack_req == ((since + 1 + k) % 64 == 0)


def test_fill_train_refuses_what_falls_outside_its_buffers(c: tuple[Any, Any]) -> None:
    ffi, lib = c
    arena = bytearray(4 * 1100)
    data = bytes(4 * 1024)
    a, d = ffi.from_buffer(arena), ffi.from_buffer(data)
    udp, hdr = bytes(8), BTH

    def fill(off: int, slot: int, m: int, k0: int, doff: int, per: int = 64, hlen: int = 12,
             pad: int = 0) -> int:  # fmt: skip
        return int(lib.rxe_fill_train(a, len(arena), off, slot, m, udp, hdr, hlen, 0, 0, k0, 0,
                                      per, 0, d, len(data), doff, 1024, pad, 0))  # fmt: skip

    assert fill(0, 1100, 4, 0, 0) == 0
    for bad in (
        dict(off=1, slot=1100, m=4, k0=0, doff=0),  # past the arena's end
        dict(off=0, slot=1040, m=4, k0=0, doff=0),  # a packet longer than its slot
        dict(off=0, slot=1100, m=2, k0=3, doff=0),  # past the payload's end
        dict(off=0, slot=1100, m=1, k0=0, doff=4096),
        dict(off=0, slot=1100, m=1, k0=0, doff=0, per=0),
        dict(off=0, slot=1100, m=1, k0=0, doff=0, hlen=11),
        dict(off=0, slot=1100, m=1, k0=0, doff=0, pad=4),
        dict(off=2**63, slot=1100, m=1, k0=0, doff=0),
    ):
        before = bytes(arena)
        assert fill(**bad) == -22, bad  # type: ignore[arg-type]
        assert arena == before


# ----------------------------------------------------------------- the C MR table

from hypothesis.stateful import RuleBasedStateMachine, invariant, rule  # noqa: E402

from ibal.providers.rxe.memory import KeyTable, Mr, Mw, Pd, QpMemory  # noqa: E402
from ibal.types import AccessFlags  # noqa: E402

_REMOTE = [int(AccessFlags.RDMA_WRITE), int(AccessFlags.RDMA_READ), int(AccessFlags.ATOMIC)]


class MrTableTwin(RuleBasedStateMachine):
    """Registrations, deregistrations and windows in the Python key table and the C
    mirror of its regions; every look-up C answers is the Python core's answer."""

    def __init__(self) -> None:
        super().__init__()
        self.ffi, self.lib = need_c()
        self.table = self.ffi.gc(self.lib.rxe_mr_table_new(64), self.lib.rxe_mr_table_free)
        self.keys = KeyTable()
        self.pds = [Pd(None), Pd(None)]
        self.mrs: list[Mr] = []
        self.mws: list[Mw] = []
        self.hold: list[Any] = []  # the C side's pointers stay valid while a test holds them

    @rule(pd=st.integers(0, 1), length=st.integers(1, 5000), vaddr=st.integers(0, 2**64 - 1),
          access=st.integers(0, 31), near_top=st.booleans())  # fmt: skip
    def register(self, pd: int, length: int, vaddr: int, access: int, near_top: bool) -> None:
        if len(self.mrs) >= 30:
            return
        if near_top:
            vaddr = 2**64 - length - (vaddr % 8)  # a region that ends at the top of the space
        buf = bytearray(length)
        mr = Mr(None, self.pds[pd], memoryview(buf), vaddr, access)
        key = self.keys.new_key()
        mr.lkey = mr.rkey = key
        self.keys.install(mr, key)
        self.hold.append(buf)
        base = self.ffi.from_buffer(buf)
        self.hold.append(base)
        assert self.lib.rxe_mr_put(self.table, key, pd, vaddr, length, access, base) == 0
        self.mrs.append(mr)

    @rule(i=st.integers(0, 29))
    def deregister(self, i: int) -> None:
        if not self.mrs:
            return
        mr = self.mrs.pop(i % len(self.mrs))
        self.keys.remove(mr.rkey)
        assert self.lib.rxe_mr_del(self.table, mr.rkey) == 1
        assert self.lib.rxe_mr_del(self.table, mr.rkey) == 0

    @rule(i=st.integers(0, 29), access=st.sampled_from(_REMOTE))
    def bind_window(self, i: int, access: int) -> None:
        if not self.mrs:
            return
        mr = self.mrs[i % len(self.mrs)]
        mw = Mw(None, mr.pd)
        mw.rkey = self.keys.new_key()
        mw.mr, mw.addr, mw.length, mw.access = mr, mr.vaddr, mr.length, access
        self.keys.install(mw, mw.rkey)  # windows stay with Python: C never holds them
        self.mws.append(mw)

    @rule(pick=st.integers(0, 60), pd=st.integers(0, 1), off=st.integers(-8, 5008),
          length=st.integers(0, 5008), access=st.sampled_from(_REMOTE),
          junk=st.integers(0, 2**32 - 1))  # fmt: skip
    def look_up(self, pick: int, pd: int, off: int, length: int, access: int, junk: int) -> None:
        objs: list[Mr | Mw] = [*self.mrs, *self.mws]
        rkey = objs[pick % len(objs)].rkey if objs and pick < 50 else junk
        base = objs[pick % len(objs)].vaddr if objs and pick < 50 and isinstance(
            objs[pick % len(objs)], Mr) else 0  # fmt: skip
        va = (base + off) % 2**64
        out = self.ffi.new("uint8_t **")
        got = self.lib.rxe_mr_remote(self.table, rkey, pd, va, length, access, out)
        py = QpMemory(self.keys, self.pds[pd]).remote(rkey, va, length, access)
        event(f"C answered {got}")
        if got == 1:
            assert py is not None and len(py) == length
            if length:
                assert int(self.ffi.cast("uintptr_t", out[0])) == int(
                    self.ffi.cast("uintptr_t", self.ffi.from_buffer(py)))  # fmt: skip
        elif got == 0:
            assert py is None
        else:
            assert got == -1
            obj = self.keys.get(rkey)
            assert obj is None or type(obj) is Mw  # a miss only for what C never holds

    @invariant()
    def same_count(self) -> None:
        if hasattr(self, "lib"):
            assert self.lib.rxe_mr_count(self.table) == len(self.mrs)


MrTableTwin.TestCase.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)
TestMrTableTwin = MrTableTwin.TestCase


def test_mr_table_refuses_a_bad_size_and_a_full_table(c: tuple[Any, Any]) -> None:
    ffi, lib = c
    for bad in (0, 7, 12, 2**25):
        assert lib.rxe_mr_table_new(bad) == ffi.NULL
    t = ffi.gc(lib.rxe_mr_table_new(8), lib.rxe_mr_table_free)
    buf = bytearray(16)
    for k in range(4):
        assert lib.rxe_mr_put(t, 0x100 + k, 0, 0, 16, 0xFF, ffi.from_buffer(buf)) == 0
    assert lib.rxe_mr_put(t, 0x200, 0, 0, 16, 0xFF, ffi.from_buffer(buf)) == -28  # ENOSPC
    assert lib.rxe_mr_put(t, 0x101, 1, 0, 16, 0xFF, ffi.from_buffer(buf)) == 0  # a replacement
    assert lib.rxe_mr_count(t) == 4
