"""The C receive fast path against the pure Python core, datagram for datagram.

One script of RDMA WRITEs (and SENDs, which always take the Python path) is cut
into RoCEv2 datagrams, then lost, duplicated, reordered and forged, and fed in
receive batches to two engines over identical responders: one takes each
batch through ``Engine.on_ring`` (C lands the predicted packets, Python the
rest), the other through the pure ``decode_batch`` + ``on_packets``.  After
every batch both must agree on memory, responder state, counters, the
responses sent and the completions.  The C side's FIRST/ONLY packets are
checked against a region table (``fastmr.MrMirror``) the script deregisters
and registers again between batches, as the key table's mirror would.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rxeharness import RW, Node, make_node

from ibal.providers.rxe import fastpath, wire
from ibal.providers.rxe.counters import DeviceCounters
from ibal.providers.rxe.cq import Cq
from ibal.providers.rxe.engine import Engine
from ibal.providers.rxe.fastmr import MrMirror
from ibal.providers.rxe.rx import RxDecoder
from ibal.types import QpState, QpType, RecvWr, Sge
from ibal.wire import iba
from ibal.wire.packet import Opcode, Packet, Train

SRC = b"\x0a\x00\x00\x01"
DST = b"\x0a\x00\x00\x02"
MTU = 256
PSN0 = 0xFFFFF0  # the script wraps the 24-bit PSN
QPN = 0x22
SLOT = 2048
DEPTH = 64


def need_c() -> None:
    if fastpath.compiled() is None:
        what = "the compiled rxe engine is not built (Debian packages gcc and python3-dev)"
        if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
            pytest.fail(f"{what} (IBAL_LAB_REQUIRED is set)", pytrace=False)
        pytest.skip(what)


class FakeRing:
    """A receive ring's memory as ``recvmmsg`` leaves it (struct mmsghdr: flags at 48,
    length at 56), filled by the test."""

    def __init__(self) -> None:
        self.depth = DEPTH
        self.size = SLOT
        self.arena = bytearray(DEPTH * SLOT)
        self.view = memoryview(self.arena)
        self.msgs = bytearray(DEPTH * 64)

    def fill(self, datagrams: list[bytes]) -> int:
        for i, d in enumerate(datagrams):
            self.arena[i * SLOT : i * SLOT + min(len(d), SLOT)] = d[:SLOT]
            self.msgs[i * 64 + 56 : i * 64 + 60] = len(d).to_bytes(4, "little")
            trunc = 0x20 if len(d) > SLOT else 0
            self.msgs[i * 64 + 48 : i * 64 + 52] = trunc.to_bytes(4, "little")
        return len(datagrams)

    def length(self, i: int) -> int:
        return int.from_bytes(self.msgs[i * 64 + 56 : i * 64 + 60], "little")

    def datagram(self, i: int) -> memoryview:
        return self.view[i * SLOT : i * SLOT + min(self.length(i), SLOT)]

    def truncated(self, i: int) -> bool:
        return bool(self.msgs[i * 64 + 48] & 0x20)


class FakeIo:
    """What the engine sends, recorded instead of sent."""

    def __init__(self) -> None:
        self.own: frozenset[bytes] = frozenset()
        self.sent: list[tuple[int, int, int, int]] = []

    def send(self, p: Packet, dst: bytes, sport: int) -> None:
        self.sent.append((p.opcode, p.psn, p.syndrome, p.msn))

    def send_train(self, t: Train, dst: bytes, sport: int) -> None:
        for p in t.packets():
            self.send(p, dst, sport)

    def flush(self) -> None:
        pass


@dataclass
class FakePd:
    num: int = 7


@dataclass(eq=False)
class FakeQp:
    num: int
    cfg: Any
    core: Any
    send_cq: Cq
    recv_cq: Cq
    pd: FakePd = field(default_factory=FakePd)
    srq: Any = None
    context: Any = None
    alive: bool = True
    last_wqe: bool = False


class Side:
    """One receiving RC QP behind an engine, as the CA would wire it."""

    def __init__(self, fast: bool, mrs: bool = True) -> None:
        self.fast = fast
        self.counters = DeviceCounters()
        self.node: Node = make_node("b", QpType.RC, QPN, 1, DST, self.counters)
        cfg = self.node.cfg
        cfg.dest_qpn = 0x11
        cfg.dst_ip = SRC
        cfg.mtu = MTU
        cfg.access = int(RW)
        cfg.resp_res = 4
        self.node.core.set_psns(0x100, PSN0)
        for s in (QpState.INIT, QpState.RTR, QpState.RTS):
            self.node.core.set_state(s)
        self.region = self.node.mem.register(8192, fill=0)
        self.recv = self.node.mem.register(4096, fill=0)
        cq = Cq(None, 4096, None)
        self.cq = cq
        self.qp = FakeQp(QPN, cfg, self.node.core, cq, cq)
        self.io = FakeIo()
        self.engine = Engine("t", threading.RLock(), self.io, self.counters, lambda c: None,
                             lambda e: None)  # fmt: skip
        self.engine.add(self.qp)  # type: ignore[arg-type]
        self.mirror: MrMirror | None = None
        if fast and mrs:
            # the CA's region table as its key table's mirror keeps it
            self.mirror = self.engine.mr_mirror = MrMirror(*fastpath.ffi_lib())
            self.region_op("add")
        self.ring = FakeRing()
        self.decoder = RxDecoder(self.ring, self.counters, None)  # type: ignore[arg-type]
        for k in range(64):
            self.node.post_recv_wr(RecvWr(k, [Sge(self.recv.vaddr + 64 * k, 64, self.recv.lkey)]))

    def region_op(self, op: str) -> None:
        """Deregister (``drop``) or register again (``add``) the remote key of the region,
        in the memory the Python core checks and in C's table alike."""
        r = self.region
        mem = self.node.mem
        if op == "drop":
            mem.by_key.pop(r.rkey, None)
            if self.mirror is not None:
                self.mirror.removed(r.rkey)
        elif op == "add":
            mem.by_key[r.rkey] = r
            if self.mirror is not None:
                assert self.mirror.put(r.rkey, self.qp.pd.num, r.vaddr, len(r.buf),
                                       int(r.access), memoryview(r.buf))

    def feed(self, datagrams: list[bytes]) -> None:
        n = self.ring.fill(datagrams)
        if self.fast:
            self.counters.rx_batches += 1
            dec = functools.partial(self.decoder.decode_one, rx_raw=True, dst=DST)
            self.engine.on_ring(self.ring, n, dec)
        else:
            self.engine.on_packets(self.decoder.decode_batch(n, True, DST))

    def state(self) -> tuple[Any, ...]:
        r = self.node.core.resp
        snap = self.counters.snapshot()
        snap.pop("rx_fast", None)
        wcs = [(w.wr_id, w.status, w.length) for w in self.cq.entries]
        wlen = r.wlen if r.in_msg else None
        return (bytes(self.region.buf), bytes(self.recv.buf), r.epsn, r.msn, r.in_msg, r.woff, wlen,
                self.node.cfg.state, snap, list(self.io.sent), wcs)  # fmt: skip


