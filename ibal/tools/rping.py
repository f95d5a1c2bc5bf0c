"""``ibal rping``: librdmacm's ``rping`` over ibal (the connection through ``ibal.cm.rdma``).

:class:`RpingEndpoint` owns what one rping end has (``rping_setup_qp`` /
``rping_setup_buffers``): a CQ, an RC QP (16 sends, 2 receives, one SGE), one
registered buffer holding the 16-byte receive and send areas, the RDMA buffer
(the client's sink, the server's landing place) and, on the client, the
source.  :meth:`RpingEndpoint.run` drives a machine of
:mod:`ibal.tools.rping_proto`: it carries out the actions with verbs and turns
completions into events, on the calling thread, polling the CQ against a
deadline.  The QP is connected by whoever owns the connection (the CM, or a
test's manual connect); ``disconnect`` is called when the client is done and
``closed`` says when the peer has gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ibal.al import AccessLayer, Cq, Pd, Qp, QpCreate
from ibal.cm.rdma import port_with_gid
from ibal.status import IbError, Timeout
from ibal.tools.common import ToolError
from ibal.tools.rping_proto import (
    DEFAULT_PORT,
    DEFAULT_SIZE,
    INFO_SIZE,
    MAX_SIZE,
    MIN_SIZE,
    Action,
    Check,
    Disconnect,
    Disconnected,
    Event,
    Fill,
    Finish,
    GoAhead,
    PostRead,
    PostRecv,
    PostWrite,
    Print,
    ReadDone,
    Recv,
    Region,
    RpingClient,
    RpingServer,
    SendInfo,
    WriteDone,
    ping_text,
)
from ibal.types import (
    AccessFlags,
    Gid,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    Sge,
    Wc,
    WcStatus,
    WcType,
    WrType,
)

if TYPE_CHECKING:
    from ibal.cm.rdma import RdmaIncoming

__all__ = ["RpingEndpoint", "RpingError", "RpingOptions", "RpingResult", "run"]

SQ_DEPTH = 16  # RPING_SQ_DEPTH
PERSISTENT_POLL_S = 0.2  # how soon a persistent server sees its stop
#: What the peer may do to an rping end's buffers and QP.
ACCESS = AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE
_RECV, _SEND, _RDMA = 1, 2, 3


class RpingError(ToolError):
    """An rping run ended in failure; the message is what rping would print."""


@dataclass
class RpingResult:
    """What a run did: pings completed, lines printed (``-v``)."""

    pings: int
    lines: list[str]


class RpingEndpoint:
    """One rping end on ``pd``'s CA: CQ, RC QP in RESET, and the registered buffers."""

    def __init__(self, pd: Pd, size: int, *, client: bool) -> None:
        self.size = size
        self.client = client
        self.cq: Cq = pd.ca.create_cq(SQ_DEPTH * 2)
        self.qp: Qp = pd.create_qp(QpCreate(QpType.RC, send_cq=self.cq, recv_cq=self.cq,
                                            sq_depth=SQ_DEPTH, rq_depth=2))  # fmt: skip
        # [recv 16][send 16][rdma size][source size (client)]
        self._rdma_off = 2 * INFO_SIZE
        self._src_off = self._rdma_off + size
        self.buf = bytearray(self._src_off + (size if client else 0))
        self.mr = pd.reg_mem(self.buf, ACCESS | AccessFlags.LOCAL_WRITE)

    def region(self, off: int, size: int) -> Region:
        return Region(self.mr.vaddr + off, self.mr.rkey, size)

    @property
    def sink(self) -> Region:
        return self.region(self._rdma_off, self.size)

    @property
    def source(self) -> Region:
        return self.region(self._src_off, self.size)

    @property
    def rdma_buf(self) -> bytes:
        return bytes(self.buf[self._rdma_off : self._rdma_off + self.size])

    def _sge(self, off: int, n: int) -> Sge:
        return Sge(addr=self.mr.vaddr + off, length=n, lkey=self.mr.lkey)

    def init(self, port_num: int) -> None:
        """RESET -> INIT with the rights the peer's READ and WRITE need (``rdma_create_qp``)."""
        self.qp.modify(QpMod(QpState.INIT, port_num=port_num, pkey_index=0, access=ACCESS))

    def post_recv(self) -> None:
        """The one receive (post it before connecting: the peer may SEND at once)."""
        self.qp.post_recv(RecvWr(wr_id=_RECV, sg_list=[self._sge(0, INFO_SIZE)]))

    def close(self) -> None:
        self.qp.destroy()
        self.mr.dereg()
        self.cq.destroy()

    # ------------------------------------------------------------- the run

    def client_machine(self, count: int, *, verbose: bool, validate: bool) -> RpingClient:
        return RpingClient(self.source, self.sink, count=count, verbose=verbose,
                           validate=validate)  # fmt: skip

    def server_machine(self, *, verbose: bool) -> RpingServer:
        return RpingServer(self.size, verbose=verbose)

    def run(
        self,
        machine: RpingClient | RpingServer,
        *,
        disconnect: Callable[[], None] = lambda: None,
        closed: Callable[[], bool] = lambda: False,
        out: Callable[[str], None] = print,
        timeout: float = 60.0,
    ) -> RpingResult:
        """Run ``machine`` to its end; raises :class:`RpingError` with rping's message.

        ``timeout``: seconds without any completion before giving up.
        """
        lines: list[str] = []

        def say(line: str) -> None:
            lines.append(line)
            out(line)

        todo: list[Action] = machine.start() if isinstance(machine, RpingClient) else []
        deadline = time.monotonic() + timeout
        while True:
            for action in todo:
                error = self._do(action, say, disconnect)
                if error is not None:
                    pings = machine.ping if isinstance(machine, RpingClient) else machine.pings
                    if error:
                        raise RpingError(error)
                    return RpingResult(pings, lines)
            todo = []
            wcs = self.cq.poll(8)
            if not wcs:
                if closed():
                    todo = machine.handle(Disconnected())
                    continue
                if time.monotonic() > deadline:
                    raise RpingError(f"no completion for {timeout} s")
                time.sleep(0.0002)  # poll interval: yields the GIL to the provider
                continue
            deadline = time.monotonic() + timeout
            for wc in wcs:
                event = self._event(wc)
                if event is not None:
                    todo += machine.handle(event)

    def _event(self, wc: Wc) -> Event | None:
        if wc.status is WcStatus.WR_FLUSHED_ERR:
            return Disconnected()
        if wc.status is not WcStatus.SUCCESS:
            raise RpingError(f"cq completion failed status {wc.status.name} ({wc.wc_type.name})")
        if wc.wc_type is WcType.RECV:
            return Recv(bytes(self.buf[: wc.length]))
        if wc.wc_type is WcType.RDMA_READ:
            data = self.rdma_buf
            nul = data.find(0)
            return ReadDone(len(data) if nul < 0 else nul)
        if wc.wc_type is WcType.RDMA_WRITE:
            return WriteDone()
        return None  # send completions: nothing to do

    def _do(self, a: Action, say: Callable[[str], None],
            disconnect: Callable[[], None]) -> str | None:  # fmt: skip
        """Carry out one action; a string (empty: success) when the run is over."""
        if isinstance(a, PostRecv):
            self.post_recv()
        elif isinstance(a, Fill):
            self.buf[self._src_off : self._src_off + self.size] = ping_text(a.ping, self.size)
        elif isinstance(a, SendInfo):
            self.buf[INFO_SIZE : 2 * INFO_SIZE] = a.data
            self._send()
        elif isinstance(a, GoAhead):
            self.buf[INFO_SIZE : 2 * INFO_SIZE] = bytes(INFO_SIZE)
            self._send()
        elif isinstance(a, PostRead | PostWrite):
            op = WrType.RDMA_READ if isinstance(a, PostRead) else WrType.RDMA_WRITE
            self.qp.post_send(SendWr(wr_id=_RDMA, opcode=op,
                                     sg_list=[self._sge(self._rdma_off, a.length)],
                                     remote_addr=a.region.addr, rkey=a.region.rkey))  # fmt: skip
        elif isinstance(a, Print):
            text = self.rdma_buf.split(b"\0", 1)[0].decode("latin-1")
            say(a.prefix + text)
        elif isinstance(a, Check):
            src = self.buf[self._src_off : self._src_off + self.size]
            if self.rdma_buf != src:
                return "data mismatch!"
        elif isinstance(a, Disconnect):
            disconnect()
        elif isinstance(a, Finish):
            return a.error
        return None

    def _send(self) -> None:
        self.qp.post_send(SendWr(wr_id=_SEND, opcode=WrType.SEND, send_opt=SendOpt.SIGNALED,
                                 sg_list=[self._sge(INFO_SIZE, INFO_SIZE)]))  # fmt: skip


