"""The rxe transport core, two QPs back to back: operations, reliability, errors."""

from __future__ import annotations

import pytest
from rxeharness import RW, Av, Wire, connect, send_wr

from ibal.transport.psn import PSN_MASK
from ibal.types import (
    AccessFlags,
    AsyncEvent,
    NetworkHeader,
    QpState,
    QpType,
    RecvOpt,
    UdDest,
    WcStatus,
    WcType,
    WrType,
)
from ibal.wire import packet as P
from ibal.wire.packet import Opcode, Packet


def pattern(n: int, seed: int = 1) -> bytes:
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


def opcodes(w: Wire, sender: str) -> list[int]:
    return [p.opcode for who, p in w.log if who == sender]


# ------------------------------------------------------------------ operations


@pytest.mark.parametrize("codec", [False, True])
@pytest.mark.parametrize("size", [0, 1, 255, 256, 257, 1000, 4096, 10_000])
def test_send_sizes_byte_exact(size: int, codec: bool) -> None:
    a, b = connect(mtu=256)
    w = Wire(a, b, codec=codec)
    src = a.mem.register(max(size, 1))
    src.buf[:size] = pattern(size)
    dst = b.mem.register(size + 64, fill=0xEE)
    b.post_recv(dst, wr_id=7)
    a.core.post_send(send_wr(WrType.SEND, src, size, wr_id=1))
    w.run()
    assert [(c.wr_id, c.status, c.wc_type) for c in a.send_wcs] == [
        (1, WcStatus.SUCCESS, WcType.SEND)]
    assert [(c.wr_id, c.status, c.length) for c in b.recv_wcs] == [(7, WcStatus.SUCCESS, size)]
    assert bytes(dst.buf[:size]) == pattern(size)
    assert dst.buf[size:] == b"\xee" * 64
    npkts = max(1, -(-size // 256))
    reqs = opcodes(w, "a")
    assert len(reqs) == npkts
    if npkts == 1:
        assert reqs == [Opcode.RC_SEND_ONLY]
    else:
        assert reqs == [Opcode.RC_SEND_FIRST] + [Opcode.RC_SEND_MIDDLE] * (npkts - 2) + [
            Opcode.RC_SEND_LAST]
    # AckReq only on the last packet, so one ACK per message (roce-wire 2.8)
    assert [p.ack_req for who, p in w.log if who == "a"] == [False] * (npkts - 1) + [True]
    assert opcodes(w, "b") == [Opcode.RC_ACKNOWLEDGE]
    ack = next(p for who, p in w.log if who == "b")
    assert ack.syndrome == P.AETH_ACK_UNLIMITED and ack.msn == 1
    assert ack.psn == (0x100 + npkts - 1) & PSN_MASK


def test_ack_req_every_64_packets() -> None:
    a, b = connect(mtu=256)
    w = Wire(a, b)
    n = 256 * 150
    src = a.mem.register(n)
    dst = b.mem.register(n)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=1))
    w.run()
    flags = [p.ack_req for who, p in w.log if who == "a"]
    assert len(flags) == 150
    assert [i for i, f in enumerate(flags) if f] == [63, 127, 149]
    assert [c.status for c in a.send_wcs] == [WcStatus.SUCCESS]


def test_send_immediate_solicited_and_sge_scatter() -> None:
    a, b = connect(mtu=256)
    w = Wire(a, b)
    src = a.mem.register(600)
    src.buf[:] = pattern(600)
    d1 = b.mem.register(100)
    d2 = b.mem.register(1000)
    from ibal.types import RecvWr, Sge

    b.post_recv_wr(RecvWr(9, (Sge(d1.vaddr, 100, d1.lkey), Sge(d2.vaddr, 1000, d2.lkey))))
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1, imm=0xDEADBEEF, solicited=True))
    w.run()
    (wc,) = b.recv_wcs
    assert (wc.wr_id, wc.length, wc.imm, wc.recv_opt) == (9, 600, 0xDEADBEEF, RecvOpt.IMMEDIATE)
    assert b.solicited == [True]
    assert bytes(d1.buf) + bytes(d2.buf[:500]) == pattern(600)
    last = [p for who, p in w.log if who == "a"][-1]
    assert last.opcode == Opcode.RC_SEND_LAST_IMM and last.se


