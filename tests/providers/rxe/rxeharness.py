"""Two rxe transport cores back to back over a scripted wire with a manual clock.

The wire copies every payload when a packet leaves (as encoding would), and
can drop, duplicate, reorder or rewrite packets through a ``fault`` hook.
"""

from __future__ import annotations

import inspect
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType

from ibal.providers.rxe import wire
from ibal.transport.core import QpCore
from ibal.transport.policy import RXE_POLICY, TransportPolicy
from ibal.transport.qp import Counters, QpConfig
from ibal.types import (
    AccessFlags,
    AsyncEvent,
    QpState,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    Sge,
    UdDest,
    Wc,
    WrType,
)
from ibal.wire import iba
from ibal.wire.packet import Packet

RW = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ | AccessFlags.ATOMIC


@dataclass
class Region:
    buf: bytearray
    vaddr: int
    access: AccessFlags
    lkey: int
    rkey: int

    def view(self, addr: int, length: int) -> memoryview:
        off = addr - self.vaddr
        return memoryview(self.buf)[off : off + length]


class FakeMemory:
    """MemoryAccess over byte arrays, with key, range and access checks."""

    def __init__(self, seed: int) -> None:
        self.by_key: dict[int, Region] = {}
        self.next_vaddr = 0x10000 + seed * 0x1000_0000
        self.next_key = 0x100 + seed * 0x10000
        self.invalidated: list[int] = []

    def register(self, size: int, access: AccessFlags = RW, fill: int | None = None) -> Region:
        buf = bytearray(size) if fill is None else bytearray([fill]) * size
        key = self.next_key
        self.next_key += 2
        r = Region(buf, self.next_vaddr, access, key, key + 1)
        self.next_vaddr += (size + 0xFFF) & ~0xFFF or 0x1000
        self.by_key[r.lkey] = r
        self.by_key[r.rkey] = r
        return r

    def _find(self, key: int, addr: int, length: int, lkey: bool) -> Region | None:
        r = self.by_key.get(key)
        if r is None or (r.lkey if lkey else r.rkey) != key:
            return None
        if addr < r.vaddr or addr + length > r.vaddr + len(r.buf):
            return None
        return r

    def local(self, lkey: int, addr: int, length: int, write: bool) -> memoryview | None:
        r = self._find(lkey, addr, length, True)
        if r is None or (write and not r.access & AccessFlags.LOCAL_WRITE):
            return None
        return r.view(addr, length)

    def recv(self, lkey: int, addr: int, length: int) -> memoryview | None:
        return self.local(lkey, addr, length, True)

    def remote(self, rkey: int, va: int, length: int, access: int) -> memoryview | None:
        r = self._find(rkey, va, length, False)
        if r is None or not r.access & access:
            return None
        return r.view(va, length)

    def invalidate(self, rkey: int) -> bool:
        r = self.by_key.get(rkey)
        if r is None or r.rkey != rkey:
            return False
        del self.by_key[rkey]
        self.invalidated.append(rkey)
        return True


class FakeRq:
    def __init__(self) -> None:
        self.wqes: deque[tuple[int, Sequence[Sge]]] = deque()

    def take(self) -> tuple[int, Sequence[Sge]] | None:
        return self.wqes.popleft() if self.wqes else None

    def drain(self) -> list[int]:
        ids = [w[0] for w in self.wqes]
        self.wqes.clear()
        return ids


@dataclass
class Av:
    dst_ip: bytes


