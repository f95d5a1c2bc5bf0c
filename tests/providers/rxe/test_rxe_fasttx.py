"""The C engine's send side: a SEND/WRITE WQE's packets handed over as one run.

The requester's output with runs, expanded, must be the very packets it sends
packet by packet (PSNs, AckReq cadence, window, go-back-N, loss, duplicates,
reordering), and ``rxe_fill_wqe`` must put on the wire the bytes the Python
socket layer sends for those packets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import rxeharness
import test_rxe_core
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from netns_util import need_root
from rxeharness import Wire, connect, send_wr
from test_rxe_fastpath import need_c

from ibal.providers.rxe import wire
from ibal.transport.qp import RXE_MAX_UNACKED_PSNS
from ibal.types import QpType, WcStatus, WrType
from ibal.wire import iba
from ibal.wire.packet import Opcode, Packet, WqeRun

CORE_TESTS = rxeharness.plain_tests(test_rxe_core)


@pytest.mark.parametrize("name,fn", CORE_TESTS, ids=[n for n, _ in CORE_TESTS])
def test_core_suite_with_wqe_runs(name: str, fn: Callable[[], None],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rxeharness, "RUNS", True)
    fn()


def _log(runs: bool, size: int, mtu: int, qp_type: QpType = QpType.RC,
         drop: tuple[int, ...] = (), reorder: float = 0.0,
         imm: bool = False, solicited: bool = False) -> list[tuple[str, dict[str, object]]]:
    a, b = connect(mtu=mtu, qp_type=qp_type)
    fault = test_rxe_core.drop_nth(*drop) if drop else None
    w = Wire(a, b, fault=fault, runs=runs, reorder=reorder)
    src = a.mem.register(size)
    src.buf[:] = test_rxe_core.pattern(size)
    dst = b.mem.register(size)
    wr = send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=1)
    if imm:
        wr.send_opt |= wr.send_opt.IMMEDIATE
        wr.imm = 0x1234ABCD
        b.post_recv(b.mem.register(8), wr_id=9)
    a.core.post_send(wr)
    b.post_recv(dst, wr_id=2)
    s = send_wr(WrType.SEND, src, wr_id=3)
    if solicited:
        s.send_opt |= s.send_opt.SOLICITED
    a.core.post_send(s)
    w.run()
    want = [WcStatus.SUCCESS] * (2 if qp_type is QpType.RC else len(a.send_wcs))
    assert [c.status for c in a.send_wcs] == want
    if qp_type is QpType.RC:
        assert bytes(dst.buf) == bytes(src.buf)
    return [(who, p.fields()) for who, p in w.log]


@pytest.mark.parametrize("size,mtu,qp_type,drop,reorder,imm,solicited", [
    (8, 256, QpType.RC, (), 0.0, False, False),  # ONLY
    (0, 256, QpType.RC, (), 0.0, False, False),  # zero-length ONLY
    (256 * 150 + 5, 256, QpType.RC, (), 0.0, True, True),  # AckReq every 64, LAST_IMM, pad
    (256 * (RXE_MAX_UNACKED_PSNS + 70), 256, QpType.RC, (), 0.0, False, False),  # the window
    (4096 * 16, 4096, QpType.RC, (5, 20), 0.0, False, False),  # go-back-N from the lost PSN
    (1024 * 40, 1024, QpType.RC, (3, 3, 30), 0.3, True, False),  # loss and reordering
    (1024 * 9 + 3, 1024, QpType.UC, (), 0.0, False, True),
    (1024 * 9 + 3, 1024, QpType.UC, (4,), 0.0, True, False),  # UC loses a message
])
def test_wqe_runs_send_the_same_packets(size: int, mtu: int, qp_type: QpType,
                                        drop: tuple[int, ...], reorder: float, imm: bool,
                                        solicited: bool) -> None:
    got = _log(True, size, mtu, qp_type, drop, reorder, imm, solicited)
    assert got == _log(False, size, mtu, qp_type, drop, reorder, imm, solicited)


def test_poll_with_runs_hands_a_whole_wqe_as_one_record() -> None:
    a, b = connect(mtu=1024)
    src = a.mem.register(1024 * 8 - 3)
    dst = b.mem.register(len(src.buf))
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=1))
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=2))
    items, count = a.core.poll_trains(0.0, runs=True)
    assert count == 16
    assert [type(i) for i in items] == [WqeRun, WqeRun]
    write, send = items
    assert isinstance(write, WqeRun) and isinstance(send, WqeRun)
    assert (write.k0, write.m, write.npkts, write.reth) == (0, 8, 8, True)
    assert write.dma_len == len(src.buf)
    pkts = write.packets()
    assert [p.opcode for p in pkts] == [Opcode.RC_RDMA_WRITE_FIRST] + [
        Opcode.RC_RDMA_WRITE_MIDDLE] * 6 + [Opcode.RC_RDMA_WRITE_LAST]
    assert [p.ack_req for p in pkts] == [False] * 7 + [True]
    assert send.first_psn == (write.first_psn + 8) & 0xFFFFFF and not send.reth
    assert isinstance(pkts[0], Packet) and pkts[0].rkey == dst.rkey


# ----------------------------------------------------------------- the bytes from C

_OPS = {
    (0x00, False, False): (Opcode.RC_RDMA_WRITE_FIRST, Opcode.RC_RDMA_WRITE_MIDDLE,
                           Opcode.RC_RDMA_WRITE_LAST, Opcode.RC_RDMA_WRITE_ONLY),
    (0x00, False, True): (Opcode.RC_RDMA_WRITE_FIRST, Opcode.RC_RDMA_WRITE_MIDDLE,
                          Opcode.RC_RDMA_WRITE_LAST_IMM, Opcode.RC_RDMA_WRITE_ONLY_IMM),
    (0x00, True, False): (Opcode.RC_SEND_FIRST, Opcode.RC_SEND_MIDDLE, Opcode.RC_SEND_LAST,
                          Opcode.RC_SEND_ONLY),
    (0x00, True, True): (Opcode.RC_SEND_FIRST, Opcode.RC_SEND_MIDDLE, Opcode.RC_SEND_LAST_IMM,
                         Opcode.RC_SEND_ONLY_IMM),
    (0x20, True, True): (Opcode.UC_SEND_FIRST, Opcode.UC_SEND_MIDDLE, Opcode.UC_SEND_LAST_IMM,
                         Opcode.UC_SEND_ONLY_IMM),
    (0x20, False, False): (Opcode.UC_RDMA_WRITE_FIRST, Opcode.UC_RDMA_WRITE_MIDDLE,
                           Opcode.UC_RDMA_WRITE_LAST, Opcode.UC_RDMA_WRITE_ONLY),
}
SRC_IP = bytes([127, 0, 0, 187])
DST_IP = bytes([127, 0, 0, 188])
PORT = 47917
SPORT = 0xC00D


def _run(key: tuple[int, bool, bool], size: int, mtu: int, k0: int, m: int, since: int,
         per: int, psn: int, se: bool, data: bytes) -> WqeRun:
    base, is_send, imm = key
    npkts = max(1, -(-size // mtu))
    run = WqeRun(tuple(int(o) for o in _OPS[key]), 0x00ABCD, 0x8001, psn, npkts,  # type: ignore[arg-type]
                 memoryview(data)[:size], mtu, k0, m, since, per, base == 0)
    if not is_send:
        run.reth = True
        run.va = 0x1122334455667788
        run.rkey = 0xCAFEF00D
        run.dma_len = size
    if imm:
        run.imm = 0xDEADBEEF
    run.se = se
    run.dst_ip = DST_IP
    return run


def _receiver() -> Any:
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    s.bind((socket.inet_ntoa(DST_IP), 0))
    s.setblocking(False)
    return s


def _sent(engine: str, runs: list[WqeRun]) -> list[bytes]:
    """The UDP payloads a DeviceIO of ``engine`` puts on the wire for ``runs``."""
    import ipaddress
    import select

    from ibal.providers.rxe.io import DeviceIO

    rx = _receiver()
    dev = DeviceIO(lambda pkts: None, port=PORT, engine=engine)  # type: ignore[arg-type]
    try:
        dev.add_address(ipaddress.ip_address(socket_ntoa(SRC_IP)))
        assert dev.runs == (engine == "c")
        want = 0
        for r in runs:
            dev.send_run(r, DST_IP, SPORT)
            want += r.m
        dev.flush()
        out: list[bytes] = []
        while len(out) < want:
            # the datagrams went out on lo before flush returned: a bounded wait, not a sleep
            if not select.select([rx], [], [], 5.0)[0]:
                break
            d = rx.recv(70000)
            if d[20:22] == SPORT.to_bytes(2, "big") and d[22:24] == PORT.to_bytes(2, "big"):
                out.append(d[28:])
        return out
    finally:
        dev.close()
        rx.close()


def socket_ntoa(b: bytes) -> str:
    return ".".join(str(x) for x in b)


run_shapes = st.tuples(
    st.sampled_from(sorted(_OPS)), st.integers(0, 5 * 1024 + 7), st.sampled_from([256, 1024]),
    st.integers(0, 63), st.sampled_from([1, 3, 64]), st.integers(0, 0xFFFFFF), st.booleans(),
    st.data(),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run_shapes)
def test_a_wqe_run_leaves_byte_for_byte_as_the_python_engine_sends_it(shape: Any) -> None:
    need_c()
    need_root()
    key, size, mtu, since, per, psn, se, draw = shape
    since %= per
    npkts = max(1, -(-size // mtu))
    k0 = draw.draw(st.integers(0, npkts - 1))
    m = draw.draw(st.integers(1, npkts - k0))
    data = bytes(range(256)) * (size // 256 + 1)
    runs = [_run(key, size, mtu, k0, m, since, per, psn, se, data)]
    got = _sent("c", runs)
    assert got == _sent("python", runs)
    assert len(got) == m
    for d, p in zip(got, runs[0].packets(), strict=True):
        # the reference decoder and ICRC check accept what C wrote
        prefix = wire.icrc_prefix_ipv4(SRC_IP, DST_IP, len(d), SPORT)
        assert wire.icrc_ok(d, prefix)
        q = iba.decode(d)
        assert (q.opcode, q.psn, q.ack_req, q.se, bytes(q.payload)) == (
            p.opcode, p.psn, p.ack_req, p.se, bytes(p.payload))


def test_a_run_longer_than_the_batch_leaves_whole_and_in_order() -> None:
    need_c()
    need_root()
    data = bytes(range(256)) * 150  # 150 packets: three send batches of 64
    runs = [_run((0x00, False, True), len(data), 256, 0, 150, 5, 64, 0xFFFFF0, True, data)]
    got = _sent("c", runs)
    assert got == _sent("python", runs)
    assert [iba.decode(d).psn for d in got] == [(0xFFFFF0 + k) & 0xFFFFFF for k in range(150)]


def test_runs_of_different_qps_through_one_device_keep_their_own_headers() -> None:
    """The device reuses one C record and sets a QP's fields only when they change."""
    need_c()
    need_root()
    data = bytes(range(256)) * 12
    a = _run((0x00, False, False), 1000, 256, 0, 4, 0, 64, 10, False, data)
    b = _run((0x20, True, True), 3000, 1024, 0, 3, 2, 3, 0xFFFFFE, True, data)
    b.dest_qpn, b.pkey = 0x000777, 0x7FFF
    runs = [a, b, a, b]
    got = _sent("c", runs)
    assert got == _sent("python", runs)
    assert [iba.decode(d).dest_qpn for d in got] == [0xABCD] * 4 + [0x777] * 3 + [
        0xABCD] * 4 + [0x777] * 3