@pytest.mark.parametrize("size", [1, 256, 700, 8192])
def test_rdma_write_and_write_with_immediate(size: int) -> None:
    a, b = connect(mtu=256)
    w = Wire(a, b)
    src = a.mem.register(size)
    src.buf[:] = pattern(size, 3)
    dst = b.mem.register(size + 32, fill=0x55)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, remote_offset=16, wr_id=1))
    b.post_recv(b.mem.register(4), wr_id=5)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, 1, remote=dst, wr_id=2, imm=77))
    w.run()
    assert [(c.wr_id, c.status) for c in a.send_wcs] == [(1, WcStatus.SUCCESS),
                                                         (2, WcStatus.SUCCESS)]
    assert bytes(dst.buf[16 : 16 + size]) == pattern(size, 3)
    assert dst.buf[0] == pattern(1, 3)[0]
    assert [(c.wr_id, c.wc_type, c.imm, c.length) for c in b.recv_wcs] == [
        (5, WcType.RECV_RDMA_WRITE, 77, 1)]


@pytest.mark.parametrize("size", [0, 8, 256, 1000, 5000])
def test_rdma_read_multi_packet(size: int) -> None:
    a, b = connect(mtu=256)
    w = Wire(a, b)
    remote = b.mem.register(max(size, 1))
    remote.buf[:size] = pattern(size, 9)
    local = a.mem.register(max(size, 1), fill=0)
    a.core.post_send(send_wr(WrType.RDMA_READ, local, size, remote=remote, wr_id=3))
    w.run()
    assert [(c.wr_id, c.status, c.wc_type) for c in a.send_wcs] == [
        (3, WcStatus.SUCCESS, WcType.RDMA_READ)]
    assert bytes(local.buf[:size]) == pattern(size, 9)
    resp = opcodes(w, "b")
    n = max(1, -(-size // 256))
    if n == 1:
        assert resp == [Opcode.RC_RDMA_READ_RESPONSE_ONLY]
    else:
        assert resp == [Opcode.RC_RDMA_READ_RESPONSE_FIRST] + [
            Opcode.RC_RDMA_READ_RESPONSE_MIDDLE] * (n - 2) + [Opcode.RC_RDMA_READ_RESPONSE_LAST]
    # the READ reserved one PSN per response: the next request starts after them
    a.core.post_send(send_wr(WrType.RDMA_WRITE, local, 1, remote=remote, wr_id=4))
    w.run()
    assert [p.psn for who, p in w.log if who == "a"][-1] == 0x100 + n


def test_atomics() -> None:
    a, b = connect()
    w = Wire(a, b)
    target = b.mem.register(16)
    target.buf[8:16] = (100).to_bytes(8, "little")
    res = a.mem.register(16)
    a.core.post_send(send_wr(WrType.FETCH_ADD, res, 8, remote=target, remote_offset=8,
                             compare_add=5, wr_id=1))
    a.core.post_send(send_wr(WrType.COMPARE_SWAP, res, 8, offset=8, remote=target,
                             remote_offset=8, compare_add=105, swap=7, wr_id=2))
    a.core.post_send(send_wr(WrType.COMPARE_SWAP, res, 8, remote=target, remote_offset=8,
                             compare_add=1, swap=99, wr_id=3))
    w.run()
    assert [(c.wr_id, c.status) for c in a.send_wcs] == [
        (1, WcStatus.SUCCESS), (2, WcStatus.SUCCESS), (3, WcStatus.SUCCESS)]
    assert int.from_bytes(target.buf[8:16], "little") == 7
    assert int.from_bytes(res.buf[8:16], "little") == 105  # CAS saw 105 and swapped
    assert int.from_bytes(res.buf[0:8], "little") == 7  # the failed CAS returned 7
    assert opcodes(w, "b") == [Opcode.RC_ATOMIC_ACKNOWLEDGE] * 3


def test_send_with_invalidate() -> None:
    a, b = connect()
    w = Wire(a, b)
    victim = b.mem.register(64)
    src = a.mem.register(10)
    dst = b.mem.register(10)
    b.post_recv(dst, wr_id=1)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1), inv_rkey=victim.rkey)
    w.run()
    assert [c.status for c in b.recv_wcs] == [WcStatus.SUCCESS]
    assert b.mem.invalidated == [victim.rkey]
    assert opcodes(w, "a") == [Opcode.RC_SEND_ONLY_INV]
    assert [p.inv_rkey for who, p in w.log if who == "a"] == [victim.rkey]


def test_unsignaled_completes_silently_in_order() -> None:
    a, b = connect()
    w = Wire(a, b)
    src = a.mem.register(8)
    dst = b.mem.register(8)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=1, signaled=False))
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=2))
    w.run()
    assert [c.wr_id for c in a.send_wcs] == [2]


# ---------------------------------------------------------------- reliability


