"""The rxe socket layer: two devices on 127.0.0.2/127.0.0.3, batching, hostile input, ICRC."""

from __future__ import annotations

import ipaddress
import os
import queue
import socket
import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netns_util import need_ip, netns

from ibal.providers.rxe import wire
from ibal.providers.rxe.io import DeviceIO, RxMode
from ibal.testing.helpers import wait_until
from ibal.wire import iba
from ibal.wire.packet import Opcode, Packet
from ibal.wire.pcap import LINKTYPE_ETHERNET, PcapWriter, read_pcap

A = ipaddress.ip_address("127.0.0.2")
B = ipaddress.ip_address("127.0.0.3")
WAIT = 20.0
GOLDEN = Path(__file__).resolve().parents[2] / "data" / "rxe-golden" / "kernel-rxe-requests.pcap"
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _root() -> None:
    need_ip()  # root for the raw sockets; CI fails instead of skipping


class Inbox:
    """Packets a device received (copied out of the ring), waited for without sleeps."""

    def __init__(self) -> None:
        self.q: queue.Queue[tuple[int, int, bytes, bytes, int, bytes]] = queue.Queue()
        self.batches: list[int] = []

    def __call__(self, packets: list[Packet]) -> None:
        self.batches.append(len(packets))
        for p in packets:
            self.q.put((p.opcode, p.psn, bytes(p.payload), p.src_ip, p.src_port, p.net_hdr))

    def take(self, n: int) -> list[tuple[int, int, bytes, bytes, int, bytes]]:
        return [self.q.get(timeout=WAIT) for _ in range(n)]


def _pair(mode: RxMode) -> Iterator[tuple[DeviceIO, DeviceIO, Inbox]]:
    inbox = Inbox()
    with DeviceIO(lambda _p: None, rx_mode=mode) as a, DeviceIO(inbox, rx_mode=mode) as b:
        a.add_address(A)
        b.add_address(B)
        yield a, b, inbox


