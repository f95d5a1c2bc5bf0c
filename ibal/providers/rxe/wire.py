"""The RoCEv2 framing of IBA transport packets: the ICRC, UDP/IP encapsulation, captures.

The transport headers themselves are :mod:`ibal.wire.iba` (shared with the
mock's InfiniBand captures); this module adds what RoCEv2 wraps around them.
Facts: ``/work/shared/spec/roce-wire.md`` section 2 (Linux ``rxe_icrc.c``,
``rxe_net.c``).

The receive path: :func:`decode_frame` splits what a socket read into layers,
checks the ICRC (:func:`icrc_ok`, given the IP/UDP headers the packet came with)
and decodes the headers.  The send path: :func:`encode` gives the UDP payload,
ICRC included, for a packet and its IP/UDP addressing.
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from ibal.wire import packet as pk
from ibal.wire.fields import Buffer, F, Kind, Table
from ibal.wire.iba import ICRC_LEN, DropReason, Malformed, decode, encode_headers
from ibal.wire.packet import Packet
from ibal.wire.pcap import LINKTYPE_ETHERNET, PcapWriter, capture_for

ROCE_V2_PORT: Final = pk.ROCE_V2_PORT


def encode(p: Packet, prefix: int) -> tuple[bytes, Buffer, bytes]:
    """The UDP payload of ``p`` as (headers, payload, pad + ICRC), ready for ``sendmsg``.

    ``prefix`` is :func:`icrc_prefix_ipv4`/``_ipv6`` of the datagram's IP/UDP headers.
    """
    hdr = encode_headers(p)
    trailer = bytes(p.pad)
    b4 = hdr[4]
    hdr[4] = 0xFF  # BTH byte 4 (FECN, BECN, resv6) counts as all ones
    crc = zlib.crc32(hdr, prefix)
    hdr[4] = b4
    if p.payload:
        crc = zlib.crc32(p.payload, crc)
    if trailer:
        crc = zlib.crc32(trailer, crc)
    return bytes(hdr), p.payload, trailer + crc.to_bytes(4, "little")


def encode_bytes(p: Packet, prefix: int) -> bytes:
    """:func:`encode` joined into one ``bytes``."""
    h, pl, t = encode(p, prefix)
    return b"".join((h, pl, t))


# ----------------------------------------------------------------- ICRC

# CRC-32 register after the 8 masked (all ones) LRH bytes RoCEv2 stands in for.
_LRH_ONES: Final = b"\xff" * 8
ICRC_SEED: Final = zlib.crc32(_LRH_ONES)
_IPV4_MASKED: Final = struct.Struct(">BBHHHBBH4s4sHHHH")
_IPV6_MASKED: Final = struct.Struct(">IHBB16s16sHHHH")


def icrc_prefix_ipv4(
    src: bytes, dst: bytes, udp_payload_len: int, sport: int,
    *, ident: int = 0, frag: int = 0x4000, dport: int = ROCE_V2_PORT,
) -> int:  # fmt: skip
    """CRC register after the masked IPv4 and UDP headers of a RoCEv2 datagram.

    Masked (all ones): TOS, TTL, IP checksum, UDP checksum; covered as sent:
    total length, ID, flags/fragment offset (``frag``, DF by default),
    protocol, addresses, UDP ports and length.  A UDP socket cannot see the IP
    ID of what it receives; an unconnected socket sending with DF set sends ID 0.
    """
    udp_len = 8 + udp_payload_len
    hdr = _IPV4_MASKED.pack(
        0x45, 0xFF, 20 + udp_len, ident, frag, 0xFF, 17, 0xFFFF, src, dst,
        sport, dport, udp_len, 0xFFFF,
    )  # fmt: skip
    return zlib.crc32(hdr, ICRC_SEED)


def icrc_prefix_ipv6(
    src: bytes, dst: bytes, udp_payload_len: int, sport: int,
    *, dport: int = ROCE_V2_PORT,
) -> int:  # fmt: skip
    """CRC register after the masked IPv6 and UDP headers (traffic class, flow
    label, hop limit and UDP checksum masked)."""
    udp_len = 8 + udp_payload_len
    hdr = _IPV6_MASKED.pack(
        0x6FFFFFFF, udp_len, 17, 0xFF, src, dst, sport, dport, udp_len, 0xFFFF
    )
    return zlib.crc32(hdr, ICRC_SEED)


def icrc_prefix(ip_udp: Buffer) -> int:
    """The CRC register after the masked headers of a received IPv4 or IPv6 + UDP header."""
    if len(ip_udp) >= 28 and ip_udp[0] == 0x45:
        h = bytearray(ip_udp[:28])
        h[1] = 0xFF
        h[8] = 0xFF
        h[10:12] = b"\xff\xff"
        h[26:28] = b"\xff\xff"
        return zlib.crc32(h, ICRC_SEED)
    if len(ip_udp) >= 48 and ip_udp[0] >> 4 == 6:
        h = bytearray(ip_udp[:48])
        h[0:4] = b"\x6f\xff\xff\xff"
        h[7] = 0xFF
        h[46:48] = b"\xff\xff"
        return zlib.crc32(h, ICRC_SEED)
    raise Malformed(DropReason.SHORT, "not an option-less IPv4 or IPv6 header + UDP")


def icrc(udp_payload: Buffer, prefix: int) -> int:
    """The ICRC of a UDP payload (BTH ... pad), excluding its last 4 bytes."""
    mv = udp_payload if isinstance(udp_payload, memoryview) else memoryview(udp_payload)
    bth = bytearray(mv[: pk.BTH_LEN])
    bth[4] = 0xFF
    return zlib.crc32(mv[pk.BTH_LEN : -ICRC_LEN], zlib.crc32(bth, prefix))


def icrc_ok(udp_payload: Buffer, prefix: int) -> bool:
    """Whether the last 4 bytes of ``udp_payload`` are its ICRC (little-endian)."""
    if len(udp_payload) < pk.BTH_LEN + ICRC_LEN:
        return False
    got = int.from_bytes(udp_payload[-ICRC_LEN:], "little")
    return icrc(udp_payload, prefix) == got


def check_icrc(udp_payload: Buffer, prefix: int) -> None:
    """Raise :class:`Malformed` ``BAD_ICRC`` unless the ICRC matches."""
    if not icrc_ok(udp_payload, prefix):
        raise Malformed(DropReason.BAD_ICRC, "ICRC mismatch")


# ----------------------------------------------------------------- UDP source port


def hash_32(value: int, bits: int) -> int:
    """Linux ``hash_32``: golden-ratio multiplicative hash to ``bits`` bits."""
    return ((value * 0x61C88647) & 0xFFFFFFFF) >> (32 - bits)


def qp_udp_sport(qpn: int) -> int:
    """Source port a QP gets at creation (UD, GSI; RC/UC until an AV with GRH)."""
    return 0xC000 + (hash_32(qpn, 14) & 0x3FFF)


def flow_label(lqpn: int, rqpn: int) -> int:
    """``rdma_calc_flow_label``: symmetric in the two QPNs."""
    v = (lqpn * rqpn) & 0xFFFFFFFFFFFFFFFF
    v ^= v >> 20
    v ^= v >> 40
    return v & 0xFFFFF


def flow_label_to_sport(fl: int) -> int:
    """``rdma_flow_label_to_udp_sport``."""
    return 0xC000 | ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14))


def connected_udp_sport(fl: int, lqpn: int, rqpn: int) -> int:
    """RC/UC source port after ``modify_qp`` with a GRH (``rdma_get_udp_sport``)."""
    if fl == 0:
        fl = flow_label(lqpn, rqpn)
    return flow_label_to_sport(fl)


# ----------------------------------------------------------------- encapsulation

ETHERNET: Final = Table("Ethernet", [
    F("dst", 48, kind=Kind.MAC, title="Destination"),
    F("src", 48, kind=Kind.MAC, title="Source"),
    F("ethertype", 16, hex=True, title="Type"),
])  # fmt: skip
IPV4: Final = Table("IPv4", [
    F("version", 4, default=4), F("ihl", 4, default=5),
    F("tos", 8, hex=True, title="Differentiated Services"),
    F("total_length", 16, title="Total Length"),
    F("ident", 16, hex=True, title="Identification"),
    F("flags", 3, hex=True, title="Flags", default=2), F("frag_offset", 13),
    F("ttl", 8, title="Time to Live", default=64),
    F("protocol", 8, title="Protocol", default=17),
    F("checksum", 16, hex=True, title="Header Checksum"),
    F("src", 32, kind=Kind.IPV4, title="Source Address"),
    F("dst", 32, kind=Kind.IPV4, title="Destination Address"),
])  # fmt: skip
IPV6: Final = Table("IPv6", [
    F("version", 4, default=6), F("tclass", 8, hex=True), F("flow", 20, hex=True),
    F("payload_length", 16), F("next_header", 8, default=17),
    F("hop_limit", 8, default=64),
    F("src", 128, kind=Kind.IPV6), F("dst", 128, kind=Kind.IPV6),
])  # fmt: skip
UDP: Final = Table("UDP", [
    F("sport", 16, title="Source Port"),
    F("dport", 16, title="Destination Port", default=ROCE_V2_PORT),
    F("length", 16, title="Length"),
    F("checksum", 16, hex=True, title="Checksum"),
])  # fmt: skip


def ip_checksum(hdr: Buffer) -> int:
    """The Internet checksum (RFC 1071) of a header whose checksum field is zero."""
    n = len(hdr)
    words: tuple[int, ...] = struct.unpack(f">{n // 2}H", bytes(hdr[: n - n % 2]))
    s = sum(words) + (hdr[-1] << 8 if n % 2 else 0)
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ip_bytes(addr: str | bytes) -> bytes:
    """4 or 16 raw bytes from an address string, or raw bytes passed through."""
    if isinstance(addr, bytes):
        if len(addr) not in (4, 16):
            raise ValueError(f"address of {len(addr)} bytes")
        return addr
    return ipaddress.ip_address(addr).packed


def ip_udp_headers(
    src: bytes, dst: bytes, sport: int, udp_payload_len: int,
    *, ttl: int = 64, tos: int = 0, ident: int = 0, flow: int = 0,
    dport: int = ROCE_V2_PORT,
) -> bytes:  # fmt: skip
    """IPv4 (DF, real checksum) or IPv6 header plus UDP header (checksum 0, as rxe sends)."""
    udp_len = 8 + udp_payload_len
    udp = UDP.pack(sport, dport, udp_len, 0)
    if len(src) == 4:
        ip = bytearray(
            IPV4.pack(4, 5, tos, 20 + udp_len, ident, 2, 0, ttl, 17, 0, src, dst)
        )
        ip[10:12] = ip_checksum(ip).to_bytes(2, "big")
        return bytes(ip) + udp
    return IPV6.pack(6, tos, flow, udp_len, 17, ttl, src, dst) + udp


def ethernet_frame(
    ip_udp: bytes, udp_payload: Buffer, *, src_mac: bytes = b"\x02\0\0\0\0\x01",
    dst_mac: bytes = b"\x02\0\0\0\0\x02",
) -> bytes:  # fmt: skip
    """An Ethernet II frame around IP/UDP headers and the RoCEv2 payload."""
    etype = 0x0800 if ip_udp[0] >> 4 == 4 else 0x86DD
    return ETHERNET.pack(dst_mac, src_mac, etype) + ip_udp + bytes(udp_payload)


@dataclass(frozen=True)
class Frame:
    """A RoCEv2 frame split into its layers (from a capture or a raw socket)."""

    ip_udp: bytes  # IP header + UDP header
    udp_payload: memoryview
    src: bytes
    dst: bytes
    sport: int
    dport: int


def split_ip(data: Buffer) -> Frame | None:
    """IP datagram -> layers, or ``None`` if it is not UDP to or from port 4791.

    Lengths come from the datagram, so a short or lying one (an IPv4 total length
    below the headers, a UDP length past the end) is ``None`` too, never an error.
    """
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if len(mv) >= 28 and mv[0] >> 4 == 4:
        ihl = (mv[0] & 0xF) * 4
        if mv[9] != 17 or ihl != 20:
            return None
        src, dst, hdr_len = bytes(mv[12:16]), bytes(mv[16:20]), 20
        total = int.from_bytes(mv[2:4], "big")
        if total < 28:
            return None
        mv = mv[:total]
    elif len(mv) >= 48 and mv[0] >> 4 == 6:
        if mv[6] != 17:
            return None
        src, dst, hdr_len = bytes(mv[8:24]), bytes(mv[24:40]), 40
    else:
        return None
    if len(mv) < hdr_len + 8:
        return None
    sport, dport, ulen = struct.unpack_from(">HHH", mv, hdr_len)
    if dport != ROCE_V2_PORT or ulen < 8 or hdr_len + ulen > len(mv):
        return None
    return Frame(
        bytes(mv[: hdr_len + 8]), mv[hdr_len + 8 : hdr_len + ulen], src, dst, sport, dport
    )


def split_ethernet(frame: Buffer) -> Frame | None:
    """Ethernet II frame -> layers, or ``None`` if it is not RoCEv2."""
    mv = frame if isinstance(frame, memoryview) else memoryview(frame)
    if len(mv) < 14 or bytes(mv[12:14]) not in (b"\x08\x00", b"\x86\xdd"):
        return None
    return split_ip(mv[14:])


def decode_frame(f: Frame, *, check: bool = True) -> Packet:
    """Decode a frame's payload and (by default) check its ICRC; fills the
    record's network fields (addresses, source port, IP header)."""
    if check:
        check_icrc(f.udp_payload, icrc_prefix(f.ip_udp))
    p = decode(f.udp_payload)
    p.src_ip, p.dst_ip, p.src_port = f.src, f.dst, f.sport
    p.net_hdr = f.ip_udp[:-8]
    return p