def _datagram(p: Packet, ident: int = 0) -> bytes:
    plen = len(iba.encode_headers(p)) + len(p.payload) + p.pad + iba.ICRC_LEN
    ip_udp = wire.ip_udp_headers(SRC, DST, 0xC000, plen, ident=ident)
    return ip_udp + wire.encode_bytes(p, wire.icrc_prefix(ip_udp))


def _packets(messages: list[tuple[str, int, int, bool]], rkey: int, base: int) -> list[Packet]:
    """The request packets of ``messages`` (kind, length, offset, AckReq on the last)."""
    out: list[Packet] = []
    psn = PSN0
    for kind, length, off, ack in messages:
        data = os.urandom(length)
        chunks = [data[i : i + MTU] for i in range(0, length, MTU)] or [b""]
        n = len(chunks)
        for k, chunk in enumerate(chunks):
            if kind == "write":
                op = (Opcode.RC_RDMA_WRITE_ONLY if n == 1 else Opcode.RC_RDMA_WRITE_FIRST
                      if k == 0 else Opcode.RC_RDMA_WRITE_LAST if k == n - 1
                      else Opcode.RC_RDMA_WRITE_MIDDLE)  # fmt: skip
            else:
                op = (Opcode.RC_SEND_ONLY if n == 1 else Opcode.RC_SEND_FIRST if k == 0
                      else Opcode.RC_SEND_LAST if k == n - 1
                      else Opcode.RC_SEND_MIDDLE)  # fmt: skip
            ack_req = (ack and k == n - 1) or psn % 7 == 0
            p = Packet(op, QPN, psn, chunk, ack_req=ack_req)
            if kind == "write" and k == 0:
                p.va = base + off
                p.rkey = rkey
                p.dma_len = length
            out.append(p)
            psn = (psn + 1) & 0xFFFFFF
    return out


