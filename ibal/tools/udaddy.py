"""``ibal udaddy``: librdmacm's ``udaddy`` (rdma-core 44) over ``ibal.cm.rdma``.

The UDP port space: the client resolves each of ``connections`` peers with a
SIDR_REQ carrying the RDMA CM header (:func:`ibal.cm.rdma.resolve_udp`),
sends ``count`` datagrams of ``size`` bytes to each (SEND with immediate: its
own QPN, which the server answers) and receives as many back; the server
answers ``connections`` SIDR_REQs on port 7174, receives ``count`` datagrams
from each, then replies to the QPN it read in their immediate data.  Printed
lines are udaddy's, so either side interoperates with the real ``udaddy``.
Every QP is UD with ``RDMA_UDP_QKEY``, the Q_Key a Linux peer insists on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from ibal.al import AccessLayer, Ca, Cq, Pd, Qp, QpCreate
from ibal.cm.cma import RDMA_UDP_QKEY, PortSpace, gid_of
from ibal.cm.rdma import port_with_gid
from ibal.tools.common import (
    ExchangeOptions,
    ExchangeResult,
    ToolError,
    close_nodes,
    run_checked,
    wait_one,
)
from ibal.types import (
    AccessFlags,
    AvAttr,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    UdDest,
    Wc,
    WcType,
    WrType,
)

__all__ = ["UDADDY_PORT", "UdEnd", "UdaddyError", "UdaddyOptions", "UdaddyResult", "run"]

UDADDY_PORT = 7174
"""udaddy's port (fixed in the tool; the server listens on ``(UDP << 16) + 7174``)."""
GRH_SIZE = 40  # a UD receive starts with the GRH area


class UdaddyError(ToolError):
    """A udaddy run that could not complete (udaddy's "return status" would not be 0)."""


@dataclass
class UdaddyOptions(ExchangeOptions):
    """``udaddy [-s server] [-b bind] [-c connections] [-C message_count] [-S message_size]``."""

    server: str | None = None
    """The server's address: run the client (else the server)."""
    port: int = UDADDY_PORT
    error: ClassVar[type[ToolError]] = UdaddyError


UdaddyResult = ExchangeResult


class UdEnd:
    """One udaddy (or mckey) node: a CQ, a UD QP with ``RDMA_UDP_QKEY``, receive slots of
    GRH + size posted at once (unless ``recvs`` is false: mckey's sender), and the
    source of its sends."""

    def __init__(self, pd: Pd, port_num: int, count: int, size: int, *, recvs: bool = True,
                 error: type[ToolError] = UdaddyError) -> None:  # fmt: skip
        self.pd, self.count, self.size, self._error = pd, count, size, error
        self.cq: Cq = pd.ca.create_cq(max(2, 2 * count))
        depth = max(1, count)
        self.qp: Qp = pd.create_qp(QpCreate(QpType.UD, self.cq, self.cq, sq_depth=depth,
                                            rq_depth=depth))  # fmt: skip
        for mod in (QpMod(QpState.INIT, port_num=port_num, pkey_index=0, qkey=RDMA_UDP_QKEY),
                    QpMod(QpState.RTR), QpMod(QpState.RTS, sq_psn=0)):  # fmt: skip
            self.qp.modify(mod)
        self.slot = GRH_SIZE + size
        self.buf = bytearray(self.slot * count + size)
        self.mr = pd.reg_mem(self.buf, AccessFlags.LOCAL_WRITE)
        self._src = self.slot * count
        for i in range(count if recvs else 0):
            self.qp.post_recv(RecvWr(i, [self.mr.sge(i * self.slot, self.slot)]))

    def send(self, av: AvAttr, qpn: int, qkey: int, timeout: float) -> None:
        """``count`` datagrams of ``size`` bytes (message ``i`` is bytes ``i``), each with
        this QP's number as immediate data, as udaddy's ``post_sends``."""
        if not self.count:
            return
        ah = self.pd.create_av(av)
        try:
            for i in range(self.count):
                self.buf[self._src : self._src + self.size] = bytes([i & 0xFF]) * self.size
                self.qp.post_send(SendWr(1000 + i, WrType.SEND,
                                         [self.mr.sge(self._src, self.size)],
                                         send_opt=SendOpt.SIGNALED | SendOpt.IMMEDIATE,
                                         imm=self.qp.num,
                                         ud=UdDest(av=ah, remote_qp=qpn, remote_qkey=qkey)))
                wait_one(self.cq, WcType.SEND, timeout, self._error)  # the slot is reused
        finally:
            ah.destroy()

    def receive(self, timeout: float) -> list[Wc]:
        """The ``count`` datagrams that come (``InvalidSetting``-free: a failed one is the
        run's failure)."""
        return [wait_one(self.cq, WcType.RECV, timeout, self._error) for _ in range(self.count)]

    def payload(self, wc: Wc) -> bytes:
        off = wc.wr_id * self.slot + GRH_SIZE
        return bytes(self.buf[off : off + wc.length - GRH_SIZE])

    def close(self) -> None:
        self.qp.destroy()
        self.cq.destroy()
        self.mr.dereg()


