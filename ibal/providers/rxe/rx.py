"""The receive half of the rxe socket layer: datagrams in a ring -> checked packets.

:class:`RxDecoder` turns the datagrams one ``recvmmsg`` left in a
:class:`~ibal.providers.rxe.mmsg.RecvRing` into :class:`Packet` records:
whole IPv4 datagrams from a raw socket (ICRC over the real IP header) or UDP
payloads, GRO trains included (ICRC over the headers the sender is known to
use: IPv4 ID 0 and DF, or IPv6).  Each bad datagram is counted under its
drop reason; nothing in a datagram can raise out of :meth:`RxDecoder.decode_batch`.
"""

from __future__ import annotations

import zlib
from typing import Final

from ibal.providers.rxe import fastpath, mmsg, wire
from ibal.providers.rxe.counters import DeviceCounters
from ibal.wire import iba
from ibal.wire.packet import Packet
from ibal.wire.pcap import PcapWriter


class RxDecoder:
    """Decodes and checks the datagrams of a receive ring (used by one receive thread)."""

    def __init__(
        self, ring: mmsg.RecvRing, counters: DeviceCounters, capture: PcapWriter | None,
        crc32: fastpath.Crc32 = zlib.crc32,
    ) -> None:  # fmt: skip
        self.ring = ring
        self._crc32 = crc32  # the engine's (fastpath.payload_crc32)
        self.counters = counters
        self.capture = capture
        # (source, destination, port, length) -> (ICRC prefix, rebuilt IP header), UDP path
        self._udp_cache: dict[tuple[bytes, bytes, int, int], tuple[int, bytes]] = {}

    def decode_batch(self, n: int, rx_raw: bool, dst: bytes) -> list[Packet]:
        """The good packets among the ``n`` datagrams in the ring; the rest counted."""
        ring = self.ring
        c = self.counters
        c.rx_batches += 1
        out: list[Packet] = []
        for i in range(n):
            data = ring.datagram(i)
            c.rx_datagrams += 1
            c.rx_bytes += len(data)
            try:
                if ring.truncated(i):
                    c.drop("truncated")
                elif rx_raw:
                    self._from_ip(data, dst, out)
                else:
                    self._from_udp(data, dst, i, out)
            except Exception:  # hostile input must never stop the thread
                c.drop("handler_error")
        return out

    def decode_one(self, i: int, rx_raw: bool, dst: bytes) -> list[Packet]:
        """Datagram ``i`` of the ring as :meth:`decode_batch` would take it (the fast
        path's hand-back; the batch itself was counted by the caller)."""
        c = self.counters
        out: list[Packet] = []
        data = self.ring.datagram(i)
        c.rx_datagrams += 1
        c.rx_bytes += len(data)
        try:
            if self.ring.truncated(i):
                c.drop("truncated")
            elif rx_raw:
                self._from_ip(data, dst, out)
            else:
                self._from_udp(data, dst, i, out)
        except Exception:  # hostile input must never stop the thread
            c.drop("handler_error")
        return out

    def _accept(
        self, udp: memoryview, crc: int, src: bytes, sport: int, net_hdr: bytes, dst: bytes,
        out: list[Packet],
    ) -> None:  # fmt: skip
        """Decode, finish the ICRC (``crc``: the register after the masked IP/UDP/BTH), keep."""
        c = self.counters
        if self.capture is not None:
            self.capture.write(wire.capture_frame(udp, src, dst, sport))
        n = len(udp)
        # structure first, then the ICRC, in kernel rxe's order (rxe_recv.c)
        try:
            p = _decode(udp)
        except iba.Malformed as e:
            c.drop(e.reason.value)
            return
        if self._crc32(udp[_BTH_LEN : n - 4], crc) != int.from_bytes(udp[n - 4 :], "little"):
            c.drop(_BAD_ICRC)
            return
        p.src_ip = src
        p.dst_ip = dst
        p.src_port = sport
        p.net_hdr = net_hdr
        out.append(p)

    def _from_ip(self, data: memoryview, dst: bytes, out: list[Packet]) -> None:
        """A whole IPv4 datagram from the raw socket (the filter passed only port 4791)."""
        c = self.counters
        n = len(data)
        if n < 28 or data[0] >> 4 != 4:
            c.drop("not_roce")
            return
        if data[0] != 0x45:
            c.drop("ip_options")
            return
        total = min(int.from_bytes(data[2:4], "big"), n)
        ulen = int.from_bytes(data[24:26], "big")
        if ulen < 8 + _MIN_PACKET or 20 + ulen > total:
            c.drop(_SHORT)
            return
        # the masked IP, UDP and BTH headers in one go (roce-wire.md 2.5)
        m = bytearray(data[:40])
        m[1] = m[8] = m[32] = 0xFF
        m[10:12] = m[26:28] = b"\xff\xff"
        crc = zlib.crc32(m, _SEED)
        net_hdr = bytes(data[:20])
        sport = int.from_bytes(data[20:22], "big")
        self._accept(data[28 : 20 + ulen], crc, net_hdr[12:16], sport, net_hdr, dst, out)

    def _from_udp(self, data: memoryview, dst: bytes, i: int, out: list[Packet]) -> None:
        """One UDP payload (or a GRO train of them) from the UDP socket."""
        ring = self.ring
        if not data:
            self.counters.drop(_SHORT)
            return
        src, sport = ring.source(i)
        seg = ring.gro_size(i) or len(data)
        v4 = len(dst) == 4
        cache = self._udp_cache
        for off in range(0, len(data), seg):
            udp = data[off : off + seg]
            n = len(udp)
            key = (src, dst, sport, n)
            hit = cache.get(key)
            if hit is None:
                if len(cache) > 1024:
                    cache.clear()
                if v4:
                    hit = (
                        wire.icrc_prefix_ipv4(src, dst, n, sport),
                        wire.ip_udp_headers(src, dst, sport, n)[:20],
                    )
                else:
                    hit = (
                        wire.icrc_prefix_ipv6(src, dst, n, sport),
                        wire.ip_udp_headers(src, dst, sport, n)[:40],
                    )
                cache[key] = hit
            prefix, net_hdr = hit
            if n < _MIN_PACKET:
                self.counters.drop(_SHORT)
                continue
            bth = bytearray(udp[:_BTH_LEN])
            bth[4] = 0xFF
            self._accept(udp, zlib.crc32(bth, prefix), src, sport, net_hdr, dst, out)


_BTH_LEN: Final = 12
_MIN_PACKET: Final = _BTH_LEN + iba.ICRC_LEN
_SEED: Final = wire.ICRC_SEED
_SHORT: Final = iba.DropReason.SHORT.value
_BAD_ICRC: Final = iba.DropReason.BAD_ICRC.value
_decode: Final = iba.decode