_message = st.tuples(
    st.sampled_from(["write", "write", "write", "send"]),
    st.integers(1, 5 * MTU),
    st.integers(0, 2048),
    st.booleans(),
)


Script = tuple[list[tuple[str, int, int, bool]], list[tuple[str, int]], list[int], list[str]]
_FAULTS = ["drop", "dup", "swap", "flip", "qpn", "psn", "cut", "resend"]


@st.composite
def _script(draw: st.DrawFn) -> Script:
    messages = draw(st.lists(_message, min_size=1, max_size=8))
    faults = draw(
        st.lists(st.tuples(st.sampled_from(_FAULTS), st.integers(0, 10_000)), max_size=6)
    )
    batches = draw(st.lists(st.integers(1, DEPTH), min_size=1, max_size=8))
    regions = draw(st.lists(st.sampled_from(["", "", "", "drop", "add"]), max_size=8))
    return messages, faults, batches, regions


def _apply(datagrams: list[bytes], faults: list[tuple[str, int]]) -> list[bytes]:
    d = list(datagrams)
    for kind, at in faults:
        if not d:
            break
        i = at % len(d)
        if kind in ("flip", "qpn", "psn") and len(d[i]) < 28 + 16:
            continue  # cut short already
        if kind == "drop":
            del d[i]
        elif kind == "dup":
            d.insert(i, d[i])
        elif kind == "swap" and i + 1 < len(d):
            d[i], d[i + 1] = d[i + 1], d[i]
        elif kind == "flip":
            b = bytearray(d[i])
            b[28 + 12 + (at % max(len(b) - 44, 1))] ^= 0x01  # a payload (or ICRC) bit
            d[i] = bytes(b)
        elif kind == "qpn":
            b = bytearray(d[i])
            b[28 + 7] ^= 0x01  # another QP: the ICRC fails first
            d[i] = bytes(b)
        elif kind == "psn":
            b = bytearray(d[i])
            b[28 + 11] ^= 0x02
            d[i] = bytes(b)
        elif kind == "cut":
            d[i] = d[i][: 28 + (at % 40)]
        elif kind == "resend":
            d.extend(d[i : i + 4])  # a go-back-N style resend of a few packets
    return d


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=_script())
def test_the_fast_path_leaves_everything_as_the_pure_core_does(script: Script) -> None:
    need_c()
    messages, faults, batches, regions = script
    fast, pure = Side(True), Side(False)
    try:
        assert fast.region.rkey == pure.region.rkey
        pkts = _packets(messages, fast.region.rkey, fast.region.vaddr)
        datagrams = _apply([_datagram(p) for p in pkts], faults)
        i = b = 0
        while i < len(datagrams):
            n = batches[b % len(batches)]
            b += 1
            op = regions[b % len(regions)] if regions else ""
            chunk = datagrams[i : i + n]
            i += n
            if op:
                fast.region_op(op)
                pure.region_op(op)
            fast.feed(chunk)
            pure.feed(chunk)
            assert fast.state() == pure.state()
        event(f"C landed {'some' if fast.counters.rx_fast else 'none'}")
        event(f"Python dropped {'some' if pure.counters.dropped else 'none'}")
    finally:
        fast.engine.close()
        pure.engine.close()


@pytest.mark.parametrize("mrs", [False, True], ids=["no-table", "region-table"])
def test_an_in_order_write_lands_through_c(mrs: bool) -> None:
    """The predicted case really takes the C path: every packet with the region table,
    all but the FIRST without it."""
    need_c()
    fast, pure = Side(True, mrs), Side(False)
    try:
        pkts = _packets([("write", 5 * MTU, 100, True)], fast.region.rkey, fast.region.vaddr)
        for side in (fast, pure):
            side.feed([_datagram(p) for p in pkts])
        assert fast.counters.rx_fast == (5 if mrs else 4)
        assert pure.counters.rx_fast == 0
        assert fast.state() == pure.state()
        assert fast.io.sent == [(Opcode.RC_ACKNOWLEDGE, (PSN0 + 4) & 0xFFFFFF, 0x1F, 1)]
        got = bytes(fast.region.buf[100 : 100 + 5 * MTU])
        want = b"".join(bytes(p.payload) for p in pkts)
        assert got == want
    finally:
        fast.engine.close()
        pure.engine.close()


