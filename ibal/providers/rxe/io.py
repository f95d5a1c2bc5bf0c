"""The rxe socket layer: UDP port 4791 on a device's addresses, batched both ways.

One :class:`DeviceIO` per device.  For each local address it opens:

* IPv4, receive mode ``raw`` (the default): a ``SOCK_RAW``/``IPPROTO_UDP``
  socket bound to the address with a classic BPF filter for UDP port 4791
  that is not a fragment.  It reads whole IP datagrams, so the ICRC is checked
  over the IP ID the sender really used (kernel rxe varies it; a UDP socket
  never sees it).  The same socket sends, choosing the UDP source port per
  packet.  A UDP socket bound to the address and port 4791 stays open, with
  a drop-all filter, only so the port is owned (no ICMP port unreachable, no
  second engine on the address).
* IPv4, receive mode ``udp``: the UDP socket receives (``recvmmsg``, GRO) and
  the ICRC is checked as if the IP ID were 0, which is what ibal sends (DF,
  unconnected): fast, but frames from kernel rxe fail the check.
* IPv6: the UDP socket receives (IPv6 has no ID, nothing is hidden), with
  ``UDP_NO_CHECK6_RX`` since kernel rxe sends a zero UDP checksum; a raw
  IPv6 socket (drop-all filter, kernel-computed checksum) sends.

A receive thread per device waits on all its sockets, reads up to
``batch`` datagrams per ``recvmmsg``, decodes each (codec
:func:`~ibal.providers.rxe.wire.decode`, ICRC checked) and hands the good
packets of one batch as a list to the ``on_packets`` callback; malformed ones
are counted per reason and dropped.  Nothing that arrives can stop the thread.

Sending: :meth:`DeviceIO.send` encodes a packet (ICRC over the IP/UDP headers
the kernel will build: DF, ID 0, TTL 64) and queues it; a full batch or
:meth:`DeviceIO.flush` sends the queue with one ``sendmmsg`` per socket.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple

from ibal.netns import NetNs
from ibal.providers.rxe import fastpath, mmsg, wire
from ibal.providers.rxe.counters import DeviceCounters
from ibal.providers.rxe.netif import IpAddress
from ibal.providers.rxe.rx import RxDecoder
from ibal.wire import iba
from ibal.wire.fields import Buffer
from ibal.wire.packet import Packet, Train, WqeRun
from ibal.wire.pcap import PcapWriter

ROCE_PORT: Final = wire.ROCE_V2_PORT
PARK: Final = 0.002
"""Seconds the receive thread leaves the sockets alone after a ``poll_rx``."""
RxMode = Literal["raw", "udp"]

_IP_MTU_DISCOVER: Final = 10
_IP_PMTUDISC_DO: Final = 2
_IPV6_CHECKSUM: Final = 7
_RCVBUF: Final = 8 << 20
_SNDBUF: Final = 4 << 20
_UDP_HDR: Final = struct.Struct(">HHHH")
_BTH_WORD2: Final = struct.Struct(">I")  # AckReq, reserved, PSN
_ICRC: Final = struct.Struct("<I")

# classic BPF (linux/filter.h): code, jt, jf, k
_BPF_INSN: Final = struct.Struct("=HBBI")
_RET: Final = 0x06
_LD_H_ABS: Final = 0x28
_LD_H_IND: Final = 0x48
_LDX_B_MSH: Final = 0xB1
_JEQ_K: Final = 0x15
_JSET_K: Final = 0x45


def attach_filter(sock: socket.socket, prog: list[tuple[int, int, int, int]]) -> None:
    """Attach a classic BPF program (``SO_ATTACH_FILTER``)."""
    import ctypes

    code = b"".join(_BPF_INSN.pack(*i) for i in prog)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("=HxxxxxxQ", len(prog), ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, mmsg.SO_ATTACH_FILTER, fprog)


DROP_ALL: Final = [(_RET, 0, 0, 0)]


def roce_ipv4_filter(port: int = ROCE_PORT) -> list[tuple[int, int, int, int]]:
    """BPF for a raw IPv4 socket: accept unfragmented UDP to ``port``, drop the rest."""
    return [
        (_LD_H_ABS, 0, 0, 6),  # flags + fragment offset
        (_JSET_K, 4, 0, 0x3FFF),  # MF or an offset: a fragment -> drop
        (_LDX_B_MSH, 0, 0, 0),  # x = IP header length
        (_LD_H_IND, 0, 0, 2),  # UDP destination port
        (_JEQ_K, 0, 1, port),
        (_RET, 0, 0, 0x40000),
        (_RET, 0, 0, 0),
    ]


@dataclass
class _Endpoint:
    """The sockets of one local address."""

    ip: IpAddress
    raw_ip: bytes
    udp: socket.socket  # owns ip:4791
    tx: socket.socket  # raw: sends with any source port
    rx: socket.socket  # what the receive thread reads
    rx_raw: bool  # rx delivers whole IP datagrams (IPv4 raw mode)
    batch: mmsg.SendBatch

    def close(self) -> None:
        for s in {self.udp, self.tx, self.rx}:
            s.close()


def _open(ip: IpAddress, port: int, rx_mode: RxMode, batch: int, scope: int) -> _Endpoint:
    """Sockets for ``ip``; ``OSError`` (EADDRINUSE when kernel rxe or another
    engine owns the port, EADDRNOTAVAIL for an address the host lacks)."""
    v4 = ip.version == 4
    fam = socket.AF_INET if v4 else socket.AF_INET6
    udp = socket.socket(fam, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    tx: socket.socket | None = None
    try:
        # no SO_REUSEADDR: a second bind of one address must fail, not share datagrams
        if v4:
            udp.bind((str(ip), port))
        else:
            udp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            udp.setsockopt(mmsg.SOL_UDP, mmsg.UDP_NO_CHECK6_RX, 1)
            udp.bind((str(ip), port, 0, scope))
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
        tx = socket.socket(fam, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.IPPROTO_UDP)
        tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SNDBUF)
        if v4:
            # DF set and, unconnected, IP ID 0: the ID the send-side ICRC assumes
            tx.setsockopt(socket.IPPROTO_IP, _IP_MTU_DISCOVER, _IP_PMTUDISC_DO)
            # multicast leaves from this address's interface, not by the routing table
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, ip.packed)
            tx.bind((str(ip), 0))
        else:
            tx.setsockopt(socket.IPPROTO_IPV6, _IPV6_CHECKSUM, 6)
            tx.bind((str(ip), 0, 0, scope))
        rx_raw = v4 and rx_mode == "raw"
        if rx_raw:
            attach_filter(udp, DROP_ALL)
            tx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
            attach_filter(tx, roce_ipv4_filter(port))
            rx = tx
        else:
            attach_filter(tx, DROP_ALL)  # a raw UDP socket would get a copy of every datagram
            if v4:
                with contextlib.suppress(OSError):  # kernels before 5.0
                    udp.setsockopt(mmsg.SOL_UDP, mmsg.UDP_GRO, 1)
            rx = udp
    except BaseException:
        udp.close()
        if tx is not None:
            tx.close()
        raise
    return _Endpoint(ip, ip.packed, udp, tx, rx, rx_raw, mmsg.SendBatch(batch))


class _Group(NamedTuple):
    """A multicast group's sockets: the UDP one bound to the group and port 4791 holds
    the membership; ``rx`` is what the receive thread reads (that same socket, or in
    IPv4 raw mode a raw one bound to the group, which sees the IP header)."""

    rx: socket.socket
    rx_raw: bool
    raw_ip: bytes
    member: socket.socket

    def close(self) -> None:
        for sock in {self.rx, self.member}:
            sock.close()


def _join(group: IpAddress, local: IpAddress, port: int, ifindex: int,
          rx_mode: RxMode) -> _Group:  # fmt: skip
    """Sockets that receive ``group``'s datagrams on ``local``'s interface.

    In IPv4 raw mode the datagrams are read from a raw socket bound to the group, as a
    unicast address's are: the ICRC covers the IP header's ID, which a sender such as
    Linux's rxe sets (not 0) and a UDP socket does not show.
    """
    v4 = group.version == 4
    sock = socket.socket(socket.AF_INET if v4 else socket.AF_INET6,
                         socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    raw: socket.socket | None = None
    try:
        # several devices (and processes) on one host may join one group
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if v4:
            sock.bind((str(group), port))
            mreq = group.packed + local.packed
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
        else:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.setsockopt(mmsg.SOL_UDP, mmsg.UDP_NO_CHECK6_RX, 1)
            sock.bind((str(group), port, 0, ifindex))
            mreq6 = group.packed + struct.pack("@I", ifindex)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, mreq6)
        if v4 and rx_mode == "raw":
            raw = socket.socket(socket.AF_INET, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                                socket.IPPROTO_UDP)  # fmt: skip
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
            attach_filter(raw, roce_ipv4_filter(port))
            raw.bind((str(group), 0))
            attach_filter(sock, DROP_ALL)
            return _Group(raw, True, group.packed, sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
    except BaseException:
        sock.close()
        if raw is not None:
            raw.close()
        raise
    return _Group(sock, False, group.packed, sock)


class DeviceIO:
    """Sockets, receive thread and send batching of one device.

    ``on_packets(packets)`` is called on the receive thread with the good
    packets of one batch (a list of :class:`Packet`, ``src_ip``/``dst_ip``/
    ``src_port``/``net_hdr`` filled); each ``payload`` is a view into the
    receive buffer, valid only until the callback returns (copy what must
    outlive it).  The callback may call :meth:`send`/:meth:`flush`; if it
    raises, the batch is counted as ``handler_error`` drops and the thread
    goes on.

    ``batch``: datagrams per ``recvmmsg``/``sendmmsg``; ``rx_mode``: see the
    module docstring; ``capture``: a pcap writer (``wire.rxe_capture()``).
    """

    def __init__(
        self,
        on_packets: Callable[[list[Packet]], None],
        counters: DeviceCounters | None = None,
        *,
        port: int = ROCE_PORT,
        rx_mode: RxMode = "raw",
        batch: int = 64,
        max_datagram: int = 65536,
        capture: PcapWriter | None = None,
        name: str = "rxe",
        engine: fastpath.Engine | None = None,
    ) -> None:
        self.engine: fastpath.Engine = fastpath.choose() if engine is None else engine
        """Which code does the byte work: ``c`` (fastpath.c) or ``python``."""
        self._crc32 = fastpath.payload_crc32(self.engine)
        self._ffi: Any = None
        self._fill_train: Any = None  # fastpath.c's rxe_fill_train on the C engine
        self._fill_wqe: Any = None  # and its rxe_fill_wqe
        self._wqe: Any = None  # the struct rxe_wqe_run handed to it, reused
        self._wqe_key: tuple[object, ...] = ()  # the per-QP fields _wqe holds now
        if self.engine == "c":
            self._ffi, lib = fastpath.ffi_lib()
            self._fill_train = lib.rxe_fill_train
            if fastpath.fast_tx_enabled():
                self._fill_wqe = lib.rxe_fill_wqe
                self._wqe = self._ffi.new("struct rxe_wqe_run *")
        self.runs = self._fill_wqe is not None
        """Whether the engine should hand this device :class:`WqeRun` records
        (:meth:`send_run`): the C engine's send side."""
        self.on_packets = on_packets
        self.counters = counters if counters is not None else DeviceCounters()
        self.port = port
        self.rx_mode: RxMode = rx_mode
        self.batch = batch
        self.capture = capture
        self.name = name
        self._ring = mmsg.RecvRing(batch, max_datagram)
        self._decoder = RxDecoder(self._ring, self.counters, capture, self._crc32)
        self.rx_fast: Callable[[mmsg.RecvRing, int, Callable[[int], list[Packet]]], None] | None
        self.rx_fast = None
        """On the C engine, the CA's receive fast path (``Engine.on_ring``): it takes a
        raw IPv4 batch straight from the ring, decoding what it hands back itself."""
        self._endpoints: dict[IpAddress, _Endpoint] = {}
        self.own: frozenset[bytes] = frozenset()
        """The raw addresses (4 or 16 bytes) of this device: packets to them loop back."""
        self._groups: dict[IpAddress, _Group] = {}
        self._names: dict[bytes, bytes] = {}  # destination -> sockaddr
        # (source, destination, port, length) -> (ICRC prefix, UDP header) to send
        self._tx_cache: dict[tuple[bytes, bytes, int, int], tuple[int, bytes]] = {}
        self._lock = threading.RLock()  # endpoints and send batches
        # the receive ring and decoder: the receive thread's, or a busy poller's (poll_rx)
        self._rx_lock = threading.Lock()
        self._polled_at = 0.0  # time.monotonic() of the last poll_rx
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        # where the device lives: its later sockets (a multicast group's, opened from the
        # thread that attaches a QP) belong there too, whatever that thread's namespace
        self._netns = NetNs()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"{name}-rx", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------- addresses
    def add_address(self, ip: IpAddress, scope_id: int = 0) -> None:
        """Open the sockets of ``ip`` (idempotent); ``OSError`` when the port is taken.

        ``scope_id``: the interface index, for a link-local IPv6 address.
        """
        with self._lock:
            if ip in self._endpoints:
                return
            self._endpoints[ip] = _open(ip, self.port, self.rx_mode, self.batch, scope_id)
            self.own = frozenset(a.packed for a in self._endpoints)
        self._wake()

    def remove_address(self, ip: IpAddress) -> None:
        """Close the sockets of ``ip`` (no-op when it has none)."""
        with self._lock:
            ep = self._endpoints.pop(ip, None)
            self.own = frozenset(a.packed for a in self._endpoints)
        if ep is not None:
            self._wake()
            with self._lock:
                ep.close()

    def join(self, group: IpAddress, ifindex: int = 0) -> None:
        """Receive multicast ``group`` (idempotent) on the interface of this device's
        address of the group's family; ``KeyError`` without one, ``OSError`` from the
        kernel.  Sends to the group need nothing: they leave like any datagram."""
        with self._lock:
            if group in self._groups:
                return
            mine = [ip for ip in self._endpoints if ip.version == group.version]
            if not mine:
                raise KeyError(f"no IPv{group.version} address on {self.name}")
            local = mine[0]
            self._groups[group] = self._netns.run(
                lambda: _join(group, local, self.port, ifindex, self.rx_mode))
        self._wake()

    def leave(self, group: IpAddress) -> None:
        """Stop receiving ``group`` (no-op when not joined)."""
        with self._lock:
            g = self._groups.pop(group, None)
        if g is not None:
            self._wake()
            with self._lock:
                g.close()

    @property
    def addresses(self) -> tuple[IpAddress, ...]:
        with self._lock:
            return tuple(self._endpoints)

    def close(self) -> None:
        """Stop the receive thread, close every socket (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(5)
        with self._lock:
            for ep in self._endpoints.values():
                ep.close()
            self._endpoints.clear()
            self.own = frozenset()
            for g in self._groups.values():
                g.close()
            self._groups.clear()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._netns.close()

    def __enter__(self) -> DeviceIO:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- send
    def _endpoint_for(self, src: IpAddress | None, dst: bytes) -> _Endpoint:
        eps = self._endpoints
        if src is not None:
            return eps[src]
        n = len(dst)
        for ep in eps.values():
            if len(ep.raw_ip) == n:
                return ep
        raise KeyError(f"no IPv{4 if n == 4 else 6} address on {self.name}")

    def send(self, pkt: Packet, dst: bytes, sport: int, src: IpAddress | None = None) -> None:
        """Encode ``pkt`` (ICRC included) and queue it to ``dst`` (4 or 16 raw bytes).

        ``sport`` is the UDP source port (``wire.qp_udp_sport`` and friends);
        ``src`` the local address, by default the first of the family.  Sent
        when the batch fills or at :meth:`flush`.  ``KeyError`` without a
        local address of that family.
        """
        with self._lock:
            ep = self._endpoint_for(src, dst)
            hdr = iba.encode_headers(pkt)
            plen = len(hdr) + len(pkt.payload) + pkt.pad + iba.ICRC_LEN
            prefix, udp = self._tx_headers(ep, dst, sport, plen)
            b4 = hdr[4]
            hdr[4] = 0xFF  # BTH byte 4 counts as ones in the ICRC
            crc = zlib.crc32(hdr, prefix)
            hdr[4] = b4
            payload = pkt.payload
            if payload:
                crc = self._crc32(payload, crc)
            trailer = bytes(pkt.pad)
            if trailer:
                crc = zlib.crc32(trailer, crc)
            trailer += crc.to_bytes(4, "little")
            self._queue(ep, dst, (udp, hdr, payload, trailer), plen)

    def _tx_headers(self, ep: _Endpoint, dst: bytes, sport: int, plen: int) -> tuple[int, bytes]:
        """(ICRC register after the masked IP/UDP headers, UDP header), cached."""
        key = (ep.raw_ip, dst, sport, plen)
        hit = self._tx_cache.get(key)
        if hit is None:
            if len(self._tx_cache) > 4096:
                self._tx_cache.clear()
            if len(dst) == 4:
                prefix = wire.icrc_prefix_ipv4(ep.raw_ip, dst, plen, sport)
            else:
                prefix = wire.icrc_prefix_ipv6(ep.raw_ip, dst, plen, sport)
            hit = self._tx_cache[key] = (prefix, _UDP_HDR.pack(sport, self.port, 8 + plen, 0))
        return hit

    def send_train(self, train: Train, dst: bytes, sport: int,
                   src: IpAddress | None = None) -> None:
        """Queue the ``train.n`` packets of ``train`` to ``dst``, as :meth:`send` would
        each: one header template, PSN and AckReq patched per packet, the payload
        copied from the train's buffer straight into the send batch's slots."""
        with self._lock:
            ep = self._endpoint_for(src, dst)
            head = train.head
            hdr = iba.encode_headers(head)
            hlen = len(hdr)
            mtu = train.mtu
            plen = hlen + mtu + head.pad + iba.ICRC_LEN
            prefix, udp = self._tx_headers(ep, dst, sport, plen)
            b4 = hdr[4]
            hdr[4] = 0xFF  # the ICRC's view of the BTH; the slot gets the real byte back
            pad = bytes(head.pad)
            name = self._name(dst)
            batch = ep.batch
            arena = batch.arena
            slot = batch.slot
            data = train.data
            off = train.off
            psn0 = head.psn
            since = train.since + 1
            per = train.per_ack
            ackreq = 0x80000000 if train.reliable else 0
            pack_word = _BTH_WORD2.pack_into
            pack_crc = _ICRC.pack_into
            crc32 = self._crc32
            body = 8 + hlen
            end = body + mtu
            cap = self.capture
            n = train.n
            fill = self._fill_train
            if fill is not None:
                c_arena = self._ffi.from_buffer(arena)
                c_data = self._ffi.from_buffer(data)
            j = 0
            while j < n:
                m = min(batch.depth - batch.count, n - j)
                if m <= 0:
                    self._send(ep)
                    continue
                o = batch.reserve(name, m, 8 + plen) * slot
                o0 = o
                if fill is not None:
                    # the C twin of the loop below: one call per run of slots
                    if fill(c_arena, len(arena), o, slot, m, udp, bytes(hdr), hlen, b4, psn0, j,
                            since, per, ackreq, c_data, len(data), off, mtu, len(pad),
                            prefix):  # fmt: skip
                        batch.count = o0 // slot  # the reserved slots hold nothing: unqueue
                        raise ValueError("send_train: a packet falls outside its buffer")
                    o += m * slot
                for k in range(j, j + m) if fill is None else ():
                    word = (psn0 + k) & 0xFFFFFF
                    if (since + k) % per == 0:
                        word |= ackreq
                    pack_word(hdr, 8, word)
                    seg = data[off + k * mtu : off + (k + 1) * mtu]
                    crc = crc32(seg, crc32(hdr, prefix))
                    arena[o : o + 8] = udp
                    arena[o + 8 : o + body] = hdr
                    arena[o + 12] = b4
                    arena[o + body : o + end] = seg
                    if pad:
                        crc = crc32(pad, crc)
                        arena[o + end : o + end + len(pad)] = pad
                    pack_crc(arena, o + end + len(pad), crc)
                    o += slot
                j += m
                self.counters.tx_bytes += plen * m
                if cap is not None:
                    for c in range(o0, o, slot):
                        cap.write(wire.capture_frame(bytes(arena[c + 8 : c + 8 + plen]),
                                                     ep.raw_ip, dst, sport))
                if batch.full:
                    self._send(ep)

    def send_run(self, run: WqeRun, dst: bytes, sport: int,
                 src: IpAddress | None = None) -> None:
        """Queue the ``run.m`` packets of a WQE run to ``dst``, as :meth:`send` would
        each of ``run.packets()``: on the C engine one ``rxe_fill_wqe`` per run of
        free slots cuts them from the WQE's buffer; IPv6 and captures take the
        packets one by one."""
        with self._lock:
            ep = self._endpoint_for(src, dst)
            fill = self._fill_wqe
            if fill is None or len(dst) != 4 or self.capture is not None:
                for p in run.packets():
                    self.send(p, dst, sport, src)
                return
            ffi = self._ffi
            w = self._wqe
            data = run.data
            c_data = ffi.from_buffer(data)
            w.data = c_data
            w.data_len = len(data)
            w.va = run.va
            w.rkey = run.rkey
            w.dma_len = run.dma_len
            imm = run.imm
            w.imm_on = imm is not None
            w.imm = imm or 0
            w.reth = run.reth
            w.se = run.se
            w.first_psn = run.first_psn
            w.npkts = run.npkts
            key = (run.dest_qpn, run.pkey, run.mtu, run.ops, run.per_ack, run.reliable, sport,
                   dst, ep.raw_ip)  # fmt: skip
            if key != self._wqe_key:
                # what stays the same from one WQE of a QP to the next: set on a change only
                w.reliable = run.reliable
                w.per_ack = run.per_ack
                w.dest_qpn = run.dest_qpn
                w.pkey = run.pkey
                w.mtu = run.mtu
                w.op_first, w.op_middle, w.op_last, w.op_only = run.ops
                w.sport = sport
                w.dport = self.port
                w.icrc_dport = ROCE_PORT
                w.src_ip = list(ep.raw_ip)
                w.dst_ip = list(dst)
                self._wqe_key = key
            name = self._name(dst)
            batch = ep.batch
            c_arena = ffi.from_buffer(batch.arena)
            c_iov = ffi.from_buffer(batch.iovecs)
            k = run.k0
            end = k + run.m
            since = run.since
            per = run.per_ack
            last = run.npkts - 1
            while k < end:
                m = min(batch.depth - batch.count, end - k)
                if m <= 0:
                    self._send(ep)
                    continue
                first = batch.reserve(name, m, 0)
                got = fill(c_arena, len(batch.arena), batch.slot, c_iov, batch.depth, first,
                           w, k, m, since)  # fmt: skip
                if got < 0:
                    batch.count = first  # the reserved slots hold nothing: unqueue
                    raise ValueError("send_run: a packet falls outside its buffer")
                self.counters.tx_bytes += got
                k += m
                since = 0 if k > last else (since + m) % per
                if batch.full:
                    self._send(ep)

    def _name(self, dst: bytes) -> bytes:
        name = self._names.get(dst)
        if name is None:
            if len(self._names) > 4096:
                self._names.clear()
            name = self._names[dst] = mmsg.sockaddr(dst, 0)
        return name

    def send_datagram(
        self, udp_payload: Buffer, dst: bytes, sport: int, src: IpAddress | None = None
    ) -> None:
        """Queue a ready UDP payload (BTH ... ICRC) as is: tests and forged traffic."""
        with self._lock:
            ep = self._endpoint_for(src, dst)
            head = _UDP_HDR.pack(sport, self.port, 8 + len(udp_payload), 0)
            self._queue(ep, dst, (head, udp_payload), len(udp_payload))

    def _queue(self, ep: _Endpoint, dst: bytes, parts: tuple[Buffer, ...], plen: int) -> None:
        b = ep.batch
        b.add(self._name(dst), parts)
        c = self.counters
        c.tx_bytes += plen
        cap = self.capture
        if cap is not None:
            udp = b"".join(bytes(p) for p in parts)
            cap.write(wire.capture_frame(udp[8:], ep.raw_ip, dst, int.from_bytes(udp[:2], "big")))
        if b.full:
            self._send(ep)

    def _send(self, ep: _Endpoint) -> None:
        b = ep.batch
        queued = b.count
        sent, calls = b.send(ep.tx.fileno())
        c = self.counters
        c.tx_datagrams += sent
        c.tx_batches += calls
        if sent < queued:
            c.send_err += queued - sent

    def flush(self) -> None:
        """Send everything queued (one ``sendmmsg`` per address with traffic)."""
        with self._lock:
            for ep in self._endpoints.values():
                if ep.batch.count:
                    self._send(ep)

    # -------------------------------------------------------------- receive
    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _run(self) -> None:
        while not self._closed:
            with self._lock:
                eps: dict[int, _Endpoint | _Group] = {
                    ep.rx.fileno(): ep for ep in self._endpoints.values()
                }
                eps.update((g.rx.fileno(), g) for g in self._groups.values())
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            for fd in eps:
                poller.register(fd, select.POLLIN)
            parked = select.poll()
            parked.register(self._wake_r, select.POLLIN)
            rebuild = False
            while not rebuild and not self._closed:
                idle = time.monotonic() - self._polled_at
                try:
                    if idle < PARK:
                        # a thread busy-polls the sockets: stay off the CPU (and the
                        # GIL) rather than wake for every datagram it reads anyway
                        ready = parked.poll(int((PARK - idle) * 1000) + 1)
                    else:
                        ready = poller.poll()
                except InterruptedError:
                    continue
                for fd, _ev in ready:
                    if fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError, OSError):
                            os.read(self._wake_r, 4096)
                        rebuild = True
                    elif fd in eps:
                        try:
                            self._drain(eps[fd])
                        except OSError:
                            rebuild = True  # socket closed under us: re-read the endpoints

    def poll_rx(self) -> int:
        """Receive what is waiting, in the caller's thread; the datagrams read.

        For busy-polling consumers (``poll_cq`` on an empty CQ): the thread that
        waits for a completion makes the progress itself, instead of handing the
        GIL to the receive thread, which a busy poller only yields every
        ``sys.getswitchinterval()`` (5 ms).  When the receive thread is at work
        it waits for it (blocking on the lock hands the receive thread the GIL at
        once; skipping would leave the poller spinning until the switch interval).
        ``on_packets`` runs in the caller's thread, which must not hold a lock
        that ``on_packets`` takes (the CA lock).
        """
        self._polled_at = time.monotonic()
        with self._rx_lock:
            got = 0
            eps: list[_Endpoint | _Group] = [*self._endpoints.values(), *self._groups.values()]
            for ep in eps:
                with contextlib.suppress(OSError):  # closed under us
                    got += self._drain_locked(ep)
            return got

    def _drain(self, ep: _Endpoint | _Group) -> None:
        with self._rx_lock:
            self._drain_locked(ep)

    def _drain_locked(self, ep: _Endpoint | _Group) -> int:
        """Read batches from one socket until it is empty (bounded, to stay fair)."""
        ring = self._ring
        fd = ep.rx.fileno()
        got = 0
        for _ in range(16):
            n = ring.recv(fd)
            if not n:
                return got
            got += n
            fast = self.rx_fast
            if fast is not None and ep.rx_raw and len(ep.raw_ip) == 4 and self.capture is None:
                self.counters.rx_batches += 1
                try:
                    fast(ring, n, functools.partial(self._decoder.decode_one, rx_raw=True,
                                                    dst=ep.raw_ip))  # fmt: skip
                except Exception:  # the CA layer's bug must not kill the thread
                    self.counters.drop("handler_error", n)
                if n < ring.depth:
                    return got
                continue
            packets = self._decoder.decode_batch(n, ep.rx_raw, ep.raw_ip)
            if packets:
                try:
                    self.on_packets(packets)
                except Exception:  # the CA layer's bug must not kill the thread
                    self.counters.drop("handler_error", len(packets))
            if n < ring.depth:
                return got
        return got