def run(al: AccessLayer, opts: UdaddyOptions, *, out: Callable[[str], None] = print,
        listening: Callable[[], object] = lambda: None) -> UdaddyResult:  # fmt: skip
    """One udaddy run: the client when ``opts.server`` is set, else the server
    (``listening()`` is called once its listen is in place)."""
    return run_checked(opts, "udaddy", lambda: _client(al, opts, out) if opts.server
                       else _server(al, opts, out, listening))  # fmt: skip


def _client(al: AccessLayer, opts: UdaddyOptions, out: Callable[[str], None]) -> UdaddyResult:
    from ibal.cm import rdma

    assert opts.server is not None
    out("udaddy: starting client")
    out("udaddy: connecting")
    route = rdma.resolve_route(al, opts.server, src=opts.bind)
    ca = al.open_ca(route.ca_guid)
    pd = ca.alloc_pd()
    ends: list[UdEnd] = []
    try:
        peers = []
        for _ in range(opts.connections):
            ends.append(UdEnd(pd, route.port_num, opts.messages, opts.size))  # receives first
            peers.append(rdma.resolve_udp(al, opts.server, opts.port, route=route))
        if opts.messages:
            out("initiating data transfers")
            for end, peer in zip(ends, peers, strict=True):
                end.send(peer.av, peer.qpn, peer.qkey, opts.timeout)
            out("receiving data transfers")
            got = [[end.payload(w) for w in end.receive(opts.timeout)] for end in ends]
            out("data transfers complete")
        else:
            got = [[] for _ in ends]
    finally:
        close_nodes(ends, pd, ca)
    out("test complete")
    out("return status 0")
    return ExchangeResult(got)


def _server(al: AccessLayer, opts: UdaddyOptions, out: Callable[[str], None],
            listening: Callable[[], object]) -> UdaddyResult:  # fmt: skip
    from ibal.cm import rdma

    out("udaddy: starting server")
    ends: list[UdEnd] = []
    incoming: list[rdma.RdmaIncoming] = []
    came = threading.Condition()
    pds: dict[int, tuple[Ca, Pd]] = {}

    def arrived(inc: rdma.RdmaIncoming) -> None:
        """Misc queue: each SIDR_REQ gets a node of its own on the port it came to."""
        with came:
            if len(incoming) >= opts.connections:
                inc.incoming.reject()  # udaddy: "failing connection request"
                return
            guid, port_num = port_with_gid(al, gid_of(inc.dst[0]), UdaddyError)
            if guid not in pds:
                ca = al.open_ca(guid)
                pds[guid] = (ca, ca.alloc_pd())
            end = UdEnd(pds[guid][1], port_num, opts.messages, opts.size)
            inc.answer(end.qp)
            ends.append(end)
            incoming.append(inc)
            came.notify_all()

    got: list[list[bytes]] = []
    try:
        with rdma.listen(al, opts.port, ps=PortSpace.UDP, addr=opts.bind, callback=arrived), \
                came:  # fmt: skip
            listening()
            if not came.wait_for(lambda: len(ends) >= opts.connections, opts.timeout):
                raise UdaddyError(f"udaddy: {len(ends)} of {opts.connections} peers came")
        if opts.messages:
            out("receiving data transfers")
            wcs = [end.receive(opts.timeout) for end in ends]
            got = [[end.payload(w) for w in ws] for end, ws in zip(ends, wcs, strict=True)]
            out("sending replies")
            for end, inc, ws in zip(ends, incoming, wcs, strict=True):
                qpn = ws[0].imm if ws else None
                if qpn is None:
                    raise UdaddyError("udaddy: the peer's datagrams carry no QPN (immediate)")
                ca = pds[end.pd.ca.guid][0]
                port = next(p for p in ca.query().ports if p.port_num == end.qp.query().port_num)
                sgid = port.gid_index(gid_of(inc.dst[0]).packed)
                # udaddy answers the QPN in the immediate data, not the DETH's source QPN
                end.send(inc.peer_av(port.port_num, sgid if sgid is not None else 0),
                         qpn, RDMA_UDP_QKEY, opts.timeout)  # fmt: skip
            out("data transfers complete")
    finally:
        for ca, pd in pds.values():
            close_nodes([e for e in ends if e.pd is pd], pd, ca)
    out("test complete")
    out("return status 0")
    return ExchangeResult(got)