def drop_nth(*indices: int, sender: str = "a"):  # type: ignore[no-untyped-def]
    seen = {"a": 0, "b": 0}

    def fault(pkt: Packet, who: str) -> list[Packet]:
        k = seen[who]
        seen[who] += 1
        return [] if who == sender and k in indices else [pkt]

    return fault


def test_lost_middle_packet_go_back_n() -> None:
    a, b = connect(mtu=256)
    w = Wire(a, b, fault=drop_nth(2))
    src = a.mem.register(256 * 6)
    src.buf[:] = pattern(len(src.buf))
    dst = b.mem.register(len(src.buf))
    b.post_recv(dst, wr_id=1)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1))
    w.run()
    assert [c.status for c in a.send_wcs] == [WcStatus.SUCCESS]
    assert [c.length for c in b.recv_wcs] == [len(src.buf)]
    assert bytes(dst.buf) == bytes(src.buf)
    # one sequence NAK for the gap, then the retry from the lost PSN
    naks = [p for who, p in w.log if who == "b" and p.syndrome == P.Nak.PSN_SEQ_ERR]
    assert len(naks) == 1 and naks[0].psn == 0x102
    assert b.counters.out_of_seq_request == 3
    assert a.counters.rcvd_seq_err == 1
    psns = [p.psn - 0x100 for who, p in w.log if who == "a"]
    assert psns == [0, 1, 2, 3, 4, 5, 2, 3, 4, 5]


def test_lost_last_packet_ack_timeout() -> None:
    a, b = connect(mtu=256, timeout=10)
    w = Wire(a, b, fault=drop_nth(1))
    src = a.mem.register(512)
    dst = b.mem.register(512)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=1))
    w.step()
    w.step()
    assert a.send_wcs == []
    deadline = a.core.next_deadline()
    assert deadline == pytest.approx(4.096e-6 * 2**10)
    w.run()
    assert [c.status for c in a.send_wcs] == [WcStatus.SUCCESS]
    assert a.counters.completer_retry_err == 1
    assert w.now == pytest.approx(deadline)


def test_lost_ack_duplicate_reacked_delivered_once() -> None:
    a, b = connect()
    w = Wire(a, b, fault=drop_nth(0, sender="b"))
    src = a.mem.register(10)
    dst = b.mem.register(10)
    b.post_recv(dst, wr_id=1)
    b.post_recv(dst, wr_id=2)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1))
    w.run()
    assert [c.wr_id for c in b.recv_wcs] == [1]
    assert [c.status for c in a.send_wcs] == [WcStatus.SUCCESS]
    assert b.counters.duplicate_request == 1


def test_lost_read_response_rereads_rest() -> None:
    a, b = connect(mtu=256)
    w = Wire(a, b, fault=drop_nth(2, sender="b"))
    remote = b.mem.register(256 * 5)
    remote.buf[:] = pattern(len(remote.buf), 4)
    local = a.mem.register(len(remote.buf))
    a.core.post_send(send_wr(WrType.RDMA_READ, local, remote=remote, wr_id=1))
    w.run()
    assert [c.status for c in a.send_wcs] == [WcStatus.SUCCESS]
    assert bytes(local.buf) == bytes(remote.buf)
    reqs = [p for who, p in w.log if who == "a"]
    assert [(p.psn - 0x100, p.va - remote.vaddr, p.dma_len) for p in reqs] == [
        (0, 0, 1280), (2, 512, 768)]
    assert b.counters.duplicate_request == 1


def test_duplicate_atomic_answered_from_cache() -> None:
    a, b = connect()
    w = Wire(a, b, fault=drop_nth(0, sender="b"))
    target = b.mem.register(8)
    res = a.mem.register(8)
    a.core.post_send(send_wr(WrType.FETCH_ADD, res, remote=target, compare_add=1, wr_id=1))
    w.run()
    assert int.from_bytes(target.buf, "little") == 1  # executed once
    assert int.from_bytes(res.buf, "little") == 0
    assert [c.status for c in a.send_wcs] == [WcStatus.SUCCESS]
    assert b.counters.duplicate_request == 1