def _craft(kind: str, pkts: list[Packet]) -> list[bytes]:
    """The datagrams of a 4-packet WRITE with packet 1 (a MIDDLE) or 3 (the LAST) changed."""
    out = [_datagram(p) for p in pkts]
    mid, last = pkts[1], pkts[3]

    def again(p: Packet, **kw: Any) -> bytes:
        q = Packet(p.opcode, kw.pop("qpn", p.dest_qpn), kw.pop("psn", p.psn),
                   kw.pop("payload", p.payload), ack_req=kw.pop("ack_req", p.ack_req),
                   pkey=kw.pop("pkey", 0xFFFF))  # fmt: skip
        for k, v in kw.items():
            setattr(q, k, v)
        return _datagram(q)

    if kind == "empty_last":
        out[3] = again(last, payload=b"")
    elif kind == "empty_last_at_the_end":  # the MIDDLEs filled the WRITE already
        first = pkts[0]
        out[0] = again(first, va=first.va, rkey=first.rkey, dma_len=3 * MTU)
        out[3] = again(last, payload=b"")
    elif kind == "short_middle":
        out[1] = again(mid, payload=bytes(mid.payload)[:-4])
    elif kind == "long_last":
        out[3] = again(last, payload=bytes(MTU + 4))
    elif kind == "pkey":
        out[1] = again(mid, pkey=0x7FFF)
    elif kind == "tver":
        out[1] = again(mid, tver=1)
    elif kind == "psn_ahead":
        out[1] = again(mid, psn=(mid.psn + 1) & 0xFFFFFF)
    elif kind == "psn_behind":
        out[1] = again(mid, psn=(mid.psn - 1) & 0xFFFFFF)
    elif kind == "middle_ack_only":
        out[1] = again(mid, ack_req=True)
        out[3] = again(last, ack_req=False)
    elif kind == "source":
        ip_udp = bytearray(out[1][:28])
        ip_udp[12:16] = b"\x0a\x00\x00\x09"
        udp_payload = wire.encode_bytes(mid, wire.icrc_prefix(bytes(ip_udp)))
        out[1] = bytes(ip_udp) + udp_payload
    elif kind == "ip_id":
        b = bytearray(out[1])
        b[4:6] = b"\x12\x34"  # the ICRC covers the ID: it no longer matches
        out[1] = bytes(b)
    elif kind == "trailer":
        out[1] = out[1] + b"\x00" * 8  # bytes past the UDP length are not the packet's
    elif kind in ("bad_rkey", "va_outside", "dma_len_short", "dma_len_huge"):
        first = pkts[0]
        kw = dict(va=first.va, rkey=first.rkey, dma_len=first.dma_len)
        if kind == "bad_rkey":
            kw["rkey"] = first.rkey ^ 0x100
        elif kind == "va_outside":
            kw["va"] = first.va + 8192 - 3 * MTU  # the WRITE would run past the region
        elif kind == "dma_len_short":
            kw["dma_len"] = MTU - 1  # less than the FIRST's own payload
        else:
            kw["dma_len"] = 1 << 31 | 5
        out[0] = again(first, **kw)
    elif kind in ("only", "only_empty", "only_bad_rkey", "only_len"):
        first = pkts[0]
        payload = b"" if kind == "only_empty" else bytes(first.payload)[:100]
        only = Packet(Opcode.RC_RDMA_WRITE_ONLY, first.dest_qpn, first.psn, payload,
                      ack_req=True)
        only.va = first.va + 7
        only.rkey = first.rkey ^ (0x100 if kind == "only_bad_rkey" else 0)
        only.dma_len = len(payload) + (1 if kind == "only_len" else 0)
        second = Packet(Opcode.RC_RDMA_WRITE_ONLY, first.dest_qpn, (first.psn + 1) & 0xFFFFFF,
                        bytes(range(40)), ack_req=False)
        second.va, second.rkey, second.dma_len = first.va + 300, first.rkey, 40
        out = [_datagram(only), _datagram(second)]
    return out


