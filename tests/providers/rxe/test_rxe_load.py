"""Faults and load on the rxe provider (issue 8): many RC QPs on one device, and a
flood of forged datagrams during a transfer.  Two devices, 127.0.0.12 and
127.0.0.13, in one process through real raw/UDP sockets."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from netns_util import need_root

from ibal.al import AlManager, Ca, QpCreate
from ibal.providers.rxe import wire
from ibal.providers.rxe.provider import RxeProvider
from ibal.testing.helpers import (
    active_port,
    mr_access,
    to_init,
    to_rtr,
    to_rts,
    wait_until,
    wait_wcs,
)
from ibal.types import (
    AvAttr,
    Grh,
    Mtu,
    PortAttr,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    Sge,
    WcStatus,
    WcType,
    WrType,
)
from ibal.wire import iba
from ibal.wire.packet import Opcode, Packet

DEVICES = "rxe_l0=127.0.0.12,rxe_l1=127.0.0.13"
A_IP, B_IP = "127.0.0.12", "127.0.0.13"

Two = tuple[RxeProvider, Ca, PortAttr, Ca, PortAttr]


@pytest.fixture
def two() -> Iterator[Two]:
    need_root()
    mgr = AlManager()
    provider = RxeProvider({"devices": DEVICES})
    mgr.add_provider(provider)
    try:
        al = mgr.open_al()
        cas = sorted((al.open_ca(g) for g in al.get_ca_guids()), key=lambda c: c.name)
        ports = [active_port(c.query().ports) for c in cas]
        assert ports[0] is not None and ports[1] is not None
        yield provider, cas[0], ports[0], cas[1], ports[1]
    finally:
        mgr.close()


def _av(remote: PortAttr, local: PortAttr) -> AvAttr:
    return AvAttr(port_num=local.port_num, grh=Grh(dgid=remote.gid_table[0].gid))


N_QPS = 1000
MSG = 48


def _message(i: int) -> bytes:
    return f"pair {i:04d} ".encode().ljust(MSG, bytes([i & 0xFF]))


def test_a_thousand_rc_qps_each_move_their_own_message(two: Two) -> None:
    """1,000 RC QPs on one device, each connected to its own QP on the other;
    every pair moves a distinct message (even: SEND, odd: WRITE)."""
    _, a, pa, b, pb = two
    acc = mr_access(a.capabilities)
    pd_a, pd_b = a.alloc_pd(), b.alloc_pd()
    cq_a, cq_b = a.create_cq(2 * N_QPS), b.create_cq(2 * N_QPS)
    buf_a, buf_b = bytearray(N_QPS * MSG), bytearray(N_QPS * MSG + 64)
    mr_a, mr_b = pd_a.reg_mem(buf_a, acc), pd_b.reg_mem(buf_b, acc)
    t0 = time.monotonic()
    qa = [
        pd_a.create_qp(QpCreate(QpType.RC, send_cq=cq_a, recv_cq=cq_a, sq_depth=2, rq_depth=1))
        for _ in range(N_QPS)
    ]
    qb = [
        pd_b.create_qp(QpCreate(QpType.RC, send_cq=cq_b, recv_cq=cq_b, sq_depth=1, rq_depth=2))
        for _ in range(N_QPS)
    ]
    av_ab, av_ba = _av(pb, pa), _av(pa, pb)
    for x, y in zip(qa, qb, strict=True):
        for q, port in ((x, pa), (y, pb)):
            to_init(q, port.port_num, acc)
        to_rtr(x, av_ab, Mtu.MTU_1024, y.num)
        to_rtr(y, av_ba, Mtu.MTU_1024, x.num)
        to_rts(x)
        to_rts(y)
    t_setup = time.monotonic() - t0
    assert len({q.num for q in qa}) == N_QPS
    for i in range(N_QPS):
        buf_a[i * MSG : (i + 1) * MSG] = _message(i)
    t1 = time.monotonic()
    for i, (x, y) in enumerate(zip(qa, qb, strict=True)):
        src = Sge(addr=mr_a.vaddr + i * MSG, length=MSG, lkey=mr_a.lkey)
        if i % 2 == 0:
            y.post_recv(RecvWr(wr_id=i, sg_list=[Sge(mr_b.vaddr + i * MSG, MSG, mr_b.lkey)]))
            x.post_send(SendWr(wr_id=i, opcode=WrType.SEND, sg_list=[src]))
        else:
            x.post_send(SendWr(wr_id=i, opcode=WrType.RDMA_WRITE, sg_list=[src],
                               remote_addr=mr_b.vaddr + i * MSG, rkey=mr_b.rkey))  # fmt: skip
    sends = wait_wcs(cq_a, N_QPS, timeout=60)
    recvs = wait_wcs(cq_b, N_QPS // 2, timeout=60)
    t_move = time.monotonic() - t1
    by_qp = {q.num: i for i, q in enumerate(qa)}
    assert sorted((by_qp[w.qp_num], w.wr_id) for w in sends) == [(i, i) for i in range(N_QPS)]
    assert {w.status for w in sends} == {WcStatus.SUCCESS}
    by_qp_b = {q.num: i for i, q in enumerate(qb)}
    assert sorted((by_qp_b[w.qp_num], w.wr_id, w.length) for w in recvs) == [
        (i, i, MSG) for i in range(0, N_QPS, 2)
    ]
    assert {(w.status, w.wc_type) for w in recvs} == {(WcStatus.SUCCESS, WcType.RECV)}
    for i in range(N_QPS):
        assert bytes(buf_b[i * MSG : (i + 1) * MSG]) == _message(i), i
    assert bytes(buf_b[N_QPS * MSG :]) == bytes(64)
    assert not cq_a.poll(1) and not cq_b.poll(1)
    assert {q.query().state for q in qa + qb} == {QpState.RTS}
    print(f"\n{N_QPS} RC pairs: set-up {t_setup:.2f} s, one message each {t_move:.2f} s")


# ------------------------------------------------------------------ forged flood

G = 64 * 1024  # guard bytes either side of the receiver's registered range
CHUNK = 512 * 1024
N_WRS = 24  # 12 MiB: WRITEs and SENDs alternating
PER_KIND = 300  # forged datagrams of each kind
OLD = 0xFFFFFF  # PSNs counted back from here are "behind" a stream that starts at 0


def _forge(
    kind: str, i: int, rng: random.Random, qpn: int, rkey: int, va: int, src: str, sport: int
) -> tuple[bytes, str]:
    """One forged UDP payload from ``src`` and the drop reason the receiver must count."""
    if kind == "garbage":
        while True:
            d = rng.randbytes(rng.randrange(0, 200))
            try:
                iba.decode(d)
            except iba.Malformed as e:
                return d, e.reason.value
            if not wire.icrc_ok(d, wire.icrc_prefix_ipv4(_ip(src), _ip(B_IP), len(d), sport)):
                return d, "bad_icrc"
    # Old PSNs, no AckReq: a duplicate the responder drops silently (IBA 9.7.5.1.1);
    # the expected PSN would execute or NAK, a newer one NAK: both would disturb the stream.
    psn = (OLD - i) & 0xFFFFFF
    if kind == "bad_rkey":
        p = Packet(Opcode.RC_RDMA_WRITE_ONLY, qpn, psn, b"\xee" * 64)
        p.rkey = rkey ^ (1 + i % 255)
        p.va = va - G + (i * 64) % (2 * G) if i % 2 else va + i % CHUNK
        p.dma_len = 64
        reason = "duplicate"
    else:
        p = Packet(
            Opcode.RC_SEND_ONLY,
            qpn if kind != "unknown_qpn" else UNKNOWN_QPN,
            psn,
            f"forged {i}".encode(),
        )
        reason = {
            "bad_icrc": "bad_icrc",
            "unknown_qpn": "unknown_qpn",
            "old_psn": "duplicate",
            "wrong_source": "wrong_source",
        }[kind]
    n = len(iba.encode_headers(p)) + len(p.payload) + p.pad + 4
    out = bytearray(wire.encode_bytes(p, wire.icrc_prefix_ipv4(_ip(src), _ip(B_IP), n, sport)))
    if kind == "bad_icrc":
        out[-1 - i % 4] ^= 0x5A
    return bytes(out), reason


UNKNOWN_QPN = 0x7FFFF0


def _ip(s: str) -> bytes:
    return socket.inet_aton(s)


def _sock(src: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = DO: DF and ID 0, as the ICRC assumed
    s.bind((src, 0))
    return s


class Stream:
    """An RC QP pair A -> B with N_WRS alternating WRITEs and SENDs of CHUNK bytes,
    B's registered range with G guard bytes either side."""

    def __init__(self, a: Ca, pa: PortAttr, b: Ca, pb: PortAttr) -> None:
        acc = mr_access(a.capabilities)
        pd_a, pd_b = a.alloc_pd(), b.alloc_pd()
        self.cq_a, self.cq_b = a.create_cq(64), b.create_cq(64)
        self.total = N_WRS * CHUNK
        self.src = bytearray(random.Random(1).randbytes(self.total))
        self.mr_a = pd_a.reg_mem(self.src, acc)
        self.big = bytearray(b"\x5c" * (G + self.total + G))
        self.mr_b = pd_b.reg_mem(memoryview(self.big)[G : G + self.total], acc)
        cq_a, cq_b = self.cq_a, self.cq_b
        self.qa = pd_a.create_qp(QpCreate(QpType.RC, send_cq=cq_a, recv_cq=cq_a, sq_depth=N_WRS))
        self.qb = pd_b.create_qp(QpCreate(QpType.RC, send_cq=cq_b, recv_cq=cq_b, rq_depth=N_WRS))
        to_init(self.qa, pa.port_num, acc)
        to_init(self.qb, pb.port_num, acc)
        to_rtr(self.qa, _av(pb, pa), Mtu.MTU_4096, self.qb.num)
        to_rtr(self.qb, _av(pa, pb), Mtu.MTU_4096, self.qa.num)
        to_rts(self.qa)
        to_rts(self.qb)
        assert UNKNOWN_QPN not in (self.qa.num, self.qb.num)

    def post(self) -> None:
        mr_a, mr_b = self.mr_a, self.mr_b
        for j in range(1, N_WRS, 2):
            dst = Sge(mr_b.vaddr + j * CHUNK, CHUNK, mr_b.lkey)
            self.qb.post_recv(RecvWr(wr_id=j, sg_list=[dst]))
        for j in range(N_WRS):
            sge = Sge(mr_a.vaddr + j * CHUNK, CHUNK, mr_a.lkey)
            if j % 2:
                self.qa.post_send(SendWr(wr_id=j, opcode=WrType.SEND, sg_list=[sge]))
            else:
                self.qa.post_send(SendWr(wr_id=j, opcode=WrType.RDMA_WRITE, sg_list=[sge],
                                         remote_addr=mr_b.vaddr + j * CHUNK,
                                         rkey=mr_b.rkey))  # fmt: skip

    def wait(self) -> None:
        """One successful completion per WR, the bytes exact, the guards untouched."""
        sends = wait_wcs(self.cq_a, N_WRS, timeout=60)
        recvs = wait_wcs(self.cq_b, N_WRS // 2, timeout=60)
        assert [(w.wr_id, w.status) for w in sends] == [(j, WcStatus.SUCCESS) for j in range(N_WRS)]
        assert [(w.wr_id, w.status, w.length) for w in recvs] == [
            (j, WcStatus.SUCCESS, CHUNK) for j in range(1, N_WRS, 2)
        ]

    def check(self) -> None:
        big, total = self.big, self.total
        assert big[G : G + total] == self.src
        assert big[:G] == b"\x5c" * G and big[G + total :] == b"\x5c" * G
        assert not self.cq_a.poll(1) and not self.cq_b.poll(1)
        assert self.qa.query().state is QpState.RTS and self.qb.query().state is QpState.RTS


def _flood(st: Stream, sport_a: int, sport_x: int) -> list[tuple[str, bytes, str]]:
    rng = random.Random(8)
    flood = []
    for i in range(PER_KIND):
        for kind in ("garbage", "bad_icrc", "unknown_qpn", "old_psn", "bad_rkey",
                     "wrong_source"):  # fmt: skip
            x = kind == "wrong_source"
            src_ip, sport = (X_IP, sport_x) if x else (A_IP, sport_a)
            d, reason = _forge(kind, i, rng, st.qb.num, st.mr_b.rkey, st.mr_b.vaddr, src_ip, sport)
            flood.append((src_ip, d, reason))
    return flood


X_IP = "127.0.0.14"  # neither device's address
ACCOUNTED = ("short", "bad_opcode", "bad_tver", "bad_length", "bad_pad", "bad_icrc",
             "unknown_qpn", "duplicate", "wrong_source")  # fmt: skip


def _hooked(monkeypatch: pytest.MonkeyPatch) -> list[BaseException | None]:
    """What any thread let escape (the receive threads must let nothing escape)."""
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    return raised


def test_forged_flood_does_not_stop_a_transfer(two: Two, monkeypatch: pytest.MonkeyPatch) -> None:
    """Paced so the kernel loses nothing: every forged datagram counted under its reason."""
    provider, a, pa, b, pb = two
    raised = _hooked(monkeypatch)
    st = Stream(a, pa, b, pb)
    dev_b = next(ca for ca in provider.cas if ca.name == "rxe_l1").device.counters
    before, before_a = b.query_port_counters(1), a.query_port_counters(1)

    def seen() -> int:
        return sum(dev_b.drops.get(r, 0) - before.get(f"drop_{r}", 0) for r in ACCOUNTED)

    with _sock(A_IP) as s_a, _sock(X_IP) as s_x:
        flood = _flood(st, s_a.getsockname()[1], s_x.getsockname()[1])
        expected = Counter(reason for _, _, reason in flood)
        sent = [0]
        stop = threading.Event()

        def blast() -> None:
            # bursts of 32, each when the receiver has counted what came before:
            # the kernel's socket buffer never overflows, so every datagram is counted
            deadline = time.monotonic() + 20
            for k in range(0, len(flood), 32):
                while seen() < sent[0] and time.monotonic() < deadline and not stop.is_set():
                    time.sleep(0.0005)
                if time.monotonic() >= deadline or stop.is_set():
                    return
                for src_ip, d, _ in flood[k : k + 32]:
                    (s_x if src_ip != A_IP else s_a).sendto(d, (B_IP, 4791))
                    sent[0] += 1

        flooder = threading.Thread(target=blast)
        flooder.start()
        try:
            wait_until(lambda: sent[0] > 0, "the flood to start")
            st.post()
            st.wait()
            sent_at_done, seen_at_done = sent[0], seen()
        finally:
            flooder.join(30)
            stop.set()
        assert not flooder.is_alive()
    assert sent[0] == len(flood)
    assert seen_at_done > 0  # forged datagrams arrived while the stream ran
    st.check()
    wait_until(lambda: seen() >= len(flood), "every forged datagram counted")
    after = b.query_port_counters(1)
    got = {r: after.get(f"drop_{r}", 0) - before.get(f"drop_{r}", 0) for r in ACCOUNTED}
    # genuine retransmissions (none expected on lo) would add duplicates, never take any
    dup = got.pop("duplicate")
    assert dup >= expected.pop("duplicate")
    assert got == {r: expected.get(r, 0) for r in got}
    # nothing forged was ahead of the stream: no sequence NAK, no go-back-N at the sender
    assert after["out_of_seq_request"] == before["out_of_seq_request"]
    assert a.query_port_counters(1)["rcvd_seq_err"] == before_a["rcvd_seq_err"]
    assert after["duplicate_request"] - before["duplicate_request"] >= 2 * PER_KIND
    assert after.get("drop_handler_error", 0) == before.get("drop_handler_error", 0)
    assert raised == []
    print(
        f"\nflood: {sent_at_done} of {len(flood)} sent when the stream completed "
        f"({seen_at_done} counted); duplicate {dup}, {got}"
    )


BLAST_ROUNDS = 10  # the 1,800 forged datagrams, this many times, as fast as a thread can


def test_unpaced_blast_does_not_stop_a_transfer(two: Two, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unpaced: the kernel may drop forged and genuine datagrams alike when the
    receive buffer overflows; the stream still completes (retries), nothing is
    counted twice, nothing escapes the receive thread."""
    _, a, pa, b, pb = two
    raised = _hooked(monkeypatch)
    st = Stream(a, pa, b, pb)
    before = b.query_port_counters(1)
    with _sock(A_IP) as s_a, _sock(X_IP) as s_x:
        flood = _flood(st, s_a.getsockname()[1], s_x.getsockname()[1])
        sent = [0]
        stop = threading.Event()

        def blast() -> None:
            deadline = time.monotonic() + 10
            for _ in range(BLAST_ROUNDS):
                for src_ip, d, _ in flood:
                    if stop.is_set() or time.monotonic() >= deadline:
                        return
                    (s_x if src_ip != A_IP else s_a).sendto(d, (B_IP, 4791))
                    sent[0] += 1

        flooder = threading.Thread(target=blast)
        flooder.start()
        try:
            wait_until(lambda: sent[0] > 0, "the flood to start")
            st.post()
            st.wait()
            sent_at_done = sent[0]
        finally:
            flooder.join(30)
            stop.set()
        assert not flooder.is_alive()
    st.check()
    after = b.query_port_counters(1)
    got = {r: after.get(f"drop_{r}", 0) - before.get(f"drop_{r}", 0) for r in ACCOUNTED}
    forged_seen = sum(got.values()) - got["duplicate"]
    assert 0 < forged_seen <= sent[0]
    assert after.get("drop_handler_error", 0) == before.get("drop_handler_error", 0)
    assert raised == []
    print(f"\nblast: {sent_at_done} sent when the stream completed, {sent[0]} in all; {got}")
