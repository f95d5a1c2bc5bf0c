"""The main job on the embedded default: two CAs, every opcode, every completion.

``ibal demo`` runs :func:`run_demo` on the in-process mock fabric (no hardware):
open the access layer, build the resource tree on two CAs, connect an RC pair
and a UD pair, move data with each opcode, check it landed, and close.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ibal.al import (
    AccessLayer,
    AlManager,
    Ca,
    ConnectOptions,
    Cq,
    Endpoint,
    Mr,
    Pd,
    Qp,
    QpCreate,
    connect_qp,
    endpoint,
)
from ibal.status import Timeout
from ibal.types import (
    AccessFlags,
    PortAttr,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    Wc,
    WcStatus,
    WrType,
)

ACCESS = (
    AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ | AccessFlags.ATOMIC
)
BUF_SIZE = 4096
UD_QKEY = 0x11111111
WAIT = 10.0
"""Seconds to wait for a completion before the demo gives up."""


def wait_wc(cq: Cq) -> Wc:
    """The next completion on ``cq`` (``cq.wait`` sleeps until the completion upcall)."""
    got = cq.wait(WAIT, max_entries=1)
    if not got:
        raise Timeout(f"no completion within {WAIT} s")
    return got[0]


@dataclass
class Side:
    """One side of the demo: a CA with its PD, CQ, memory and QPs."""

    ca: Ca
    pd: Pd
    cq: Cq
    buf: bytearray
    mr: Mr
    port: PortAttr
    rc: Qp
    ud: Qp

    def endpoints(self) -> tuple[Endpoint, Endpoint]:
        """What this side would send the other out of band: its RC and its UD end."""
        n = self.port.port_num
        return endpoint(self.rc, n, psn=0), endpoint(self.ud, n, psn=0, qkey=UD_QKEY)


@dataclass
class Step:
    """One operation of the demo and what it showed."""

    name: str
    completions: list[tuple[str, Wc]]
    check: str
    ok: bool


@dataclass
class DemoReport:
    cas: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(s.ok for s in self.steps)


def _side(al: AccessLayer, guid: int) -> Side:
    ca = al.open_ca(guid)
    attr = ca.query()
    port = next(p for p in attr.ports if p.link_state.name == "ACTIVE")
    pd = ca.alloc_pd()
    cq = ca.create_cq(64)
    buf = bytearray(BUF_SIZE)
    mr = pd.reg_mem(buf, ACCESS)
    rc = pd.create_qp(QpCreate(QpType.RC, send_cq=cq, recv_cq=cq, sq_depth=32, rq_depth=32))
    ud = pd.create_qp(QpCreate(QpType.UD, send_cq=cq, recv_cq=cq, sq_depth=8, rq_depth=8))
    return Side(ca, pd, cq, buf, mr, port, rc, ud)


@contextmanager
def demo_fabric(manager: AlManager | None = None) -> Iterator[AccessLayer]:
    """An AL over a fresh two-CA mock fabric (or over ``manager``'s CAs)."""
    own = manager is None
    mgr = AlManager() if manager is None else manager
    try:
        if own:
            mgr.start_provider("mock", {"cas": 2})
        al = mgr.open_al()
        try:
            yield al
        finally:
            al.close()
    finally:
        if own:
            mgr.close()


def run_demo(al: AccessLayer, on_step: Callable[[Step], None] | None = None) -> DemoReport:
    """Move data with every opcode between two CAs (or two QPs of one CA) and check it."""
    report = DemoReport()
    guids = al.get_ca_guids()
    a = _side(al, guids[0])
    b = _side(al, guids[1] if len(guids) > 1 else guids[0])
    report.cas = [a.ca.name, b.ca.name]
    # Each side describes its QPs; the records would cross a socket between hosts.
    (a_rc, a_ud), (b_rc, b_ud) = a.endpoints(), b.endpoints()
    opts = ConnectOptions(access=ACCESS if a.ca.capabilities.atomics else None)
    connect_qp(a.rc, a_rc, b_rc, options=opts)
    connect_qp(b.rc, b_rc, a_rc, options=opts)
    a_to_b = connect_qp(a.ud, a_ud, b_ud)  # UD: ready, and the path to B for an AV
    connect_qp(b.ud, b_ud, a_ud)

    def step(name: str, comps: list[tuple[str, Wc]], check: str, ok: bool) -> None:
        ok = ok and all(wc.status is WcStatus.SUCCESS for _, wc in comps)
        s = Step(name, comps, check, ok)
        report.steps.append(s)
        if on_step is not None:
            on_step(s)

    def send_recv(name: str, payload: bytes, opt: SendOpt, imm: int = 0) -> None:
        b.rc.post_recv(RecvWr(wr_id=100, sg_list=[b.mr.sge(1024, 256)]))
        a.buf[0 : len(payload)] = payload
        a.rc.post_send(
            SendWr(
                wr_id=1,
                opcode=WrType.SEND,
                sg_list=[a.mr.sge(0, len(payload))],
                send_opt=opt,
                imm=imm,
            )
        )
        sent, got = wait_wc(a.cq), wait_wc(b.cq)
        landed = bytes(b.buf[1024 : 1024 + len(payload)])
        check = f"receiver got {landed!r}" + (f", imm=0x{got.imm:x}" if got.imm is not None else "")
        ok = landed == payload and got.length == len(payload)
        if opt & SendOpt.IMMEDIATE:
            ok = ok and got.imm == imm
        step(name, [("A", sent), ("B", got)], check, ok)

    send_recv("SEND", b"hello, fabric", SendOpt.SIGNALED)
    send_recv("SEND with immediate", b"with imm", SendOpt.SIGNALED | SendOpt.IMMEDIATE, 0xC0FFEE)

    # RDMA WRITE: A's bytes into B's buffer at offset 2048, no receive consumed.
    a.buf[0:16] = b"written remotely"
    a.rc.post_send(
        SendWr(
            wr_id=2,
            opcode=WrType.RDMA_WRITE,
            sg_list=[a.mr.sge(0, 16)],
            remote_addr=b.mr.vaddr + 2048,
            rkey=b.mr.rkey,
        )
    )
    wc = wait_wc(a.cq)
    landed = bytes(b.buf[2048:2064])
    step("RDMA WRITE", [("A", wc)], f"B's memory holds {landed!r}", landed == b"written remotely")

    b.rc.post_recv(RecvWr(wr_id=101, sg_list=[]))
    a.buf[0:8] = b"imm-wrt!"
    a.rc.post_send(
        SendWr(
            wr_id=3,
            opcode=WrType.RDMA_WRITE,
            sg_list=[a.mr.sge(0, 8)],
            send_opt=SendOpt.SIGNALED | SendOpt.IMMEDIATE,
            imm=0x1234,
            remote_addr=b.mr.vaddr + 2100,
            rkey=b.mr.rkey,
        )
    )
    sent, got = wait_wc(a.cq), wait_wc(b.cq)
    landed = bytes(b.buf[2100:2108])
    step(
        "RDMA WRITE with immediate",
        [("A", sent), ("B", got)],
        f"B's memory holds {landed!r}, imm=0x{got.imm or 0:x}",
        landed == b"imm-wrt!" and got.imm == 0x1234,
    )

    # RDMA READ: B's bytes into A's buffer.
    b.buf[3000:3012] = b"read back me"
    a.rc.post_send(
        SendWr(
            wr_id=4,
            opcode=WrType.RDMA_READ,
            sg_list=[a.mr.sge(512, 12)],
            remote_addr=b.mr.vaddr + 3000,
            rkey=b.mr.rkey,
        )
    )
    wc = wait_wc(a.cq)
    landed = bytes(a.buf[512:524])
    step("RDMA READ", [("A", wc)], f"A's memory holds {landed!r}", landed == b"read back me")

    if a.ca.capabilities.atomics:
        struct.pack_into("<Q", b.buf, 3584, 41)
        a.rc.post_send(
            SendWr(
                wr_id=5,
                opcode=WrType.FETCH_ADD,
                sg_list=[a.mr.sge(1536, 8)],
                remote_addr=b.mr.vaddr + 3584,
                rkey=b.mr.rkey,
                compare_add=1,
            )
        )
        wc = wait_wc(a.cq)
        (old,) = struct.unpack_from("<Q", a.buf, 1536)
        (new,) = struct.unpack_from("<Q", b.buf, 3584)
        step(
            "ATOMIC FETCH_ADD",
            [("A", wc)],
            f"fetched {old}, remote now {new}",
            old == 41 and new == 42,
        )

        a.rc.post_send(
            SendWr(
                wr_id=6,
                opcode=WrType.COMPARE_SWAP,
                sg_list=[a.mr.sge(1544, 8)],
                remote_addr=b.mr.vaddr + 3584,
                rkey=b.mr.rkey,
                compare_add=42,
                swap=7,
            )
        )
        wc = wait_wc(a.cq)
        (old,) = struct.unpack_from("<Q", a.buf, 1544)
        (new,) = struct.unpack_from("<Q", b.buf, 3584)
        step(
            "ATOMIC COMPARE_SWAP",
            [("A", wc)],
            f"fetched {old}, remote now {new}",
            old == 42 and new == 7,
        )

    # UD SEND through an address vector.
    av = a.pd.create_av(a_to_b)
    b.ud.post_recv(RecvWr(wr_id=102, sg_list=[b.mr.sge(0, 40 + 64)]))  # 40-byte GRH first
    a.buf[0:9] = b"datagram!"
    a.ud.post_send(
        SendWr(
            wr_id=7,
            opcode=WrType.SEND,
            sg_list=[a.mr.sge(0, 9)],
            ud=b_ud.ud_dest(av),
        )
    )
    sent, got = wait_wc(a.cq), wait_wc(b.cq)
    landed = bytes(b.buf[40:49])
    step(
        "UD SEND",
        [("A", sent), ("B", got)],
        f"receiver got {landed!r} from QP 0x{got.src_qp:x}"
        + (f" after an {got.network_header.value}" if got.network_header else ""),
        landed == b"datagram!" and got.src_qp == a.ud.num,
    )
    av.destroy()

    for ep in (a, b):
        ep.ca.close(wait=True)
    return report
