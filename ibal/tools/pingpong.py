"""``ibal pingpong``: ``ibv_rc_pingpong`` / ``ibv_ud_pingpong`` on any ibal provider.

Speaks the real tools' out-of-band exchange (TCP, default port 18515: the
client sends its 52-byte ``"LID:QPN:PSN:GID"`` string, the server connects its
QP, answers with its own, the client closes with ``"done"``), sets the same QP
attributes and runs the same ping-pong (a send goes out only when the previous
send and the answering receive have both completed; receives are refilled when
at most one is left), so each side interoperates with the unmodified tool.
Only the access layer's public API is used.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import ibal
from ibal import osrandom
from ibal.al import AccessLayer, ConnectOptions, Endpoint, QpCreate, preferred_gid
from ibal.status import IbError
from ibal.tools.common import (
    DEFAULT_PORT,
    MTUS,
    ToolError,
    accept_one,
    check_options,
    dial,
    find_ca,
    listen,
)
from ibal.types import (
    AccessFlags,
    Gid,
    LinkLayer,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    Wc,
    WcStatus,
)

RECV_WRID = 1
SEND_WRID = 2
UD_QKEY = 0x1111_1111
"""The Q_Key ``ibv_ud_pingpong`` gives both ends."""
GRH_BYTES = 40
WIRE_LEN = 52
"""``sizeof "0000:000000:000000:00000000000000000000000000000000"`` (NUL included)."""
DONE = b"done\0"


class PingpongError(ToolError):
    """A failure the real tool reports with a message and exit status 1."""


# ------------------------------------------------------------------ wire format


@dataclass(frozen=True, slots=True)
class WireDest:
    """One end as the exchange carries it (``struct pingpong_dest``)."""

    lid: int
    qpn: int
    psn: int
    gid: bytes = bytes(16)

    def encode(self) -> bytes:
        """``"%04x:%06x:%06x:%s"`` with the GID as 32 hex digits of its raw bytes, NUL-padded."""
        text = f"{self.lid:04x}:{self.qpn:06x}:{self.psn:06x}:{self.gid.hex()}".encode()
        if len(text) >= WIRE_LEN:
            raise PingpongError(f"address {text!r} does not fit the {WIRE_LEN}-byte message")
        return text.ljust(WIRE_LEN, b"\0")

    @classmethod
    def decode(cls, data: bytes) -> WireDest:
        """Parse what the peer sent (``sscanf("%x:%x:%x:%s")``); ``PingpongError`` if malformed."""
        text = data.split(b"\0", 1)[0].decode("ascii", "replace")
        parts = text.split(":")
        try:
            if len(parts) != 4 or len(parts[3]) != 32:
                raise ValueError(text)
            lid, qpn, psn = (int(p, 16) for p in parts[:3])
            gid = bytes.fromhex(parts[3])
        except ValueError:
            raise PingpongError(f"Couldn't parse remote address {text!r}") from None
        if lid > 0xFFFF or qpn > 0xFF_FFFF or psn > 0xFF_FFFF:
            raise PingpongError(f"remote address {text!r} out of range")
        return cls(lid, qpn, psn, gid)

    @property
    def has_gid(self) -> bool:
        """The real tools address by GID only when the interface ID is non-zero."""
        return any(self.gid[8:])

    def describe(self, which: str, *, ud: bool = False) -> str:
        """The tools' ``"  local address:  LID ..."`` line (ud_pingpong's local line has ``:``)."""
        sep = ":" if ud and which == "local" else ","
        gid = socket.inet_ntop(socket.AF_INET6, self.gid)
        return (
            f"  {which} address:{' ' if which == 'local' else ''} LID 0x{self.lid:04x}, "
            f"QPN 0x{self.qpn:06x}, PSN 0x{self.psn:06x}{sep} GID {gid}"
        )

    def endpoint(self) -> Endpoint:
        return Endpoint(
            qpn=self.qpn, psn=self.psn, lid=self.lid, gid=Gid(self.gid) if self.has_gid else None
        )


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock`` (the real tools read once; TCP may split, so loop)."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def client_exchange(sock: socket.socket, local: WireDest, peer: str) -> WireDest:
    """The client's half: send ours, read theirs, say ``done``."""
    sock.sendall(local.encode())
    msg = recv_exact(sock, WIRE_LEN)
    if len(msg) != WIRE_LEN:
        raise PingpongError(f"{len(msg)}/{WIRE_LEN}: Couldn't read remote address from {peer}")
    sock.sendall(DONE)
    return WireDest.decode(msg)