@pytest.fixture(params=["raw", "udp"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[DeviceIO, DeviceIO, Inbox]]:
    yield from _pair(request.param)


def _write(psn: int, payload: bytes) -> Packet:
    p = Packet(Opcode.RC_RDMA_WRITE_MIDDLE, 0x12, psn, memoryview(payload))
    return p


def test_two_devices_exchange_packets_with_per_packet_source_ports(
    pair: tuple[DeviceIO, DeviceIO, Inbox],
) -> None:
    a, b, inbox = pair
    payloads = [bytes([i]) * (1 + 37 * i) for i in range(10)]  # odd sizes: pad bytes
    for i, pl in enumerate(payloads):
        a.send(_write(100 + i, pl), B.packed, wire.qp_udp_sport(0x11 + i))
    a.flush()
    got = inbox.take(10)
    assert [(op, psn, pl, src, sport) for op, psn, pl, src, sport, _ in got] == [
        (Opcode.RC_RDMA_WRITE_MIDDLE, 100 + i, pl, A.packed, wire.qp_udp_sport(0x11 + i))
        for i, pl in enumerate(payloads)
    ]
    net_hdr = got[0][5]
    assert len(net_hdr) == 20 and net_hdr[12:16] == A.packed and net_hdr[16:20] == B.packed
    assert net_hdr[4:6] == b"\0\0" and net_hdr[6] & 0x40  # ID 0, DF: what the ICRC assumed
    assert b.counters.dropped == 0
    assert a.counters.tx_datagrams == 10 and a.counters.tx_batches == 1


def test_batches_are_used_both_ways() -> None:
    gate = threading.Event()
    inbox = Inbox()

    def slow_first(packets: list[Packet]) -> None:
        gate.wait(WAIT)  # hold the receive thread so the rest queue up in the socket
        inbox(packets)

    with DeviceIO(lambda _p: None) as a, DeviceIO(slow_first, batch=64) as b:
        a.add_address(A)
        b.add_address(B)
        a.send(_write(0, b"first"), B.packed, 0xC000)
        a.flush()
        for i in range(1, 200):
            a.send(_write(i, b"x" * 512), B.packed, 0xC000)
        a.flush()
        gate.set()
        got = inbox.take(200)
        assert [g[1] for g in got] == list(range(200))
        # 1, then 199 datagrams as 64 + 64 + 64 + 7: five sendmmsg calls in all
        assert a.counters.tx_batches == 5
        assert max(inbox.batches) == 64
        assert b.counters.rx_batches <= 6


def test_a_device_in_another_process() -> None:
    child = textwrap.dedent(f"""
        import ipaddress, sys, threading
        from ibal.providers.rxe.io import DeviceIO
        done = threading.Event()
        n = [0]
        def echo(packets):
            for p in packets:
                dev.send(p, p.src_ip, p.src_port)
                n[0] += 1
            dev.flush()
            if n[0] >= 50:
                done.set()
        dev = DeviceIO(echo)
        dev.add_address(ipaddress.ip_address("{B}"))
        print("ready", flush=True)
        sys.exit(0 if done.wait(60) else 1)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        inbox = Inbox()
        with DeviceIO(inbox) as a:
            a.add_address(A)
            for i in range(50):
                a.send(_write(i, os.urandom(100 + i)), B.packed, 0xC000 + i)
            a.flush()
            got = inbox.take(50)
        assert sorted(g[1] for g in got) == list(range(50))
        assert all(g[3] == B.packed for g in got)
        assert proc.wait(WAIT) == 0
    finally:
        proc.kill()
        proc.wait()


def _good(psn: int = 7) -> bytes:
    """A valid datagram from A to B as a plain UDP socket would carry it (ID 0 assumed)."""
    p = Packet(Opcode.RC_SEND_ONLY, 0x11, psn, b"hello")
    hdr = iba.encode_headers(p)
    n = len(hdr) + 5 + p.pad + 4
    return wire.encode_bytes(p, wire.icrc_prefix_ipv4(A.packed, B.packed, n, 0xC001))


def test_forged_and_short_datagrams_are_dropped_by_reason_and_the_thread_lives(
    pair: tuple[DeviceIO, DeviceIO, Inbox],
) -> None:
    a, b, inbox = pair
    good = _good()
    bad_icrc = bytearray(good)
    bad_icrc[-1] ^= 1
    bad_tver = bytearray(good)
    bad_tver[1] |= 0x01
    forged = {
        "short": [b"", b"\x04", bytes(15)],
        "bad_opcode": [b"\xff" + good[1:], b"\x15" + good[1:]],
        "bad_icrc": [bytes(bad_icrc), good[:12] + b"tampered" + good[20:]],
    }
    for datagrams in forged.values():
        for d in datagrams:
            a.send_datagram(d, B.packed, 0xC001)
    # a correct ICRC over a bad version: the codec's reason, not the ICRC's
    p = Packet(Opcode.RC_SEND_ONLY, 0x11, 9, b"hello")
    p.tver = 1
    a.send(p, B.packed, 0xC001)
    a.flush()
    a.send(_write(42, b"after"), B.packed, 0xC001)
    a.flush()
    assert inbox.take(1)[0][1:3] == (42, b"after")
    assert inbox.q.empty()
    drops = b.counters.drops
    for reason, datagrams in forged.items():
        assert drops[reason] == len(datagrams), reason
    assert drops["bad_tver"] == 1
    assert b.counters.rx_datagrams == 9


def test_a_failing_consumer_is_counted_and_does_not_stop_the_thread() -> None:
    inbox = Inbox()
    failed = threading.Event()

    def flaky(packets: list[Packet]) -> None:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("bug in the CA layer")
        inbox(packets)

    with DeviceIO(lambda _p: None) as a, DeviceIO(flaky) as b:
        a.add_address(A)
        b.add_address(B)
        a.send(_write(1, b"lost"), B.packed, 0xC000)
        a.flush()
        assert failed.wait(WAIT)  # the second must not share the first's batch
        a.send(_write(2, b"kept"), B.packed, 0xC000)
        a.flush()
        assert inbox.take(1)[0][1] == 2
        assert b.counters.drops["handler_error"] == 1


def test_ipv6_and_a_zero_udp_checksum_as_kernel_rxe_sends() -> None:
    inbox = Inbox()
    lo6 = ipaddress.ip_address("::1")
    with DeviceIO(inbox) as d:
        try:
            d.add_address(lo6)
        except OSError as e:
            pytest.skip(f"no ::1 here: {e}")
        d.send(_write(5, b"six"), lo6.packed, 0xD872)
        d.flush()
        assert inbox.take(1)[0][1:5] == (5, b"six", lo6.packed, 0xD872)
        # kernel rxe sends UDP checksum 0 over IPv6: a raw socket that leaves it 0
        p = _write(6, b"zero")
        pl = wire.encode_bytes(p, wire.icrc_prefix_ipv6(lo6.packed, lo6.packed, 12 + 4 + 4, 0xC0DE))
        s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_UDP)
        try:
            udp = (0xC0DE).to_bytes(2, "big") + (4791).to_bytes(2, "big")
            udp += (8 + len(pl)).to_bytes(2, "big") + b"\0\0"
            s.sendto(udp + pl, ("::1", 0))
        finally:
            s.close()
        assert inbox.take(1)[0][1:3] == (6, b"zero")


def test_capture_writes_what_is_sent_and_received(tmp_path: Path) -> None:
    path = tmp_path / "io.pcap"
    cap = PcapWriter(path, LINKTYPE_ETHERNET)
    inbox = Inbox()
    with DeviceIO(lambda _p: None, capture=cap) as a, DeviceIO(inbox, capture=cap) as b:
        a.add_address(A)
        b.add_address(B)
        a.send(_write(3, b"cap"), B.packed, 0xC003)
        a.flush()
        inbox.take(1)
    cap.close()
    linktype, records = read_pcap(path)
    assert linktype == LINKTYPE_ETHERNET and len(records) == 2  # the send and the receive
    for r in records:
        f = wire.split_ethernet(r.data)
        assert f is not None and (f.src, f.dst, f.sport) == (A.packed, B.packed, 0xC003)
        assert wire.decode_frame(f).psn == 3  # ICRC checked over the captured headers


# ------------------------------------------------------- ICRC over kernel rxe's IP ID


def _golden() -> list[wire.Frame]:
    _lt, records = read_pcap(GOLDEN)
    frames = [wire.split_ethernet(r.data) for r in records]
    return [f for f in frames if f is not None]


def _veth(ns: Any, *addrs: str) -> None:
    """A veth pair v0/v1 up in ``ns``, ``addrs`` (/24) on v0: injected datagrams from one
    of them to another are local deliveries there."""
    ns.ip("link", "add", "v0", "type", "veth", "peer", "name", "v1")
    for addr in addrs:
        ns.ip("addr", "add", f"{addr}/24", "dev", "v0")
    ns.ip("link", "set", "v1", "up")
    ns.ip("link", "set", "v0", "up")


def _inject(frames: list[bytes]) -> None:
    """Send whole IPv4 datagrams as they are (IP_HDRINCL keeps the kernel's ID)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    try:
        for ip in frames:
            s.sendto(ip, (socket.inet_ntoa(ip[16:20]), 0))
    finally:
        s.close()


@pytest.mark.parametrize("mode", ["raw", "udp"])
def test_golden_kernel_frames_pass_the_icrc_only_on_the_raw_path(mode: RxMode) -> None:
    need_ip()
    frames = _golden()
    src, dst = frames[0].src, frames[0].dst  # the lab's 10.99.0.2 -> 10.99.0.1
    assert len({f.ip_udp[4:6] for f in frames}) > 1  # the kernel varied the IP ID
    with netns() as ns:
        _veth(ns, socket.inet_ntoa(dst), socket.inet_ntoa(src))
        inbox = Inbox()
        with ns.entered():
            dev = DeviceIO(inbox, rx_mode=mode)
            dev.add_address(ipaddress.ip_address(dst))
        try:
            ips = [f.ip_udp[:20] + f.ip_udp[20:] + bytes(f.udp_payload) for f in frames]
            tampered = bytearray(ips[0])
            tampered[5] ^= 0x01  # another IP ID: the ICRC covers it
            tampered[10:12] = b"\0\0"  # the kernel fills in the IP checksum
            with ns.entered():
                _inject([*ips, bytes(tampered)])
                # a marker the UDP path accepts too (ID 0, as ibal sends) ends the wait
                dev.send(_write(77, b"end"), dst, 0xC000)
                dev.flush()
            if mode == "raw":
                got = inbox.take(len(frames) + 1)
                assert [g[0] for g in got[:-1]] == [f.udp_payload[0] for f in frames]
                assert all(g[3] == src and g[5][4:6] != b"\0\0" for g in got[:-1])
                assert dev.counters.drops["bad_icrc"] == 1  # the tampered ID
            else:
                got = inbox.take(1)
                # a UDP socket never sees the ID, so kernel frames fail the check
                assert dev.counters.drops["bad_icrc"] == len(frames) + 1
            assert got[-1][1:3] == (77, b"end")
        finally:
            with ns.entered():
                dev.close()


def _ipv4_datagram(src: bytes, dst: bytes, pkt: Packet, *, ident: int, sport: int) -> bytes:
    """A whole RoCEv2 IPv4 datagram with IP ID ``ident`` (DF, TTL 1), its ICRC over that ID,
    as a sender that numbers its datagrams (Linux's rxe) puts it on the wire."""
    length = len(wire.encode_bytes(pkt, 0))
    udp = wire.encode_bytes(pkt, wire.icrc_prefix_ipv4(src, dst, length, sport, ident=ident))
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 28 + length, ident, 0x4000, 1, 17, 0, src, dst)
    return ip + struct.pack(">HHHH", sport, wire.ROCE_V2_PORT, 8 + length, 0) + udp


@pytest.mark.parametrize("mode", ["raw", "udp"])
def test_a_joined_group_takes_datagrams_with_any_ip_id_on_the_raw_path(mode: RxMode) -> None:
    """A group's datagrams from a sender whose IP ID is not 0 (Linux's rxe multicasting,
    seen in the lab): the raw path reads the ID and the ICRC holds; a UDP socket cannot
    see it, so there they fail the ICRC, as unicast ones do."""
    need_ip()
    group, here, peer = (ipaddress.ip_address(a) for a in ("239.7.7.7", "10.77.0.1", "10.77.0.2"))
    with netns() as ns:
        _veth(ns, str(here), str(peer))
        ns.ip("route", "add", "224.0.0.0/4", "dev", "v0")
        inbox = Inbox()
        with ns.entered():
            dev = DeviceIO(inbox, rx_mode=mode)
            dev.add_address(here)
        try:
            dev.join(group)  # from a thread outside the namespace: the device opens it there
            frames = [_ipv4_datagram(peer.packed, group.packed, _write(i, b"grp"),
                                     ident=0x1234 + i, sport=0xC000) for i in range(3)]
            with ns.entered():
                _inject(frames)
                dev.send(_write(77, b"end"), here.packed, 0xC000)  # ID 0: the UDP path takes it
                dev.flush()
            # The group's socket and the address's are read in no set order: the
            # group's datagrams keep their own order, the marker may come before them.
            if mode == "raw":
                got = inbox.take(4)
                grp = [(g[1], g[2], g[3]) for g in got if g[2] == b"grp"]
                assert grp == [(i, b"grp", peer.packed) for i in range(3)]
                assert dev.counters.drops["bad_icrc"] == 0
            else:
                got = inbox.take(1)
                wait_until(lambda: dev.counters.drops["bad_icrc"] == 3, "3 ICRC drops", WAIT)
            assert [g[1:3] for g in got if g[2] != b"grp"] == [(77, b"end")]
        finally:
            with ns.entered():
                dev.close()


def test_own_follows_the_addresses(pair: tuple[DeviceIO, DeviceIO, Inbox]) -> None:
    a, _b, _inbox = pair
    assert a.own == frozenset({A.packed})  # what the engine loops back without a socket
    a.remove_address(A)
    assert a.own == frozenset() and a.addresses == ()
    a.add_address(A)
    assert a.own == frozenset({A.packed})