def test_psn_wrap() -> None:
    a, b = connect(mtu=256, psn_a=PSN_MASK - 2, psn_b=PSN_MASK)
    w = Wire(a, b, fault=drop_nth(4))
    src = a.mem.register(256 * 8)
    src.buf[:] = pattern(len(src.buf))
    dst = b.mem.register(len(src.buf))
    b.post_recv(dst)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1))
    remote = a.mem.register(300)
    remote.buf[:] = pattern(300, 2)
    local = b.mem.register(300)
    b.core.post_send(send_wr(WrType.RDMA_READ, local, remote=remote, wr_id=2))
    w.run()
    assert bytes(dst.buf) == bytes(src.buf)
    assert bytes(local.buf) == bytes(remote.buf)
    assert [c.status for c in a.send_wcs + b.send_wcs] == [WcStatus.SUCCESS] * 2
    assert sorted({p.psn for who, p in w.log if who == "a" and p.flags & P.REQUEST}) == [
        0, 1, 2, 3, 4, PSN_MASK - 2, PSN_MASK - 1, PSN_MASK]


# -------------------------------------------------------------------------- RNR


def test_rnr_then_receive_posted() -> None:
    a, b = connect(min_rnr_timer=14, rnr_retry=3)
    w = Wire(a, b)
    src = a.mem.register(10)
    dst = b.mem.register(10)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1))
    w.step()
    w.step()
    rnr = [p for who, p in w.log if who == "b"]
    assert [(p.opcode, p.syndrome) for p in rnr] == [(Opcode.RC_ACKNOWLEDGE, 0x20 | 14)]
    assert a.core.next_deadline() == pytest.approx(1.28e-3)
    b.post_recv(dst, wr_id=5)
    w.advance(1.0e-3)
    assert a.send_wcs == []
    w.advance(0.3e-3)
    assert [c.status for c in a.send_wcs] == [WcStatus.SUCCESS]
    assert [c.wr_id for c in b.recv_wcs] == [5]
    assert b.counters.send_rnr_err == 1 and a.counters.rcvd_rnr_err == 1


def test_rnr_retry_exhausted_flushes_and_errors() -> None:
    a, b = connect(rnr_retry=2)
    w = Wire(a, b)
    src = a.mem.register(10)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1))
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=2))
    w.run()
    assert [(c.wr_id, c.status) for c in a.send_wcs] == [
        (1, WcStatus.RNR_RETRY_ERR), (2, WcStatus.WR_FLUSHED_ERR)]
    assert a.cfg.state is QpState.ERROR
    assert a.counters.rcvd_rnr_err == 3 and a.counters.retry_rnr_exceeded_err == 1
    assert b.cfg.state is QpState.RTS


def test_rnr_retry_7_is_infinite() -> None:
    a, b = connect(rnr_retry=7, min_rnr_timer=1)
    w = Wire(a, b)
    src = a.mem.register(10)
    dst = b.mem.register(10)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1))
    for _ in range(50):
        w.advance(1e-5)
    assert a.send_wcs == [] and a.counters.rcvd_rnr_err >= 40
    b.post_recv(dst, wr_id=1)
    w.advance(1e-5)
    assert [c.status for c in a.send_wcs] == [WcStatus.SUCCESS]


# ---------------------------------------------------------------- retry errors


def test_retry_exhaustion_error_and_flush() -> None:
    a, b = connect(retry_cnt=2, timeout=8)
    w = Wire(a, b, fault=lambda p, who: [] if who == "a" else [p])
    src = a.mem.register(10)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1))
    a.core.post_send(send_wr(WrType.RDMA_READ, src, remote=src, wr_id=2))
    b.post_recv(b.mem.register(10), wr_id=9)
    w.run()
    assert [(c.wr_id, c.status) for c in a.send_wcs] == [
        (1, WcStatus.TIMEOUT_RETRY_ERR), (2, WcStatus.WR_FLUSHED_ERR)]
    assert a.cfg.state is QpState.ERROR
    assert a.counters.retry_exceeded_err == 1
    assert w.now == pytest.approx(3 * 4.096e-6 * 2**8)
    # receives posted to a QP in ERROR complete flushed
    a.post_recv(a.mem.register(4), wr_id=33)
    a.collect()
    assert [(c.wr_id, c.status) for c in a.recv_wcs] == [(33, WcStatus.WR_FLUSHED_ERR)]
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=3))
    a.collect()
    assert a.send_wcs[-1].status is WcStatus.WR_FLUSHED_ERR


# ------------------------------------------------------------ remote errors


def test_bad_rkey_nak_remote_access_memory_untouched() -> None:
    a, b = connect()
    w = Wire(a, b)
    src = a.mem.register(64, fill=1)
    dst = b.mem.register(64, fill=0)
    wr = send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=1)
    wr.rkey ^= 0x4000
    a.core.post_send(wr)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=2))
    w.run()
    assert [(c.wr_id, c.status) for c in a.send_wcs] == [
        (1, WcStatus.REM_ACCESS_ERR), (2, WcStatus.WR_FLUSHED_ERR)]
    assert dst.buf == bytearray(64)
    assert b.cfg.state is QpState.ERROR and a.cfg.state is QpState.ERROR
    assert b.events == [AsyncEvent.WQ_ACCESS_ERROR]
    # the second WRITE was on the wire already and met a QP in ERROR
    assert b.counters.drops == {"bad_rkey": 1, "qp_state": 1}