@pytest.mark.parametrize("kind", [
    "empty_last", "empty_last_at_the_end", "short_middle", "long_last", "pkey", "tver",
    "psn_ahead", "psn_behind",
    "middle_ack_only", "source", "ip_id", "trailer",
    "bad_rkey", "va_outside", "dma_len_short", "dma_len_huge",
    "only", "only_empty", "only_bad_rkey", "only_len",
])  # fmt: skip
@pytest.mark.parametrize("mrs", [False, True], ids=["no-table", "region-table"])
def test_each_unpredicted_packet_gets_the_pure_cores_answer(kind: str, mrs: bool) -> None:
    need_c()
    fast, pure = Side(True, mrs), Side(False)
    try:
        pkts = _packets([("write", 4 * MTU, 0, True)], fast.region.rkey, fast.region.vaddr)
        datagrams = _craft(kind, pkts)
        for side in (fast, pure):
            side.feed(datagrams)
        assert fast.state() == pure.state()
        first = 1 if mrs else 0  # the FIRST is C's with the region table
        if kind in ("middle_ack_only", "trailer"):
            assert fast.counters.rx_fast == 3 + first  # still predicted
        elif kind in ("empty_last", "empty_last_at_the_end", "long_last"):
            assert fast.counters.rx_fast == 2 + first  # the LAST went to Python
        elif kind in ("bad_rkey", "va_outside", "dma_len_short", "dma_len_huge"):
            # Python NAKs the FIRST (the QP goes to ERROR), C takes nothing after it
            assert fast.counters.rx_fast == 0
            assert any(op == Opcode.RC_ACKNOWLEDGE and syn != 0x1F
                       for op, _psn, syn, _msn in fast.io.sent)
        elif kind in ("only", "only_empty"):
            assert fast.counters.rx_fast == 2 * first
        elif kind in ("only_bad_rkey", "only_len"):
            assert fast.counters.rx_fast == 0
    finally:
        fast.engine.close()
        pure.engine.close()


@pytest.mark.parametrize("engine", ["c", "c-no-fast-rx", "python"])
def test_writes_between_two_devices_land_through_the_engine_chosen(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the sockets and the verbs: on the C engine the WRITEs' MIDDLE/LAST
    packets are landed by C, the bytes and completions are the same either way."""
    from netns_util import need_root

    from ibal.al import AlManager
    from ibal.providers.rxe.provider import RxeProvider
    from ibal.testing.helpers import active_port, make_pair, wait_wcs
    from ibal.types import MrModMask, WcStatus

    need_root()
    if engine != "python":
        need_c()
    monkeypatch.setenv("IBAL_RXE_ENGINE", engine[0] if engine != "python" else engine)
    monkeypatch.setenv("IBAL_RXE_FAST_RX", "0" if engine == "c-no-fast-rx" else "1")
    mgr = AlManager()
    mgr.add_provider(RxeProvider({"devices": "rxe_x0=127.0.0.177,rxe_x1=127.0.0.178"}))
    try:
        al = mgr.open_al()
        cas = sorted((al.open_ca(g) for g in al.get_ca_guids()), key=lambda c: c.name)
        ports = [active_port(c.query().ports) for c in cas]
        assert ports[0] is not None and ports[1] is not None
        pair = make_pair(cas[0], ports[0], cas[1], ports[1], QpType.RC, buf_size=65536)
        mtu = pair.a.qp.query().path_mtu.bytes  # type: ignore[union-attr]
        for k in range(6):
            data = os.urandom(4 * mtu + 100 * k + 1)
            pair.write(data, dst_off=512 * k, wr_id=k)
            (wc,) = wait_wcs(pair.a.cq, 1)
            assert (wc.wr_id, wc.status) == (k, WcStatus.SUCCESS)
            assert pair.b.get(512 * k, len(data)) == data
        fast = cas[1].query_port_counters(1)["rx_fast"]
        assert fast == (6 * 5 if engine == "c" else 0)  # FIRSTs too, through the region table
        # a re-registration gives B's region a new R_Key: C's table follows, so the new
        # key lands and the old one is refused (by the Python core's NAK)
        mr = pair.b.mr
        old = mr.rkey
        mr.rereg(MrModMask.ACCESS, access=mr.access)
        assert mr.rkey != old
        data = os.urandom(2 * mtu + 5)
        pair.write(data, dst_off=64, wr_id=7)
        (wc,) = wait_wcs(pair.a.cq, 1)
        assert (wc.wr_id, wc.status) == (7, WcStatus.SUCCESS)
        assert pair.b.get(64, len(data)) == data
        assert cas[1].query_port_counters(1)["rx_fast"] - fast == (3 if engine == "c" else 0)
        pair.write(data, dst_off=64, rkey=old, wr_id=8)
        (wc,) = wait_wcs(pair.a.cq, 1)
        assert (wc.wr_id, wc.status) == (8, WcStatus.REM_ACCESS_ERR)
        assert cas[1].query().fw_version.endswith(f"({engine[0] if engine != 'python' else engine}"
                                                  " engine)")  # fmt: skip
    finally:
        mgr.close()