@dataclass
class Node:
    name: str
    core: QpCore
    mem: FakeMemory
    rq: FakeRq
    ip: bytes
    send_wcs: list[Wc] = field(default_factory=list)
    recv_wcs: list[Wc] = field(default_factory=list)
    solicited: list[bool] = field(default_factory=list)
    events: list[AsyncEvent] = field(default_factory=list)

    @property
    def cfg(self) -> QpConfig:
        return self.core.cfg

    @property
    def counters(self) -> Counters:
        return self.core.counters

    def post_recv(self, region: Region, length: int | None = None, wr_id: int = 0,
                  offset: int = 0) -> None:
        n = len(region.buf) - offset if length is None else length
        self.rq.wqes.append((wr_id, (Sge(region.vaddr + offset, n, region.lkey),)))
        self.core.recv_posted()

    def post_recv_wr(self, wr: RecvWr) -> None:
        self.rq.wqes.append((wr.wr_id, tuple(wr.sg_list)))
        self.core.recv_posted()

    def collect(self) -> None:
        out = self.core.out
        self.send_wcs += out.send_wcs
        out.send_wcs.clear()
        for wc, se in out.recv_wcs:
            self.recv_wcs.append(wc)
            self.solicited.append(se)
        out.recv_wcs.clear()
        self.events += out.events
        out.events.clear()


Fault = Callable[[Packet, str], list[Packet]]
"""Given a packet and the sender's name, what the wire delivers (``[]`` drops it)."""


TRAINS = False
"""Whether a :class:`Wire` polls with trains by default (test_rxe_train reruns the core tests)."""
RUNS = False
"""Whether a :class:`Wire` polls with whole-WQE runs by default (test_rxe_fasttx reruns them)."""


class Wire:
    """Two nodes, a manual clock and the packets in flight."""

    def __init__(self, a: Node, b: Node, fault: Fault | None = None,
                 rng: random.Random | None = None, reorder: float = 0.0,
                 codec: bool = False, trains: bool | None = None,
                 runs: bool | None = None) -> None:
        self.codec = codec
        # poll_trains, each train (or WQE run) expanded into the packets the socket
        # layer sends
        self.runs = RUNS if runs is None else runs
        self.trains = self.runs or (TRAINS if trains is None else trains)
        self.a = a
        self.b = b
        self.now = 0.0
        self.fault = fault
        self.rng = rng or random.Random(0)
        self.reorder = reorder
        self.in_flight: list[tuple[Node, Packet]] = []
        self.log: list[tuple[str, Packet]] = []

    def peer(self, n: Node) -> Node:
        return self.b if n is self.a else self.a

    def step(self) -> bool:
        """Send what both nodes have, deliver it; True if anything moved."""
        moved = False
        for n in (self.a, self.b):
            for pkt in self._poll(n):
                if self.codec:  # through the real encoder and decoder
                    q = iba.decode(wire.encode_bytes(pkt, 0))
                    q.src_ip, q.dst_ip, q.src_port = pkt.src_ip, pkt.dst_ip, pkt.src_port
                    pkt = q
                else:
                    pkt.payload = bytes(pkt.payload)  # the wire copies
                self.log.append((n.name, pkt))
                copies = [pkt] if self.fault is None else self.fault(pkt, n.name)
                for c in copies:
                    self.in_flight.append((self.peer(n), c))
                moved = True
        batch = self.in_flight
        self.in_flight = []
        if self.reorder and len(batch) > 1 and self.rng.random() < self.reorder:
            self.rng.shuffle(batch)
        for dst, pkt in batch:
            dst.core.receive(pkt, self.now)
            moved = True
        self.a.collect()
        self.b.collect()
        return moved

    def _poll(self, n: Node) -> list[Packet]:
        if not self.trains:
            return n.core.poll(self.now)
        items, count = n.core.poll_trains(self.now, runs=self.runs)
        pkts: list[Packet] = []
        for it in items:
            pkts.extend([it] if isinstance(it, Packet) else it.packets())
        assert len(pkts) == count
        return pkts

    def run(self, max_time: float = 60.0, max_steps: int = 200_000) -> None:
        """Step until idle; then jump the clock to the next timer, until none is left."""
        for _ in range(max_steps):
            if self.step():
                continue
            deadlines = [d for d in (self.a.core.next_deadline(), self.b.core.next_deadline())
                         if d is not None]
            if not deadlines:
                return
            t = min(deadlines)
            if t > max_time:
                return
            self.now = max(self.now, t)
            for n in (self.a, self.b):
                d = n.core.next_deadline()
                if d is not None and d <= self.now:
                    n.core.handle_timer(self.now)
            self.a.collect()
            self.b.collect()
        raise AssertionError("wire did not settle")

    def advance(self, dt: float) -> None:
        """Move the clock by ``dt``, firing due timers, then settle without further timers."""
        self.now += dt
        for n in (self.a, self.b):
            d = n.core.next_deadline()
            if d is not None and d <= self.now:
                n.core.handle_timer(self.now)
        while self.step():
            pass