def test_out_of_bounds_va_nak() -> None:
    a, b = connect()
    w = Wire(a, b)
    src = a.mem.register(64, fill=1)
    dst = b.mem.register(64, fill=0)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, remote_offset=1, wr_id=1))
    w.run()
    assert [c.status for c in a.send_wcs] == [WcStatus.REM_ACCESS_ERR]
    assert dst.buf == bytearray(64)


def test_qp_without_remote_write_nak_invalid_request() -> None:
    a, b = connect(access=AccessFlags.LOCAL_WRITE)
    w = Wire(a, b)
    src = a.mem.register(8)
    dst = b.mem.register(8)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=1))
    w.run()
    assert [c.status for c in a.send_wcs] == [WcStatus.REM_INVALID_REQ_ERR]
    assert b.events == [AsyncEvent.WQ_REQ_ERROR]


def test_misaligned_atomic() -> None:
    a, b = connect()
    w = Wire(a, b)
    target = b.mem.register(16)
    res = a.mem.register(8)
    a.core.post_send(send_wr(WrType.FETCH_ADD, res, remote=target, remote_offset=4,
                             compare_add=1, wr_id=1))
    w.run()
    assert [c.status for c in a.send_wcs] == [WcStatus.REM_INVALID_REQ_ERR]
    assert target.buf == bytearray(16)


def test_receive_too_small_and_bad_lkey() -> None:
    a, b = connect()
    w = Wire(a, b)
    src = a.mem.register(100)
    b.post_recv(b.mem.register(50), wr_id=4)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1))
    w.run()
    assert [c.status for c in a.send_wcs] == [WcStatus.REM_INVALID_REQ_ERR]
    assert [(c.wr_id, c.status) for c in b.recv_wcs] == [(4, WcStatus.LOCAL_LEN_ERR)]

    a, b = connect()
    w = Wire(a, b)
    src = a.mem.register(10)
    from ibal.types import RecvWr, Sge

    b.post_recv_wr(RecvWr(4, (Sge(0x1, 10, 0xBAD),)))
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1))
    w.run()
    assert [c.status for c in a.send_wcs] == [WcStatus.REM_OP_ERR]
    assert [(c.wr_id, c.status) for c in b.recv_wcs] == [(4, WcStatus.LOCAL_PROTECTION_ERR)]


def test_local_protection_error() -> None:
    a, b = connect()
    w = Wire(a, b)
    src = a.mem.register(10)
    wr = send_wr(WrType.SEND, src, wr_id=1)
    wr.sg_list = (type(wr.sg_list[0])(src.vaddr, 11, src.lkey),)
    a.core.post_send(wr)
    w.run()
    assert [c.status for c in a.send_wcs] == [WcStatus.LOCAL_PROTECTION_ERR]
    assert a.cfg.state is QpState.ERROR
    assert w.log == []


# ------------------------------------------------------- responder resources


def _read_req(psn: int, rkey: int, va: int, length: int) -> Packet:
    p = Packet(Opcode.RC_RDMA_READ_REQUEST, 0x22, psn, ack_req=True)
    p.rkey, p.va, p.dma_len = rkey, va, length
    return p


def test_responder_resources_enforced() -> None:
    _, b = connect(depth=2)
    remote = b.mem.register(1024)
    for i in range(2):
        b.core.receive(_read_req(0x100 + 4 * i, remote.rkey, remote.vaddr, 1024), 0.0)
    assert b.cfg.state is QpState.RTS
    b.core.receive(_read_req(0x108, remote.rkey, remote.vaddr, 8), 0.0)
    assert b.cfg.state is QpState.ERROR
    out = b.core.poll(0.0)
    assert [(p.opcode, p.syndrome, p.psn) for p in out] == [
        (Opcode.RC_ACKNOWLEDGE, P.Nak.INVALID_REQUEST, 0x108)]
    assert b.counters.drops == {"responder_resources": 1}


def test_responder_resources_freed_when_responses_left() -> None:
    _, b = connect(depth=1)
    remote = b.mem.register(512)
    b.core.receive(_read_req(0x100, remote.rkey, remote.vaddr, 512), 0.0)
    assert len(b.core.poll(0.0)) == 2
    b.core.receive(_read_req(0x102, remote.rkey, remote.vaddr, 512), 0.0)
    assert b.cfg.state is QpState.RTS
    assert len(b.core.poll(0.0)) == 2