# ---------------------------------------------------------------- the tool


@dataclass
class RpingOptions:
    """rping's options: ``-s``/``-c``, ``-a``, ``-I``, ``-p``, ``-C``, ``-S``, ``-v``, ``-V``,
    ``-P``."""

    server: bool
    addr: str | None = None
    source: str | None = None
    port: int = DEFAULT_PORT
    count: int = 0
    size: int = DEFAULT_SIZE
    verbose: bool = False
    validate: bool = False
    timeout: float = 60.0
    """Seconds to wait for the connection (server: for a client) and between completions."""
    persistent: bool = False
    """Server: serve every client that comes, each on a thread of its own, until stopped
    (``rping -P``); one client's failure ends only its own thread."""

    def check(self) -> None:
        if not MIN_SIZE <= self.size <= MAX_SIZE:
            raise RpingError(f"Invalid size {self.size} (valid range is {MIN_SIZE} to "
                             f"{MAX_SIZE + 1})")  # fmt: skip
        if self.count < 0:
            raise RpingError(f"Invalid count {self.count}")
        if not self.server and not self.addr:
            raise RpingError("a client needs the server's address (-a)")
        if not 0 <= self.port <= 0xFFFF:
            raise RpingError(f"Invalid port {self.port}")
        if self.persistent and not self.server:
            raise RpingError("persistent mode (-P) is for the server (-s)")