def make_node(name: str, qp_type: QpType, qpn: int, seed: int, ip: bytes,
              counters: Counters | None = None,
              policy: TransportPolicy = RXE_POLICY) -> Node:
    cfg = QpConfig(qpn, qp_type)
    cfg.src_ip = ip
    mem = FakeMemory(seed)
    rq = FakeRq()
    core = QpCore(cfg, mem, rq, counters, policy)
    return Node(name, core, mem, rq, ip)


def connect(
    qp_type: QpType = QpType.RC,
    *,
    mtu: int = 256,
    psn_a: int = 0x100,
    psn_b: int = 0x200,
    access: AccessFlags = RW,
    retry_cnt: int = 7,
    rnr_retry: int = 7,
    timeout: int = 10,
    min_rnr_timer: int = 1,
    depth: int = 4,
    policy: TransportPolicy = RXE_POLICY,
) -> tuple[Node, Node]:
    """Two connected (RC/UC) or datagram (UD/QP1) QPs in RTS."""
    a = make_node("a", qp_type, 0x11 if qp_type is not QpType.QP1 else 1, 0, b"\x0a\x00\x00\x01",
                  policy=policy)
    b = make_node("b", qp_type, 0x22 if qp_type is not QpType.QP1 else 1, 1, b"\x0a\x00\x00\x02",
                  policy=policy)
    for n, peer, sq, rq in ((a, b, psn_a, psn_b), (b, a, psn_b, psn_a)):
        cfg = n.cfg
        cfg.dest_qpn = peer.cfg.qpn
        cfg.dst_ip = peer.ip
        cfg.mtu = mtu
        cfg.access = int(access)
        cfg.retry_cnt = retry_cnt
        cfg.rnr_retry = rnr_retry
        cfg.local_ack_timeout = timeout
        cfg.min_rnr_timer = min_rnr_timer
        cfg.init_depth = depth
        cfg.resp_res = depth
        cfg.qkey = 0x1234
        n.core.set_psns(sq, rq)
        n.core.set_state(QpState.INIT)
        n.core.set_state(QpState.RTR)
        n.core.set_state(QpState.RTS)
    return a, b


def send_wr(
    op: WrType,
    region: Region | None = None,
    length: int | None = None,
    *,
    wr_id: int = 0,
    offset: int = 0,
    remote: Region | None = None,
    remote_offset: int = 0,
    imm: int | None = None,
    solicited: bool = False,
    signaled: bool = True,
    compare_add: int = 0,
    swap: int = 0,
    ud: UdDest | None = None,
) -> SendWr:
    sges: tuple[Sge, ...] = ()
    if region is not None:
        n = len(region.buf) - offset if length is None else length
        sges = (Sge(region.vaddr + offset, n, region.lkey),)
    opt = SendOpt.NONE
    if signaled:
        opt |= SendOpt.SIGNALED
    if imm is not None:
        opt |= SendOpt.IMMEDIATE
    if solicited:
        opt |= SendOpt.SOLICITED
    return SendWr(
        wr_id=wr_id, opcode=op, sg_list=sges, send_opt=opt, imm=imm or 0,
        remote_addr=(remote.vaddr + remote_offset) if remote is not None else 0,
        rkey=remote.rkey if remote is not None else 0,
        compare_add=compare_add, swap=swap, ud=ud,
    )


def plain_tests(module: ModuleType) -> list[tuple[str, Callable[[], None]]]:
    """The ``test_`` functions of ``module`` that take no fixture and carry no mark,
    to run once more under another mode of this harness (trains, whole-WQE runs)."""
    return [(name, fn) for name, fn in vars(module).items()
            if name.startswith("test_") and inspect.isfunction(fn)
            and not inspect.signature(fn).parameters and not hasattr(fn, "pytestmark")]  # fmt: skip