def test_requester_respects_initiator_depth() -> None:
    a, b = connect(depth=2)
    w = Wire(a, b)
    remote = b.mem.register(64)
    local = a.mem.register(64)
    for i in range(5):
        a.core.post_send(send_wr(WrType.RDMA_READ, local, 8, remote=remote, wr_id=i))
    first = a.core.poll(0.0)
    assert len(first) == 2
    w.run()
    assert [(c.wr_id, c.status) for c in a.send_wcs] == [(i, WcStatus.SUCCESS) for i in range(5)]


# ------------------------------------------------------------- forged packets


def test_forged_packets_dropped_and_counted() -> None:
    _, b = connect()
    dst = b.mem.register(16)
    before = bytes(dst.buf)
    # bad PSN far ahead: one NAK, then silence
    p = Packet(Opcode.RC_RDMA_WRITE_ONLY, 0x22, 0x5000, b"x" * 8, ack_req=True)
    p.rkey, p.va, p.dma_len = dst.rkey, dst.vaddr, 8
    b.core.receive(p, 0.0)
    b.core.receive(p, 0.0)
    out = b.core.poll(0.0)
    assert [(o.syndrome, o.psn) for o in out] == [(P.Nak.PSN_SEQ_ERR, 0x100)]
    # wrong P_Key, wrong transport, unknown opcode, bad TVer-free garbage
    q = Packet(Opcode.RC_SEND_ONLY, 0x22, 0x200, b"y", pkey=0x1234)
    b.core.receive(q, 0.0)
    b.core.receive(Packet(Opcode.UD_SEND_ONLY, 0x22, 0x200, b"z"), 0.0)
    b.core.receive(Packet(0x15, 0x22, 0x200), 0.0)
    b.core.receive(Packet(Opcode.RC_ACKNOWLEDGE, 0x22, 0x9999), 0.0)
    assert bytes(dst.buf) == before
    assert b.counters.drops == {
        "out_of_sequence": 2, "pkey": 1, "wrong_transport": 1, "bad_opcode": 1,
        "response_psn_unsent": 1}
    assert b.cfg.state is QpState.RTS
    assert b.core.poll(0.0) == []


# ----------------------------------------------------------------------- UC


def test_uc_send_write_and_gap_drops_message() -> None:
    a, b = connect(QpType.UC, mtu=256)
    w = Wire(a, b, fault=drop_nth(1))
    src = a.mem.register(600)
    src.buf[:] = pattern(600)
    dst = b.mem.register(600)
    b.post_recv(dst, wr_id=1)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1))  # packets 0,1,2: 1 is lost
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=2))  # packets 3,4,5
    wdst = b.mem.register(600)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=wdst, wr_id=3))
    w.run()
    assert [(c.wr_id, c.status) for c in a.send_wcs] == [
        (1, WcStatus.SUCCESS), (2, WcStatus.SUCCESS), (3, WcStatus.SUCCESS)]
    # the receive WQE was reused by the second message, which arrived whole
    assert [(c.wr_id, c.length) for c in b.recv_wcs] == [(1, 600)]
    assert bytes(dst.buf) == bytes(src.buf) and bytes(wdst.buf) == bytes(src.buf)
    assert b.counters.drops == {"uc_partial_message": 1}
    assert opcodes(w, "b") == []
    assert opcodes(w, "a")[:3] == [Opcode.UC_SEND_FIRST, Opcode.UC_SEND_MIDDLE,
                                   Opcode.UC_SEND_LAST]


# ----------------------------------------------------------------------- UD


