"""RoCEv2 codec: headers per opcode, ICRC, malformed packets, UDP source ports."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibal.providers.rxe import wire
from ibal.wire import iba
from ibal.wire import packet as pk
from ibal.wire.fields import Kind
from ibal.wire.iba import DropReason, Malformed
from ibal.wire.packet import Opcode, Packet
from ibal.wire.pcap import read_pcap

REPO = Path(__file__).resolve().parents[3]
# shared/ sits beside the checkout (CI, the main checkout) or beside the worktrees' parent
CAPTURES = next(
    (p for p in (REPO.parent / "shared", REPO.parent.parent / "shared") if p.is_dir()),
    REPO.parent / "shared",
) / "data" / "rxe-captures"
SRC4, DST4 = bytes((10, 99, 0, 2)), bytes((10, 99, 0, 1))
SRC6 = bytes.fromhex("fe800000000000000000000000000001")
DST6 = bytes.fromhex("20010db8000000000000000000000002")


def prefix_for(src: bytes, dst: bytes, n: int, sport: int) -> int:
    if len(src) == 4:
        return wire.icrc_prefix_ipv4(src, dst, n, sport)
    return wire.icrc_prefix_ipv6(src, dst, n, sport)


def udp_payload_len(p: Packet) -> int:
    return pk.HDR_LEN[p.opcode] + len(p.payload) + (-len(p.payload) & 3) + pk.ICRC_LEN


@st.composite
def packets(draw: st.DrawFn) -> Packet:
    op = draw(st.sampled_from(list(Opcode)))
    payload = draw(st.binary(max_size=70)) if pk.OP_FLAGS[op] & pk.PAYLOAD else b""
    p = Packet(op, payload=payload)
    for t in iba.FORMATS[op].headers:  # type: ignore[union-attr]
        for f in t.values:
            if f.name == "pad":
                continue
            if f.field.kind is Kind.BOOL:
                v: object = draw(st.booleans())
            elif f.name == "tver":
                v = 0
            elif f.name == "opcode":
                v = op
            else:
                v = draw(st.integers(0, (1 << f.field.bits) - 1))
            setattr(p, f.name, v)
    return p


@settings(max_examples=400, deadline=None)
@given(packets(), st.booleans())
def test_every_opcode_round_trips_with_its_icrc(p: Packet, v6: bool) -> None:
    src, dst = (SRC6, DST6) if v6 else (SRC4, DST4)
    prefix = prefix_for(src, dst, udp_payload_len(p), 0xC123)
    raw = wire.encode_bytes(p, prefix)
    assert len(raw) == udp_payload_len(p)
    assert raw[1] >> 4 & 3 == -len(p.payload) & 3
    q = iba.decode(raw)
    want = p.fields()
    want["pad"] = -len(p.payload) & 3
    assert q.fields() == want
    assert wire.icrc_ok(raw, prefix)
    # the same frame as a full IP datagram checks out through the receive path
    ip_udp = wire.ip_udp_headers(src, dst, 0xC123, len(raw), ttl=7, tos=0x2E)
    frame = wire.split_ip(ip_udp + raw)
    assert frame is not None
    got = wire.decode_frame(frame)
    assert (got.src_ip, got.dst_ip, got.src_port) == (src, dst, 0xC123)


def test_icrc_ignores_exactly_the_masked_bytes() -> None:
    p = Packet(Opcode.RC_RDMA_WRITE_ONLY, 0x12, 77, b"abcdefg", ack_req=True)
    p.va, p.rkey, p.dma_len = 0x1000, 0x55, 7
    ip_udp = wire.ip_udp_headers(SRC4, DST4, 0xC000, udp_payload_len(p))
    good = ip_udp + wire.encode_bytes(p, wire.icrc_prefix(ip_udp))
    masked = {1, 8, 10, 11, 26, 27, 28 + 4}  # TOS, TTL, IP csum, UDP csum, BTH byte 4
    for i in range(len(good) - 4):
        bad = bytearray(good)
        bad[i] ^= 0x01
        frame = wire.split_ip(bytes(bad))
        if frame is None:  # flipped the protocol or port: not RoCEv2 at all
            continue
        ok = wire.icrc_ok(frame.udp_payload, wire.icrc_prefix(frame.ip_udp))
        assert ok == (i in masked), i
    # ICRC is little-endian CRC-32 over 8 ones + masked headers (roce-wire.md 2.5)
    h = bytearray(good[:-4])
    h[1], h[8], h[10:12], h[26:28], h[32] = 0xFF, 0xFF, b"\xff\xff", b"\xff\xff", 0xFF
    assert good[-4:] == zlib.crc32(b"\xff" * 8 + h).to_bytes(4, "little")


def _reason(raw: bytes) -> DropReason:
    with pytest.raises(Malformed) as e:
        iba.decode(raw)
    return e.value.reason


def test_malformed_packets_raise_their_reason() -> None:
    send = wire.encode_bytes(Packet(Opcode.RC_SEND_ONLY, 1, 2, b"abcde"), 0)
    assert _reason(send[:15]) is DropReason.SHORT
    assert _reason(b"") is DropReason.SHORT
    implemented = {int(o) for o in Opcode}
    for op in range(256):
        if op not in implemented:
            assert _reason(bytes((op,)) + send[1:]) is DropReason.BAD_OPCODE, hex(op)
    assert _reason(send[:1] + bytes((send[1] | 0x01,)) + send[2:]) is DropReason.BAD_TVER
    # pad count 3 with one payload byte
    one = wire.encode_bytes(Packet(Opcode.RC_SEND_ONLY, 1, 2, b"a"), 0)
    short_pad = one[:1] + bytes((one[1] & 0xCF,)) + one[2:12] + one[12:13] + one[-4:]
    assert iba.decode(short_pad).payload.tobytes() == b"a"
    assert _reason(one[:12] + one[-4:]) is DropReason.BAD_PAD
    # an RDMA WRITE FIRST is cut inside its RETH; an ACK carrying payload
    w = Packet(Opcode.RC_RDMA_WRITE_FIRST, 1, 2, b"x" * 8)
    assert _reason(wire.encode_bytes(w, 0)[:20]) is DropReason.BAD_LENGTH
    ack = wire.encode_bytes(Packet(Opcode.RC_ACKNOWLEDGE, 1, 2), 0)
    assert _reason(ack[:-4] + b"\0\0\0\0" + ack[-4:]) is DropReason.BAD_LENGTH
    # bad ICRC through the checked frame path
    ip_udp = wire.ip_udp_headers(SRC4, DST4, 0xC000, len(send))
    send = wire.encode_bytes(Packet(Opcode.RC_SEND_ONLY, 1, 2, b"abcde"), wire.icrc_prefix(ip_udp))
    assert wire.decode_frame(wire.split_ip(ip_udp + send)).psn == 2  # type: ignore[arg-type]
    frame = wire.split_ip(ip_udp + send[:-1] + bytes((send[-1] ^ 0x80,)))
    assert frame is not None
    with pytest.raises(Malformed) as e:
        wire.decode_frame(frame)
    assert e.value.reason is DropReason.BAD_ICRC
    assert wire.decode_frame(frame, check=False).payload.tobytes() == b"abcde"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120))
def test_garbage_never_escapes_as_another_error(data: bytes) -> None:
    try:
        p = iba.decode(data)
    except Malformed:
        return
    assert p.opcode in set(Opcode)
    assert len(p.payload) <= len(data) - pk.HDR_LEN[p.opcode] - pk.ICRC_LEN


def test_header_sequences_follow_rxe_order() -> None:
    names = {op: tuple(t.name for t in iba.FORMATS[op].headers) for op in Opcode}  # type: ignore[union-attr]
    assert names[Opcode.RC_RDMA_WRITE_ONLY_IMM] == ("BTH", "RETH", "ImmDt")
    assert names[Opcode.UD_SEND_ONLY_IMM] == ("BTH", "DETH", "ImmDt")
    assert names[Opcode.RC_ATOMIC_ACKNOWLEDGE] == ("BTH", "AETH", "AtomicAckETH")
    assert names[Opcode.RC_COMPARE_SWAP] == ("BTH", "AtomicETH")
    assert names[Opcode.RC_SEND_ONLY_INV] == ("BTH", "IETH")
    assert names[Opcode.RC_RDMA_READ_RESPONSE_MIDDLE] == ("BTH",)
    assert names[Opcode.UC_SEND_LAST_IMM] == ("BTH", "ImmDt")
    sizes = {t.name: t.size for t in (iba.BTH, iba.RETH, iba.AETH, iba.DETH, iba.IMMDT,
                                      iba.IETH, iba.ATOMIC_ETH, iba.ATOMIC_ACK_ETH)}  # fmt: skip
    assert sizes == {"BTH": 12, "RETH": 16, "AETH": 4, "DETH": 8, "ImmDt": 4, "IETH": 4,
                     "AtomicETH": 28, "AtomicAckETH": 8}  # fmt: skip


def test_dump_names_the_fields() -> None:
    p = Packet(Opcode.UD_SEND_ONLY, 1, 5, b"\0" * 3, ack_req=True)
    p.qkey, p.src_qpn = pk.GSI_QKEY, 1
    text = iba.dump(wire.encode_bytes(p, 0))
    assert "Opcode: UD_SEND_ONLY (0x64)" in text
    assert "Destination Queue Pair: 0x000001" in text
    assert "Queue Key: 0x80010000" in text
    assert "Payload: 3 bytes, pad 1" in text


def test_udp_source_ports_match_kernel_rxe() -> None:
    # roce-wire.md 2.6, each checked there against real captures
    assert wire.qp_udp_sport(1) == 0xD872
    assert wire.qp_udp_sport(0x22) == 0xFF28
    assert wire.qp_udp_sport(0x23) == 0xD79A
    assert wire.connected_udp_sport(0, 0x1B, 0x1D) == 0xC30F
    assert wire.connected_udp_sport(0, 0x1D, 0x1B) == 0xC30F
    assert wire.flow_label_to_sport(0x70BBD) == 0xCBA1
    assert wire.connected_udp_sport(0x70BBD, 5, 6) == 0xCBA1
    assert all(0xC000 <= wire.qp_udp_sport(q) <= 0xFFFF for q in range(0, 1 << 24, 4099))


def test_ip_headers_have_valid_checksums() -> None:
    h = wire.ip_udp_headers(SRC4, DST4, 0xC000, 100, ident=0x1234)
    assert wire.ip_checksum(h[:20]) == 0  # a correct header sums to zero
    assert h[6] == 0x40  # DF
    assert h[20:28] == bytes.fromhex("c00012b7") + (108).to_bytes(2, "big") + b"\0\0"
    h6 = wire.ip_udp_headers(SRC6, DST6, 0xC000, 100)
    assert len(h6) == 48 and h6[6] == 17 and h6[4:6] == (108).to_bytes(2, "big")


def _capture_frames() -> list[wire.Frame]:
    if not CAPTURES.is_dir():
        pytest.skip(f"kernel-rxe captures absent ({CAPTURES})")
    frames = []
    for path in sorted(CAPTURES.glob("*.pcap")):
        linktype, records = read_pcap(path)
        assert linktype == 1
        for r in records:
            f = wire.split_ethernet(r.data)
            if f is not None:
                frames.append(f)
    return frames


def test_real_kernel_rxe_frames_decode_and_reencode_byte_exact() -> None:
    frames = _capture_frames()
    assert len(frames) > 100
    seen = set()
    for f in frames:
        prefix = wire.icrc_prefix(f.ip_udp)
        assert wire.icrc_ok(f.udp_payload, prefix)
        p = wire.decode_frame(f)
        seen.add(p.opcode)
        assert wire.encode_bytes(p, prefix) == bytes(f.udp_payload)
    assert {Opcode.RC_SEND_ONLY, Opcode.RC_RDMA_WRITE_FIRST, Opcode.RC_RDMA_READ_REQUEST,
            Opcode.RC_FETCH_ADD, Opcode.RC_ATOMIC_ACKNOWLEDGE, Opcode.UD_SEND_ONLY} <= seen


def test_real_kernel_rxe_ud_ports_follow_the_qp_hash() -> None:
    for f in _capture_frames():
        p = iba.decode(f.udp_payload)
        if p.opcode == Opcode.UD_SEND_ONLY:
            assert f.sport == wire.qp_udp_sport(p.src_qpn), hex(p.src_qpn)
