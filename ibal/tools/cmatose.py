"""``ibal ucmatose``: librdmacm's ``ucmatose`` (rdma-core 44's cmatose) over ``ibal.cm.rdma``.

The server accepts ``connections`` RC connections on port 7471 (TCP port
space), each node with ``count`` receives posted before it accepts; once all
are up it sends ``count`` messages of ``size`` bytes on each, waits for those
sends, then for as many messages back, and disconnects.  The client connects
its nodes (responder resources and initiator depth 1, retry count 5, the
receives posted first), receives ``count`` messages on each, sends as many
back and waits for the server's disconnect.  Printed lines are cmatose's, so
either side interoperates with the real ``ucmatose``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from ibal.al import AccessLayer, Ca, Cq, Pd, Qp, QpCreate
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
    Gid,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    WcType,
    WrType,
)

__all__ = ["CMATOSE_PORT", "CmatoseError", "CmatoseOptions", "CmatoseResult", "run"]

CMATOSE_PORT = 7471


class CmatoseError(ToolError):
    """A ucmatose run that could not complete."""


@dataclass
class CmatoseOptions(ExchangeOptions):
    """``ucmatose [-s server] [-b bind] [-c connections] [-C count] [-S size] [-p port]``."""

    server: str | None = None
    """The server's address: run the client (else the server)."""
    port: int = CMATOSE_PORT
    error: ClassVar[type[ToolError]] = CmatoseError


CmatoseResult = ExchangeResult


class Node:
    """One connection's end: send and receive CQs, an RC QP moved to INIT on ``port_num``
    (``rdma_create_qp`` does), one message buffer; ``count`` receives posted at once (each
    into its own slot, so what came can be read after)."""

    def __init__(self, pd: Pd, port_num: int, count: int, size: int) -> None:
        self.count, self.size = count, size
        depth = max(1, count)
        self.send_cq: Cq = pd.ca.create_cq(depth)
        self.recv_cq: Cq = pd.ca.create_cq(depth)
        self.qp: Qp = pd.create_qp(QpCreate(QpType.RC, self.send_cq, self.recv_cq,
                                            sq_depth=depth, rq_depth=depth))  # fmt: skip
        self.buf = bytearray(size * (count + 1))
        self.mr = pd.reg_mem(self.buf, AccessFlags.LOCAL_WRITE)
        self._src = size * count
        self.qp.modify(QpMod(QpState.INIT, port_num=port_num, pkey_index=0,
                             access=AccessFlags.LOCAL_WRITE))  # fmt: skip
        for i in range(count):
            self.qp.post_recv(RecvWr(i, [self.mr.sge(i * size, size)]))

    def send_all(self, timeout: float) -> None:
        """``count`` SENDs of ``size`` bytes (message ``i`` is bytes ``i``), and their
        completions."""
        for i in range(self.count):
            self.buf[self._src : self._src + self.size] = bytes([i & 0xFF]) * self.size
            self.qp.post_send(SendWr(1000 + i, WrType.SEND, [self.mr.sge(self._src, self.size)]))
            wait_one(self.send_cq, WcType.SEND, timeout, CmatoseError)  # the slot is reused

    def receive_all(self, timeout: float) -> list[bytes]:
        out = []
        for _ in range(self.count):
            wc = wait_one(self.recv_cq, WcType.RECV, timeout, CmatoseError)
            out.append(bytes(self.buf[wc.wr_id * self.size : wc.wr_id * self.size + wc.length]))
        return out

    def close(self) -> None:
        self.qp.destroy()
        self.send_cq.destroy()
        self.recv_cq.destroy()
        self.mr.dereg()


def run(al: AccessLayer, opts: CmatoseOptions, *, out: Callable[[str], None] = print,
        listening: Callable[[], object] = lambda: None) -> CmatoseResult:  # fmt: skip
    """One ucmatose run: the client when ``opts.server`` is set, else the server
    (``listening()`` is called once its listen is in place)."""
    return run_checked(opts, "cmatose", lambda: _client(al, opts, out) if opts.server
                       else _server(al, opts, out, listening))  # fmt: skip


def _client(al: AccessLayer, opts: CmatoseOptions, out: Callable[[str], None]) -> CmatoseResult:
    from ibal.cm import rdma

    assert opts.server is not None
    out("cmatose: starting client")
    route = rdma.resolve_route(al, opts.server, src=opts.bind)
    ca = al.open_ca(route.ca_guid)
    pd = ca.alloc_pd()
    nodes: list[Node] = []
    try:
        out("cmatose: connecting")
        conns = []
        for _ in range(opts.connections):
            node = Node(pd, route.port_num, opts.messages, opts.size)  # receives before the REQ
            nodes.append(node)
            conns.append(rdma.connect(al, route.dst, opts.port, node.qp, route=route,
                                      timeout=opts.timeout, resp_res=1, init_depth=1,
                                      retry_cnt=5))  # fmt: skip
        got: list[list[bytes]] = [[] for _ in nodes]
        if opts.messages:
            out("receiving data transfers")
            got = [node.receive_all(opts.timeout) for node in nodes]
            out("sending replies")
            for node in nodes:
                node.send_all(opts.timeout)
            out("data transfers complete")
        for c in conns:  # the server disconnects; rdma_cm answers its DREQ
            c.connection.wait_closed(opts.timeout)
    finally:
        close_nodes(nodes, pd, ca)
    out("test complete")
    out("return status 0")
    return ExchangeResult(got)


def _server(al: AccessLayer, opts: CmatoseOptions, out: Callable[[str], None],
            listening: Callable[[], object]) -> CmatoseResult:  # fmt: skip
    from ibal.cm import rdma

    out("cmatose: starting server")
    nodes: list[Node] = []
    conns: list[rdma.RdmaConnection] = []
    pds: dict[int, tuple[Ca, Pd]] = {}
    got: list[list[bytes]] = []
    try:
        with rdma.listen(al, opts.port, addr=opts.bind) as listener:
            listening()
            for _ in range(opts.connections):
                inc = listener.get(opts.timeout)
                ours = Gid(bytes(inc.incoming.fields["primary_remote_gid"]))
                guid, port_num = port_with_gid(al, ours, CmatoseError)
                if guid not in pds:
                    ca = al.open_ca(guid)
                    pds[guid] = (ca, ca.alloc_pd())
                node = Node(pds[guid][1], port_num, opts.messages, opts.size)
                nodes.append(node)
                conns.append(inc.accept(node.qp, timeout=opts.timeout))
        if opts.messages:
            out("initiating data transfers")
            out("completing sends")
            for node in nodes:
                node.send_all(opts.timeout)
            out("receiving data transfers")
            got = [node.receive_all(opts.timeout) for node in nodes]
            out("data transfers complete")
        out("cmatose: disconnecting")
        for c in conns:
            c.disconnect(timeout=opts.timeout)
        out("disconnected")
    finally:
        for ca, pd in pds.values():
            close_nodes([n for n in nodes if n.qp.pd is pd], pd, ca)
    out("test complete")
    out("return status 0")
    return ExchangeResult(got)