def test_ud_send_qkey_and_grh() -> None:
    a, b = connect(QpType.UD)
    w = Wire(a, b, codec=True)
    src = a.mem.register(100)
    src.buf[:] = pattern(100)
    dst = b.mem.register(200)
    b.post_recv(dst, wr_id=1)
    b.post_recv(b.mem.register(200), wr_id=2)
    ud = UdDest(Av(b.ip), 0x22, 0x1234)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1, imm=5, ud=ud))
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=2, ud=UdDest(Av(b.ip), 0x22, 0x9999)))
    # controlled Q_Key: the high bit means "the sender QP's own Q_Key"
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=3, ud=UdDest(Av(b.ip), 0x22, 0x80000000)))
    w.run()
    assert [c.status for c in a.send_wcs] == [WcStatus.SUCCESS] * 3
    assert [(c.wr_id, c.length, c.src_qp, c.imm) for c in b.recv_wcs] == [
        (1, 140, 0x11, 5), (2, 140, 0x11, None)]
    wc = b.recv_wcs[0]
    assert wc.recv_opt == RecvOpt.GRH_VALID | RecvOpt.IMMEDIATE
    assert bytes(dst.buf[40:140]) == pattern(100)
    assert bytes(dst.buf[:20]) == bytes(20) and dst.buf[20] == 0x45
    assert bytes(dst.buf[32:36]) == a.ip and bytes(dst.buf[36:40]) == b.ip
    assert wc.grh == bytes(dst.buf[:40])
    assert wc.network_header is NetworkHeader.IPV4
    assert b.counters.drops == {"qkey": 1}
    assert [p.qkey for who, p in w.log] == [0x1234, 0x9999, 0x1234]
    assert all(p.ack_req and p.src_qpn == 0x11 for who, p in w.log)


def test_ud_too_long_local_len_error() -> None:
    a, b = connect(QpType.UD, mtu=256)
    src = a.mem.register(300)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1, ud=UdDest(Av(b.ip), 0x22, 0x1234)))
    assert a.core.poll(0.0) == []
    a.collect()
    assert [c.status for c in a.send_wcs] == [WcStatus.LOCAL_LEN_ERR]
    assert a.cfg.state is QpState.SQERR


def test_gsi_qkey() -> None:
    a, b = connect(QpType.QP1)
    w = Wire(a, b)
    src = a.mem.register(24)
    dst = b.mem.register(64 + 40)
    b.post_recv(dst, wr_id=1)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1, ud=UdDest(Av(b.ip), 1, 0x1234)))
    w.run()
    assert [p.qkey for who, p in w.log] == [P.GSI_QKEY]
    assert [c.length for c in b.recv_wcs] == [64]
    forged = Packet(Opcode.UD_SEND_ONLY, 1, 0, b"m")
    forged.qkey = 0x1234
    b.post_recv(dst, wr_id=2)
    b.core.receive(forged, 0.0)
    assert b.counters.drops == {"qkey": 1}


def test_rw_constant_is_all_remote() -> None:
    assert RW & AccessFlags.ATOMIC


def test_reset_forgets_state_and_queues() -> None:
    a, _ = connect()
    src = a.mem.register(8)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=1))
    assert len(a.core.poll(0.0)) == 1
    a.core.set_state(QpState.RESET)
    a.collect()
    assert a.send_wcs == [] and a.core.poll(0.0) == []
    assert a.core.next_deadline() is None
    a.core.set_psns(0x500, 0x600)
    for s in (QpState.INIT, QpState.RTR, QpState.RTS):
        a.core.set_state(s)
    a.core.post_send(send_wr(WrType.SEND, src, wr_id=2))
    assert [p.psn for p in a.core.poll(0.0)] == [0x500]


def test_solicited_only_where_a_receive_completes() -> None:
    a, b = connect()
    w = Wire(a, b)
    src = a.mem.register(8)
    dst = b.mem.register(8)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=1, solicited=True))
    b.post_recv(dst)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=2, solicited=True,
                             imm=3))
    w.run()
    assert [p.se for who, p in w.log if who == "a"] == [False, True]
    assert b.solicited == [True]


# ------------------------------------------------- forged requests at the right PSN


def _write_pkt(op: Opcode, psn: int, payload: bytes, rkey: int = 0, va: int = 0,
               length: int = 0) -> Packet:
    p = Packet(op, 0x22, psn, payload, ack_req=True)
    p.rkey, p.va, p.dma_len = rkey, va, length
    return p