def run(al: AccessLayer, opts: RpingOptions, *, out: Callable[[str], None] = print,
        err: Callable[[str], None] = lambda _: None,
        listening: Callable[[], object] = lambda: None,
        stop: threading.Event | None = None) -> RpingResult:  # fmt: skip
    """One rping run over ``al`` (server: one connection, or with ``opts.persistent`` every
    client until ``stop`` is set: the pings of all of them; ``listening()`` is called once
    the listen is in place).  ``out``/``err`` may be called from several threads."""
    opts.check()
    try:
        if opts.persistent:
            return _persistent(al, opts, out, err, listening, stop or threading.Event())
        if opts.server:
            return _server(al, opts, out, err, listening)
        return _client(al, opts, out, err)
    except (IbError, ValueError) as exc:
        raise RpingError(str(exc)) from exc


def _client(al: AccessLayer, opts: RpingOptions, out: Callable[[str], None],
            err: Callable[[str], None]) -> RpingResult:  # fmt: skip
    from ibal.cm import rdma

    assert opts.addr is not None
    route = rdma.resolve_route(al, opts.addr, src=opts.source)
    ca = al.open_ca(route.ca_guid)
    end = RpingEndpoint(ca.alloc_pd(), opts.size, client=True)
    try:
        end.init(route.port_num)
        end.post_recv()
        conn = rdma.connect(al, route.dst, opts.port, end.qp, route=route, timeout=opts.timeout,
                            resp_res=1, init_depth=1, retry_cnt=7, rnr_retry_cnt=7)  # fmt: skip
        machine = end.client_machine(opts.count, verbose=opts.verbose, validate=opts.validate)
        try:
            return end.run(machine, disconnect=lambda: conn.disconnect(timeout=opts.timeout),
                           closed=lambda: conn.connection.closed.done, out=out,
                           timeout=opts.timeout)  # fmt: skip
        finally:
            if conn.connection.closed.done:
                err("client DISCONNECT EVENT...")
    finally:
        end.close()
        ca.close()


def _server(al: AccessLayer, opts: RpingOptions, out: Callable[[str], None],
            err: Callable[[str], None],
            listening: Callable[[], object]) -> RpingResult:  # fmt: skip
    from ibal.cm import rdma

    with rdma.listen(al, opts.port, addr=opts.addr) as listener:
        listening()
        inc = listener.get(opts.timeout)
    return _serve(al, opts, inc, out, err)


def _persistent(al: AccessLayer, opts: RpingOptions, out: Callable[[str], None],
                err: Callable[[str], None], listening: Callable[[], object],
                stop: threading.Event) -> RpingResult:  # fmt: skip
    """rping's persistent server: a thread per client, the listen kept until ``stop``."""
    from ibal.cm import rdma

    total = RpingResult(0, [])
    lock = threading.Lock()
    workers: list[threading.Thread] = []

    def serve(inc: RdmaIncoming) -> None:
        try:
            r = _serve(al, opts, inc, out, err)
        except (IbError, ValueError, RpingError) as exc:
            err(f"persistent server: a client failed: {exc}")
            return
        with lock:
            total.pings += r.pings
            total.lines += r.lines

    with rdma.listen(al, opts.port, addr=opts.addr) as listener:
        listening()
        while not stop.is_set():
            try:
                inc = listener.get(PERSISTENT_POLL_S)  # bounded, to see ``stop``
            except Timeout:
                continue
            t = threading.Thread(target=serve, args=(inc,), name="rping-P", daemon=True)
            t.start()
            workers.append(t)
            workers = [w for w in workers if w.is_alive()]
    for t in workers:
        t.join(opts.timeout)
    return total


def _serve(al: AccessLayer, opts: RpingOptions, inc: RdmaIncoming,
           out: Callable[[str], None], err: Callable[[str], None]) -> RpingResult:  # fmt: skip
    """The server's side of one client's pings, from its connection request on."""
    ours = Gid(bytes(inc.incoming.fields["primary_remote_gid"]))
    ca_guid, port_num = port_with_gid(al, ours, RpingError)
    ca = al.open_ca(ca_guid)
    end = RpingEndpoint(ca.alloc_pd(), opts.size, client=False)
    try:
        end.init(port_num)
        end.post_recv()
        conn = inc.accept(end.qp, timeout=opts.timeout, init_depth=1)
        try:
            return end.run(end.server_machine(verbose=opts.verbose),
                           closed=lambda: conn.connection.closed.done, out=out,
                           timeout=opts.timeout)  # fmt: skip
        finally:
            # A flushed receive can end the run before the peer's DREQ reaches its upcall
            # (the CM moves the QP on the thread that received the DREQ): disconnect
            # then waits for that upcall instead of sending a DREQ of ours.
            if not conn.connection.closed.done:
                conn.disconnect(timeout=opts.timeout)
            if conn.connection.peer_disconnected:
                err("server DISCONNECT EVENT...")
    finally:
        end.close()
        ca.close()