def test_fill_wqe_refuses_a_run_outside_its_buffers() -> None:
    ffi, lib = need_c()
    data = bytes(4 * 1024)
    arena = bytearray(8 * 1100)
    iov = bytearray(8 * 16)
    a, v = ffi.from_buffer(arena), ffi.from_buffer(iov)
    w = ffi.new("struct rxe_wqe_run *")
    keep = ffi.from_buffer(data)
    w.data, w.data_len, w.mtu, w.npkts, w.per_ack = keep, len(data), 1024, 4, 64
    w.reth = 1
    assert lib.rxe_fill_wqe(a, len(arena), 1100, v, 8, 0, w, 0, 4, 0) > 0
    arena_before = bytes(arena)
    for args in (
        (1100, 8, 5, 0, 4, 0),  # past the slots
        (1100, 8, 0, 0, 5, 0),  # more packets than the WQE has
        (1100, 8, 0, 4, 1, 0),  # a packet after the last
        (1050, 8, 0, 0, 1, 0),  # a FIRST with its RETH does not fit its slot
        (1100, 8, 0, 0, 1, 64),  # since past the cadence
        (2200, 8, 3, 0, 2, 0),  # slots past the arena's end
    ):
        slot, nslots, first, k0, m, since = args
        assert lib.rxe_fill_wqe(a, len(arena), slot, v, nslots, first, w, k0, m, since) < 0
    w.npkts = 3  # does not match the data's length
    assert lib.rxe_fill_wqe(a, len(arena), 1100, v, 8, 0, w, 0, 1, 0) < 0
    w.npkts, w.mtu = 4, 1022  # not a multiple of 4
    assert lib.rxe_fill_wqe(a, len(arena), 1100, v, 8, 0, w, 0, 1, 0) < 0
    assert bytes(arena) == arena_before