@pytest.mark.parametrize(
    ("packets", "reason", "nak"),
    [
        # a MIDDLE with no FIRST before it
        ([(Opcode.RC_RDMA_WRITE_MIDDLE, 256, False)], "missing_first", P.Nak.INVALID_REQUEST),
        # FIRST, then a new ONLY before the LAST
        ([(Opcode.RC_RDMA_WRITE_FIRST, 256, True), (Opcode.RC_SEND_ONLY, 4, False)],
         "missing_last", P.Nak.INVALID_REQUEST),
        # a FIRST shorter than the path MTU
        ([(Opcode.RC_RDMA_WRITE_FIRST, 100, True)], "bad_length", P.Nak.INVALID_REQUEST),
        # more payload than the RETH announced
        ([(Opcode.RC_RDMA_WRITE_ONLY, 64, True)], "bad_length", P.Nak.INVALID_REQUEST),
    ],
)
def test_opcode_sequence_and_length_errors(
    packets: list[tuple[Opcode, int, bool]], reason: str, nak: int
) -> None:
    _, b = connect(mtu=256)
    dst = b.mem.register(1024)
    psn = 0x100
    for op, n, reth in packets:
        length = 32 if op == Opcode.RC_RDMA_WRITE_ONLY else 512
        p = _write_pkt(op, psn, b"\x01" * n, dst.rkey if reth else 0, dst.vaddr if reth else 0,
                       length if reth else 0)
        b.core.receive(p, 0.0)
        psn += 1
    out = b.core.poll(0.0)
    assert [(o.opcode, o.syndrome) for o in out][-1] == (Opcode.RC_ACKNOWLEDGE, nak)
    assert b.cfg.state is QpState.ERROR
    assert b.counters.drops == {reason: 1}
    assert b.events == [] and b.core.out.events == [AsyncEvent.WQ_REQ_ERROR]
    if reason != "missing_last":
        assert dst.buf == bytearray(1024)


def test_forged_read_bad_rkey_and_unknown_duplicate_atomic() -> None:
    _, b = connect()
    secret = b.mem.register(64, fill=0x5A)
    p = _read_req(0x100, secret.rkey + 2, secret.vaddr, 64)
    b.core.receive(p, 0.0)
    out = b.core.poll(0.0)
    assert [(o.opcode, o.syndrome, len(o.payload)) for o in out] == [
        (Opcode.RC_ACKNOWLEDGE, P.Nak.REMOTE_ACCESS, 0)]
    assert b.counters.drops == {"bad_rkey": 1}

    _, b = connect()
    counter = b.mem.register(8)
    dup = Packet(Opcode.RC_FETCH_ADD, 0x22, 0x0FF, ack_req=True)  # older than expected
    dup.rkey, dup.va, dup.swap_add = counter.rkey, counter.vaddr, 5
    b.core.receive(dup, 0.0)
    assert b.core.poll(0.0) == []
    assert counter.buf == bytearray(8)
    assert b.counters.drops == {"duplicate_atomic_unknown": 1}
    assert b.cfg.state is QpState.RTS


def test_uc_bad_rkey_dropped_qp_stays() -> None:
    a, b = connect(QpType.UC)
    w = Wire(a, b)
    src = a.mem.register(16, fill=1)
    dst = b.mem.register(16)
    wr = send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=1)
    wr.rkey += 2
    a.core.post_send(wr)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=2))
    w.run()
    assert [c.status for c in a.send_wcs] == [WcStatus.SUCCESS] * 2
    assert b.counters.drops == {"bad_rkey": 1}
    assert dst.buf == bytearray([1]) * 16 and b.cfg.state is QpState.RTS


def test_counters_snapshot_names() -> None:
    a, b = connect()
    w = Wire(a, b)
    src = a.mem.register(600)
    dst = b.mem.register(600)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=1))
    a.core.post_send(send_wr(WrType.RDMA_READ, src, 8, remote=dst, wr_id=2))
    w.run()
    snap_a, snap_b = a.counters.snapshot(), b.counters.snapshot()
    assert snap_a["rdma_sends"] == 4 and snap_b["rdma_recvs"] == 4
    assert snap_a["sent_pkts"] == 4 and snap_b["rcvd_pkts"] == 4
    assert snap_b["sent_pkts"] == 2 and snap_a["rcvd_pkts"] == 2
    b.core.receive(Packet(0x15, 0x22, 0), 0.0)
    assert b.counters.snapshot()["drop_bad_opcode"] == 1


def test_sqd_stops_new_wrs_and_reports_drained() -> None:
    a, b = connect(mtu=256)
    w = Wire(a, b)
    src = a.mem.register(1024)
    dst = b.mem.register(1024)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=1))
    first = a.core.poll(0.0, budget=2)  # two of four packets are out
    a.core.set_state(QpState.SQD)
    a.core.post_send(send_wr(WrType.RDMA_WRITE, src, remote=dst, wr_id=2))
    for p in first:
        b.core.receive(p, 0.0)
    w.run()
    assert [c.wr_id for c in a.send_wcs] == [1]
    assert a.events == [AsyncEvent.SQ_DRAINED]
    a.core.set_state(QpState.RTS)
    w.run()
    assert [c.wr_id for c in a.send_wcs] == [1, 2]
    a.core.set_state(QpState.SQD)  # nothing in flight: drained at once
    a.collect()
    assert a.events == [AsyncEvent.SQ_DRAINED] * 2