__all__: Sequence[str] = (
    "ICRC_SEED", "Frame",
    "capture_frame", "check_icrc", "connected_udp_sport", "decode_frame",
    "encode", "encode_bytes", "ethernet_frame", "flow_label",
    "flow_label_to_sport", "icrc", "icrc_ok", "icrc_prefix", "icrc_prefix_ipv4",
    "icrc_prefix_ipv6", "ip_bytes", "ip_checksum", "ip_udp_headers", "qp_udp_sport",
    "rxe_capture", "split_ethernet", "split_ip",
)  # fmt: skip


# ----------------------------------------------------------------- capture


def _mac_for(ip: bytes) -> bytes:
    # Captures have no real MACs (the socket layer never sees them): a locally
    # administered address derived from the IP keeps conversations apart.
    return b"\x02" + zlib.crc32(ip).to_bytes(4, "big") + b"\x01"


def capture_frame(
    udp_payload: Buffer, src: bytes, dst: bytes, sport: int,
    *, dport: int = ROCE_V2_PORT, ttl: int = 64,
) -> bytes:  # fmt: skip
    """The Ethernet frame a capture shows for one RoCEv2 datagram.

    The IP header is the one the ICRC was computed over for what ibal sends
    (ID 0, DF); for received datagrams, whose IP ID the socket does not show,
    it is a faithful reconstruction except for that ID.
    """
    ip_udp = ip_udp_headers(src, dst, sport, len(udp_payload), ttl=ttl, dport=dport)
    if len(src) == 16:
        # IPv6 forbids a zero UDP checksum and a kernel UDP socket sends a real
        # one; the ICRC masks it, so it only matters to the capture's readers.
        ulen = 8 + len(udp_payload)
        pseudo = src + dst + struct.pack(">IxxxB", ulen, 17) + ip_udp[40:] + bytes(udp_payload)
        ck = ip_checksum(pseudo) or 0xFFFF
        ip_udp = ip_udp[:46] + ck.to_bytes(2, "big")
    return ethernet_frame(ip_udp, udp_payload, src_mac=_mac_for(src), dst_mac=_mac_for(dst))


def rxe_capture(option: str | None = None) -> PcapWriter | None:
    """The process's RoCEv2 capture file (a device's ``capture`` option, else
    ``IBAL_CAPTURE``), or ``None``; write :func:`capture_frame` results to it."""
    return capture_for(LINKTYPE_ETHERNET, option)