def server_exchange(
    conn: socket.socket, local: WireDest, connect: Callable[[WireDest], None]
) -> WireDest:
    """The server's half: read theirs, ``connect`` the QP to it, send ours, read ``done``."""
    msg = recv_exact(conn, WIRE_LEN)
    if len(msg) != WIRE_LEN:
        raise PingpongError(f"{len(msg)}/{WIRE_LEN}: Couldn't read remote address")
    remote = WireDest.decode(msg)
    connect(remote)
    conn.sendall(local.encode())
    recv_exact(conn, len(DONE))  # the client's "done"; what it says does not matter
    return remote


# --------------------------------------------------------------------- options


@dataclass
class PingpongOptions:
    """The real tools' options, with their defaults (``size`` ``None``: 4096 RC, 2048 UD)."""

    servername: str | None = None
    port: int = DEFAULT_PORT
    device: str | None = None
    ib_port: int = 1
    size: int | None = None
    mtu: int = 1024
    rx_depth: int = 500
    iters: int = 1000
    sl: int = 0
    gid_index: int | None = None
    use_event: bool = False
    ud: bool = False

    @property
    def msg_size(self) -> int:
        if self.size is not None:
            return self.size
        return 2048 if self.ud else 4096

    def check(self) -> None:
        check_options(PingpongError, mtu=self.mtu, port=self.port, size=self.msg_size,
                      iters=self.iters)
        if self.rx_depth < 2:
            raise PingpongError("rx-depth must be at least 2")


@dataclass(frozen=True)
class PingpongResult:
    """What the run measured: the figures the last two lines print."""

    bytes: int
    seconds: float
    iters: int
    sent: int
    received: int
    local: WireDest
    remote: WireDest
    lines: list[str] = field(default_factory=list)

    @property
    def usec_per_iter(self) -> float:
        return self.seconds * 1e6 / self.iters


def result_lines(nbytes: int, usec: float, iters: int) -> list[str]:
    """The tools' two closing lines (``usec`` is the elapsed time in microseconds)."""
    usec = max(usec, 1e-3)
    return [
        f"{nbytes} bytes in {usec / 1e6:.2f} seconds = {nbytes * 8.0 / usec:.2f} Mbit/sec",
        f"{iters} iters in {usec / 1e6:.2f} seconds = {usec / iters:.2f} usec/iter",
    ]


# ------------------------------------------------------------------------- run


