"""The train send path: a run of MIDDLE packets handed over as one record.

The requester's output with trains, expanded, must be the very packets it
sends without them (PSNs, AckReq cadence, window, go-back-N), and the socket
layer must put the same bytes on the wire for a train as for its packets.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from pathlib import Path

import pytest
import rxeharness
import test_rxe_core
from rxeharness import Wire, connect, send_wr

from ibal.providers.rxe import wire
from ibal.providers.rxe.io import DeviceIO
from ibal.transport.qp import RXE_MAX_UNACKED_PSNS
from ibal.types import QpType, WcStatus, WrType
from ibal.wire import iba
from ibal.wire.packet import Opcode, Packet, Train
from ibal.wire.pcap import PcapWriter

CORE_TESTS = rxeharness.plain_tests(test_rxe_core)


@pytest.mark.parametrize("name,fn", CORE_TESTS, ids=[n for n, _ in CORE_TESTS])
def test_core_suite_with_trains(name: str, fn: Callable[[], None],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rxeharness, "TRAINS", True)
    fn()


def _log(trains: bool, size: int, mtu: int, qp_type: QpType = QpType.RC,
         drop: tuple[int, ...] = ()) -> list[dict[str, object]]:
    a, b = connect(mtu=mtu, qp_type=qp_type)
    fault = test_rxe_core.drop_nth(*drop) if drop else None
    w = Wire(a, b, fault=fault, trains=trains)
    src = a.mem.register(size)
    src.buf[:] = test_rxe_core.pattern(size)
    dst = b.mem.register(size)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=1))
    b.post_recv(dst, wr_id=2)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=3))
    w.run()
    assert [c.status for c in a.send_wcs] == [WcStatus.SUCCESS] * (2 if qp_type is QpType.RC
                                                                   else len(a.send_wcs))
    return [p.fields() for who, p in w.log if who == "a"]


@pytest.mark.parametrize("size,mtu,qp_type,drop", [
    (256 * 150, 256, QpType.RC, ()),  # AckReq every 64 inside trains
    (256 * (RXE_MAX_UNACKED_PSNS + 70), 256, QpType.RC, ()),  # the PSN window cuts trains
    (4096 * 16, 4096, QpType.RC, (5, 20)),  # go-back-N regenerates from the lost PSN
    (1024 * 9 + 3, 1024, QpType.UC, ()),
])
def test_trains_send_the_same_packets(size: int, mtu: int, qp_type: QpType,
                                      drop: tuple[int, ...]) -> None:
    assert _log(True, size, mtu, qp_type, drop) == _log(False, size, mtu, qp_type, drop)


def test_poll_trains_hands_middle_runs_as_one_record() -> None:
    a, b = connect(mtu=1024)
    src = a.mem.register(1024 * 8)
    dst = b.mem.register(len(src.buf))
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=1))
    items, count = a.core.poll_trains(0.0)
    assert count == 8
    assert [type(i) for i in items] == [Packet, Train, Packet]
    train = items[1]
    assert isinstance(train, Train) and train.n == 6
    assert train.head.opcode == Opcode.RC_RDMA_WRITE_MIDDLE


def test_send_train_puts_the_same_bytes_on_the_wire(tmp_path: Path) -> None:
    """Captured frames of a train equal those of its packets sent one by one."""
    def frames(use_train: bool) -> list[bytes]:
        path = tmp_path / f"{use_train}.pcap"
        cap = PcapWriter(path, wire.LINKTYPE_ETHERNET)
        dev = DeviceIO(lambda pkts: None, port=47911, capture=cap)
        try:
            dev.add_address(ipaddress.ip_address("127.0.0.61"))
            data = bytes(range(256)) * 40
            head = Packet(Opcode.RC_SEND_MIDDLE, 0x12, 0xFFFFFE, data[512:1024])
            head.dst_ip = bytes([127, 0, 0, 62])
            t = Train(head, memoryview(data), 512, 512, 7, 60, 64, True)
            if use_train:
                dev.send_train(t, head.dst_ip, 0xC001)
            else:
                for p in t.packets():
                    dev.send(p, head.dst_ip, 0xC001)
            dev.flush()
        finally:
            dev.close()
            cap.close()
        return _pcap_frames(path.read_bytes())

    got = frames(True)
    assert got == frames(False)
    # and the frames decode: PSNs wrap, AckReq at the cadence, ICRC good
    assert len(got) == 7
    for f in got:
        # the sender's ICRC covers RoCEv2's port whatever port the test device uses
        prefix = wire.icrc_prefix_ipv4(f[26:30], f[30:34], len(f) - 42, 0xC001)
        assert wire.icrc_ok(f[42:], prefix)
    pkts = [iba.decode(f[42:]) for f in got]
    assert [p.psn for p in pkts] == [0xFFFFFE, 0xFFFFFF, 0, 1, 2, 3, 4]
    assert [p.ack_req for p in pkts] == [False, False, False, True, False, False, False]


def _pcap_frames(raw: bytes) -> list[bytes]:
    out = []
    off = 24
    while off < len(raw):
        n = int.from_bytes(raw[off + 8 : off + 12], "little")
        out.append(raw[off + 16 : off + 16 + n])
        off += 16 + n
    return out


def _read_log(trains: bool, drop: tuple[int, ...]) -> list[tuple[str, dict[str, object]]]:
    a, b = connect(mtu=256)
    fault = test_rxe_core.drop_nth(*drop, sender="b") if drop else None
    w = Wire(a, b, fault=fault, trains=trains)
    remote = b.mem.register(256 * 150 + 17)
    remote.buf[:] = test_rxe_core.pattern(len(remote.buf), 5)
    local = a.mem.register(len(remote.buf), fill=0)
    a.core.post_send(send_wr(WrType.RDMA_READ, local, remote=remote, wr_id=1))
    w.run()
    assert [c.status for c in a.send_wcs] == [WcStatus.SUCCESS]
    assert bytes(local.buf) == bytes(remote.buf)
    return [(who, p.fields()) for who, p in w.log]


@pytest.mark.parametrize("drop", [(), (70,)])
def test_read_response_trains_send_the_same_packets(drop: tuple[int, ...]) -> None:
    assert _read_log(True, drop) == _read_log(False, drop)


def test_read_responses_leave_as_a_train() -> None:
    a, b = connect(mtu=256)
    remote = b.mem.register(256 * 10)
    local = a.mem.register(len(remote.buf))
    a.core.post_send(send_wr(WrType.RDMA_READ, local, remote=remote, wr_id=1))
    (req,) = a.core.poll(0.0)
    b.core.receive(req, 0.0)
    items, count = b.core.poll_trains(0.0)
    assert count == 10
    assert [type(i) for i in items] == [Packet, Train, Packet]
    train = items[1]
    assert isinstance(train, Train) and train.n == 8 and not train.reliable
    assert train.head.opcode == Opcode.RC_RDMA_READ_RESPONSE_MIDDLE
    assert [p.psn for p in train.packets()] == [0x101 + j for j in range(8)]