class _Session:
    """The resources of one run (``struct pingpong_context``) and its loop."""

    def __init__(self, al: AccessLayer, opts: PingpongOptions) -> None:
        self.opts = opts
        self.size = opts.msg_size
        self.ca = find_ca(al, opts.device, PingpongError)
        try:
            self.port = self.ca.query_port(opts.ib_port)
        except IbError as exc:
            self.ca.close(wait=True)
            raise PingpongError(f"Couldn't get port info for port {opts.ib_port}: {exc}") from exc
        if opts.ud and self.size > self.port.active_mtu.bytes:
            self.ca.close(wait=True)
            raise PingpongError(
                f"Requested size larger than port MTU ({self.port.active_mtu.bytes})"
            )
        extra = GRH_BYTES if opts.ud else 0
        self.buf = bytearray(b"\x7b" * (self.size + extra))
        self.pd = self.ca.alloc_pd()
        self.mr = self.pd.reg_mem(self.buf, AccessFlags.LOCAL_WRITE)
        self.cq = self.ca.create_cq(opts.rx_depth + 1)
        self.qp = self.pd.create_qp(
            QpCreate(
                QpType.UD if opts.ud else QpType.RC,
                send_cq=self.cq,
                recv_cq=self.cq,
                sq_depth=1,
                rq_depth=opts.rx_depth,
            )
        )
        self.recv_wr = RecvWr(RECV_WRID, [self.mr.sge(0, self.size + extra)])
        self.send_wr = SendWr(SEND_WRID, sg_list=[self.mr.sge(extra, self.size)])
        self.send_wr.send_opt = SendOpt.SIGNALED

    def close(self) -> None:
        self.ca.close(wait=True)

    def local_dest(self) -> WireDest:
        opts, port = self.opts, self.port
        roce = port.link_layer is LinkLayer.ETHERNET
        if not roce and port.lid == 0:
            raise PingpongError("Couldn't get local LID")
        gid = bytes(16)
        if opts.gid_index is not None:
            entry = port.gid_entry(opts.gid_index)
            if entry is None:
                raise PingpongError(f"can't read sgid of index {opts.gid_index}")
            gid = entry.gid.packed
        elif roce:  # the real tools would send a zero GID here, which cannot work on RoCE
            gid = preferred_gid(port).gid.packed
        psn = osrandom.randbits(24)  # lrand48() & 0xffffff in the C tools; the OS here
        return WireDest(0 if roce else port.lid, self.qp.num, psn, gid)

    def connect(self, local: WireDest, remote: WireDest) -> None:
        """``pp_connect_ctx``: the real tools' QP attributes (MTU ``-m``, depth 1, 12/14/7/7)."""
        opts = self.opts
        peer = remote.endpoint()
        sgid = opts.gid_index
        if sgid is None and local.has_gid:  # the GID we told the peer is the one we send from
            try:
                sgid = self.ca.find_gid(opts.ib_port, Gid(local.gid))
            except IbError as exc:
                raise PingpongError(f"local GID {Gid(local.gid)} vanished: {exc}") from exc
        copts = ConnectOptions(
            access=AccessFlags(0),
            sl=opts.sl,
            mtu=MTUS[opts.mtu],
            qkey=UD_QKEY,
            local_ack_timeout=14,
            retry_cnt=7,
            rnr_retry_cnt=7,
            rnr_nak_timeout=12,
            resp_res=1,
            init_depth=1,
            grh=peer.gid is not None,
            sgid_index=sgid,
            hop_limit=1,
        )
        me = Endpoint(qpn=local.qpn, psn=local.psn, qkey=UD_QKEY, port_num=opts.ib_port)
        try:
            path = ibal.connect_qp(self.qp, me, peer, options=copts)
            self.post_recv(self.opts.rx_depth)
            if opts.ud:
                av = self.pd.create_av(path)
                self.send_wr.ud = peer.ud_dest(av, UD_QKEY)
        except IbError as exc:
            raise PingpongError(f"Failed to connect QP: {exc}") from exc

    def post_recv(self, n: int) -> int:
        if n > 0:
            self.qp.post_recv([self.recv_wr] * n)
        return n

    def post_send(self) -> None:
        self.qp.post_send(self.send_wr)

    def loop(self) -> tuple[int, int, float]:
        """The ping-pong: returns (sends, receives, elapsed seconds)."""
        opts, iters = self.opts, self.opts.iters
        routs = opts.rx_depth
        pending = RECV_WRID
        cq = self.cq
        start = time.perf_counter()
        if opts.servername:
            self.post_send()
            pending |= SEND_WRID
        rcnt = scnt = 0
        while rcnt < iters or scnt < iters:
            wcs: list[Wc]
            if opts.use_event:
                wcs = cq.wait(max_entries=2)
            else:
                wcs = cq.poll(2)
                while not wcs:
                    wcs = cq.poll(2)
            for wc in wcs:
                if wc.status is not WcStatus.SUCCESS:
                    raise PingpongError(
                        f"Failed status {wc.status.name} ({int(wc.status)}) for wr_id {wc.wr_id}"
                    )
                if wc.wr_id == SEND_WRID:
                    scnt += 1
                elif wc.wr_id == RECV_WRID:
                    routs -= 1
                    if routs <= 1:
                        routs += self.post_recv(opts.rx_depth - routs)
                    rcnt += 1
                else:
                    raise PingpongError(f"Completion for unknown wr_id {wc.wr_id}")
                pending &= ~wc.wr_id
                if scnt < iters and not pending:
                    self.post_send()
                    pending = RECV_WRID | SEND_WRID
        return scnt, rcnt, time.perf_counter() - start


def run(
    al: AccessLayer,
    opts: PingpongOptions,
    *,
    listener: socket.socket | None = None,
    out: Callable[[str], None] = print,
) -> PingpongResult:
    """One run of the tool: the client when ``opts.servername`` is set, else the server.

    ``listener`` is a listening socket to accept on (tests pass one bound to
    port 0); without it the server listens on ``opts.port``.  Lines the tool
    prints go to ``out``; failures raise :class:`PingpongError`.
    """
    opts.check()
    sess = _Session(al, opts)
    try:
        local = sess.local_dest()
        out(local.describe("local", ud=opts.ud))
        if opts.servername:
            with dial(opts.servername, opts.port, PingpongError) as sock:
                remote = client_exchange(sock, local, opts.servername)
            sess.connect(local, remote)
        else:
            with accept_one(listener, opts.port) as conn:
                remote = server_exchange(conn, local, lambda r: sess.connect(local, r))
        out(remote.describe("remote", ud=opts.ud))
        try:
            sent, received, seconds = sess.loop()
        except IbError as exc:
            raise PingpongError(f"Couldn't post or poll: {exc}") from exc
        nbytes = sess.size * opts.iters * 2
        lines = result_lines(nbytes, seconds * 1e6, opts.iters)
        for line in lines:
            out(line)
        return PingpongResult(nbytes, seconds, opts.iters, sent, received, local, remote, lines)
    finally:
        sess.close()


__all__ = [
    "DEFAULT_PORT",
    "PingpongError",
    "PingpongOptions",
    "PingpongResult",
    "WireDest",
    "client_exchange",
    "listen",
    "result_lines",
    "run",
    "server_exchange",
]
