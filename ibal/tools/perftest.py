"""``ibal perftest``: perftest's ``ib_*_bw`` / ``ib_*_lat`` tests on any ibal provider.

Both ends are ibal (the bootstrap is our own: one JSON line each way over TCP
carrying QPN, PSN, LID, GID, MTU, rkey and address); the tests, options and
result tables are perftest's, so figures compare column by column with the
real tools on the same device.  The data path is written for speed: a window
of ``tx_depth`` work requests posted in one call, one completion per
``cq_mod`` of them (the rest unsignaled), completions polled in batches.
"""

from __future__ import annotations

import itertools
import json
import math
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ibal
from ibal.al import AccessLayer, ConnectOptions, Cq, Endpoint, Mr, Qp, QpCreate
from ibal.status import IbError
from ibal.tools.common import (
    DEFAULT_PORT,
    MTUS,
    ToolError,
    accept_one,
    check_options,
    dial,
    find_ca,
)
from ibal.types import (
    AccessFlags,
    LinkLayer,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    Wc,
    WcStatus,
    WrType,
)

RESULT_LINE = "-" * 87
BW_HEADER = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
LAT_HEADER = (
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]"
    "    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
)
MB = 1 << 20
"""perftest's MB/sec is MiB per second."""
_POLL = 16


class PerftestError(ToolError):
    """A failure reported with a message and exit status 1."""


@dataclass(frozen=True)
class TestSpec:
    title: str
    opcode: WrType
    latency: bool


TESTS = {
    "write_bw": TestSpec("RDMA_Write BW Test", WrType.RDMA_WRITE, False),
    "read_bw": TestSpec("RDMA_Read BW Test", WrType.RDMA_READ, False),
    "send_bw": TestSpec("Send BW Test", WrType.SEND, False),
    "write_lat": TestSpec("RDMA_Write Latency Test", WrType.RDMA_WRITE, True),
    "send_lat": TestSpec("Send Latency Test", WrType.SEND, True),
}


@dataclass
class PerftestOptions:
    """perftest's main options with its defaults (``size`` ``None``: 65536 bw, 2 lat)."""

    test: str = "write_bw"
    servername: str | None = None
    port: int = DEFAULT_PORT
    device: str | None = None
    ib_port: int = 1
    size: int | None = None
    iters: int = 1000
    tx_depth: int = 128
    rx_depth: int = 512
    cq_mod: int = 100
    mtu: int | None = None
    gid_index: int | None = None
    post_list: int = 0
    """Work requests per ``post_send`` call (perftest's ``-l``); 0: the whole free
    window in one call, ibal's default."""

    @property
    def spec(self) -> TestSpec:
        return TESTS[self.test]

    @property
    def msg_size(self) -> int:
        if self.size is not None:
            return self.size
        return 2 if self.spec.latency else 65536

    def check(self) -> None:
        if self.test not in TESTS:
            raise PerftestError(f"unknown test {self.test!r} (one of {', '.join(TESTS)})")
        check_options(PerftestError, mtu=self.mtu, port=self.port, size=self.msg_size,
                      iters=self.iters)
        if self.tx_depth < 1 or self.rx_depth < 2 or self.cq_mod < 1:
            raise PerftestError("tx-depth and cq-mod must be positive, rx-depth at least 2")
        if self.post_list < 0 or self.post_list > self.tx_depth:
            raise PerftestError("post-list must be between 0 (the whole window) and tx-depth")


# -------------------------------------------------------------------- results


@dataclass(frozen=True)
class BwResult:
    size: int
    iters: int
    seconds: float
    peak_mb: float

    @property
    def avg_mb(self) -> float:
        return self.size * self.iters / self.seconds / MB

    @property
    def mpps(self) -> float:
        return self.iters / self.seconds / 1e6

    def row(self) -> str:
        return (
            f" {self.size:<7d}    {self.iters:<10d}       {self.peak_mb:<7.2f}"
            f"            {self.avg_mb:<7.2f}\t\t   {self.mpps:<7.6f}"
        )


@dataclass(frozen=True)
class LatResult:
    """Half round trips in microseconds, as perftest reports them."""

    size: int
    iters: int
    samples: list[float] = field(repr=False)

    def _pct(self, p: float) -> float:
        s = sorted(self.samples)
        return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))]

    def row(self) -> str:
        s = self.samples
        stdev = statistics.pstdev(s) if len(s) > 1 else 0.0
        return (
            f" {self.size:<7d} {self.iters}          {min(s):<7.2f}        {max(s):<7.2f}"
            f"      {statistics.median(s):<7.2f}  \t       {statistics.fmean(s):<7.2f}     \t"
            f"{stdev:<7.2f}\t\t{self._pct(0.99):<7.2f} \t\t{self._pct(0.999):<7.2f}"
        )


def bw_peak(marks: list[tuple[int, int]], start: int, size: int, span: int) -> float:
    """The best MB/sec over ``span`` consecutive completion marks ``(time_ns, done)``."""
    best = 0.0
    points = [(start, 0), *marks]
    span = max(1, min(span, len(points) - 1))
    for i in range(span, len(points)):
        (t0, n0), (t1, n1) = points[i - span], points[i]
        if t1 > t0:
            best = max(best, (n1 - n0) * size / ((t1 - t0) / 1e9) / MB)
    return best


# ------------------------------------------------------------------ bootstrap


class _Channel:
    """JSON lines over the bootstrap TCP connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.file = sock.makefile("rwb")

    def send(self, obj: dict[str, Any]) -> None:
        self.file.write(json.dumps(obj).encode() + b"\n")
        self.file.flush()

    def recv(self) -> dict[str, Any]:
        line = self.file.readline()
        if not line:
            raise PerftestError("the peer closed the connection")
        try:
            obj = json.loads(line)
        except ValueError:
            raise PerftestError(f"malformed bootstrap message {line[:80]!r}") from None
        if not isinstance(obj, dict):
            raise PerftestError("malformed bootstrap message")
        return obj

    def close(self) -> None:
        self.file.close()
        self.sock.close()


# ----------------------------------------------------------------- resources


class _Resources:
    """PD, buffer, MR, CQs and the RC QP of one end."""

    def __init__(self, al: AccessLayer, opts: PerftestOptions) -> None:
        self.opts = opts
        self.size = opts.msg_size
        self.ca = find_ca(al, opts.device, PerftestError)
        try:
            self.port = self.ca.query_port(opts.ib_port)
            # [0, size): where the peer's WRITEs and SENDs land; [size, 2 size): what we send
            self.buf = bytearray(2 * self.size)
            self.pd = self.ca.alloc_pd()
            access = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ
            self.mr: Mr = self.pd.reg_mem(self.buf, access)
            self.send_cq: Cq = self.ca.create_cq(opts.tx_depth + 1)
            self.recv_cq: Cq = self.ca.create_cq(opts.rx_depth + 1)
            self.qp: Qp = self.pd.create_qp(
                QpCreate(
                    QpType.RC,
                    send_cq=self.send_cq,
                    recv_cq=self.recv_cq,
                    sq_depth=opts.tx_depth,
                    rq_depth=opts.rx_depth,
                    sq_signaled=False,
                )
            )
            self.local = ibal.endpoint(self.qp, opts.ib_port, gid_index=opts.gid_index)
        except BaseException:
            self.ca.close(wait=True)
            raise

    def close(self) -> None:
        self.ca.close(wait=True)

    def info(self) -> dict[str, Any]:
        return {
            "test": self.opts.test,
            "size": self.size,
            "iters": self.opts.iters,
            "ep": self.local.to_dict(),
            "rkey": self.mr.rkey,
            "vaddr": self.mr.vaddr,
        }

    def connect(self, peer: Endpoint) -> None:
        opts = self.opts
        copts = ConnectOptions(
            mtu=None if opts.mtu is None else MTUS[opts.mtu],
            sgid_index=opts.gid_index,
        )
        ibal.connect_qp(self.qp, self.local, peer, options=copts)

    def describe(self, which: str, ep: Endpoint, rkey: int, vaddr: int, rdma: bool) -> list[str]:
        line = f" {which} address: LID {ep.lid:04x} QPN 0x{ep.qpn:04x} PSN 0x{ep.psn:06x}"
        if rdma:
            line += f" RKey 0x{rkey:06x} VAddr 0x{vaddr:014x}"
        gid = ep.gid.packed if ep.gid is not None else bytes(16)
        return [line, " GID: " + ":".join(f"{b:02d}" for b in gid)]


def header_lines(opts: PerftestOptions, res: _Resources, client: bool) -> list[str]:
    spec = opts.spec
    link = "Ethernet" if res.port.link_layer is LinkLayer.ETHERNET else "IB"
    mtu = MTUS[opts.mtu].bytes if opts.mtu else res.port.active_mtu.bytes
    lines = [
        RESULT_LINE,
        f"                    {spec.title}",
        f" Dual-port       : OFF\t\tDevice         : {res.ca.name}",
        " Number of qps   : 1\t\tTransport type : IB",
        " Connection type : RC\t\tUsing SRQ      : OFF",
    ]
    if client or spec.latency:
        depth = 1 if spec.latency else opts.tx_depth
        name, value = ("TX", depth) if client else ("RX", opts.rx_depth)
        lines.append(f" {name} depth        : {value}")
    if client and not spec.latency:
        lines.append(f" CQ Moderation   : {min(opts.cq_mod, opts.tx_depth)}")
        if opts.post_list:
            lines.append(f" Post List       : {opts.post_list}")
    lines += [
        f" Mtu             : {mtu}[B]",
        f" Link type       : {link}",
    ]
    if opts.gid_index is not None:
        lines.append(f" GID index       : {opts.gid_index}")
    lines += [
        " Max inline data : 0[B]",
        " rdma_cm QPs\t : OFF",
        " Data ex. method : Ethernet",
        RESULT_LINE,
    ]
    return lines


# ------------------------------------------------------------------ data path


def _check(wcs: list[Wc]) -> None:
    for wc in wcs:
        if wc.status is not WcStatus.SUCCESS:
            raise PerftestError(
                f"Completion with error at {'client' if wc.wr_id else 'server'}: "
                f"{wc.status.name} ({int(wc.status)}), wr_id {wc.wr_id}"
            )


def _send_template(res: _Resources, remote: dict[str, Any]) -> SendWr:
    return SendWr(
        wr_id=0,
        opcode=res.opts.spec.opcode,
        sg_list=[res.mr.sge(res.size, res.size)],
        send_opt=SendOpt.NONE,
        remote_addr=int(remote["vaddr"]),
        rkey=int(remote["rkey"]),
    )


def bw_client(res: _Resources, remote: dict[str, Any]) -> BwResult:
    """Windowed posting: up to ``tx_depth`` in flight, one signaled WR per ``cq_mod``."""
    opts, iters = res.opts, res.opts.iters
    window = opts.tx_depth
    cq_mod = min(opts.cq_mod, window)
    pl = opts.post_list
    unsig = _send_template(res, remote)
    qp, cq = res.qp, res.send_cq

    def signaled(covers: int) -> SendWr:
        wr = _send_template(res, remote)
        wr.wr_id, wr.send_opt = covers, SendOpt.SIGNALED
        return wr

    posted = completed = 0
    marks: list[tuple[int, int]] = []
    now = time.perf_counter_ns
    start = now()
    while completed < iters:
        room = min(window - (posted - completed), iters - posted)
        if room > 0:
            batch: list[SendWr] = []
            k = posted
            end = posted + room
            while k < end:
                nxt = min(end, (k // cq_mod + 1) * cq_mod, iters)
                batch.extend([unsig] * (nxt - k - 1))
                if nxt % cq_mod == 0 or nxt == iters:
                    batch.append(signaled(nxt - (nxt - 1) // cq_mod * cq_mod))
                else:
                    batch.append(unsig)
                k = nxt
            if pl:
                for i in range(0, len(batch), pl):
                    qp.post_send(batch[i : i + pl])
            else:
                qp.post_send(batch)
            posted = end
        wcs = cq.poll(_POLL)
        if wcs:
            _check(wcs)
            for wc in wcs:
                completed += wc.wr_id
            marks.append((now(), completed))
    seconds = (now() - start) / 1e9
    span = max(1, window // cq_mod)
    return BwResult(res.size, iters, seconds, bw_peak(marks, start, res.size, span))


def prepost(res: _Resources, n: int) -> int:
    """Post ``n`` receives into the buffer (before telling the peer to start)."""
    if n > 0:
        res.qp.post_recv([RecvWr(1, [res.mr.sge(0, res.size)])] * n)
    return n


def bw_receiver(res: _Resources, outstanding: int) -> int:
    """send_bw's server: keep up to ``rx_depth`` receives posted, count ``iters`` arrivals."""
    opts, iters = res.opts, res.opts.iters
    cq = res.recv_cq
    got = 0
    while got < iters:
        wcs = cq.poll(_POLL)
        if not wcs:
            continue
        _check(wcs)
        got += len(wcs)
        outstanding -= len(wcs)
        want = min(opts.rx_depth, iters - got)
        if want - outstanding >= min(_POLL, want):
            outstanding += prepost(res, want - outstanding)
    return got


def lat_loop(
    res: _Resources, remote: dict[str, Any], client: bool, posted_recv: int
) -> LatResult:
    """Ping-pong: the client starts; each side answers what it received.

    send_lat waits for a receive completion; write_lat spins on the last byte
    of its own buffer, which the peer's RDMA WRITE sets to the iteration's
    sequence number (as perftest's write_lat does).  Sends are signaled every
    ``cq_mod`` so the send queue drains.
    """
    opts, iters, size = res.opts, res.opts.iters, res.size
    qp, scq, rcq = res.qp, res.send_cq, res.recv_cq
    is_send = opts.spec.opcode is WrType.SEND
    cq_mod = max(1, min(opts.cq_mod, opts.tx_depth - 1))
    rwr = RecvWr(1, [res.mr.sge(0, size)])
    swr = _send_template(res, remote)
    sig = _send_template(res, remote)
    sig.send_opt, sig.wr_id = SendOpt.SIGNALED, 1
    buf = res.buf
    last, source_last = size - 1, 2 * size - 1
    stamps: list[int] = []
    now = time.perf_counter_ns
    unsignaled = 0

    def wait_peer(seq: int) -> None:
        nonlocal posted_recv
        if is_send:
            wcs = rcq.poll(1)
            while not wcs:
                wcs = rcq.poll(1)
            _check(wcs)
            posted_recv -= 1
        else:
            while buf[last] != seq:
                pass

    def send(seq: int) -> None:
        nonlocal unsignaled
        if not is_send:
            buf[source_last] = seq  # lands on the byte the peer spins on
        if unsignaled + 1 >= cq_mod:
            qp.post_send(sig)
            unsignaled = 0
            wcs = scq.poll(_POLL)
            while not wcs:
                wcs = scq.poll(_POLL)
            _check(wcs)
        else:
            qp.post_send(swr)
            unsignaled += 1

    for i in range(iters):
        seq = i % 255 + 1
        if client:
            stamps.append(now())
            send(seq)
            wait_peer(seq)
        else:
            wait_peer(seq)
            stamps.append(now())
            send(seq)
        if is_send and posted_recv < 2 and iters - i - 1 > posted_recv:
            more = min(opts.rx_depth - posted_recv, iters - i - 1 - posted_recv)
            qp.post_recv([rwr] * more)
            posted_recv += more
    if client:
        stamps.append(now())
    samples = [(b - a) / 2e3 for a, b in itertools.pairwise(stamps)]
    return LatResult(size, iters, samples)


# ------------------------------------------------------------------------ run


@dataclass(frozen=True)
class PerftestResult:
    test: str
    result: BwResult | LatResult
    lines: list[str]
    received: int = 0
    """send_bw's server: how many messages arrived."""
    buffer: bytes = b""
    """This end's buffer at the end: ``[0, size)`` what the peer wrote or sent here,
    ``[size, 2 size)`` the source (bandwidth tests fill it with 0xC1 on the client,
    0x5E on the server; read_bw reads the server's first half into it)."""


def run(
    al: AccessLayer,
    opts: PerftestOptions,
    *,
    listener: socket.socket | None = None,
    out: Callable[[str], None] = print,
) -> PerftestResult:
    """One end of a test: the client (requester) when ``opts.servername`` is set."""
    opts.check()
    client = opts.servername is not None
    spec = opts.spec
    res = _Resources(al, opts)
    chan: _Channel | None = None
    try:
        if opts.servername is not None:
            sock = dial(opts.servername, opts.port, PerftestError)
        else:
            for line in ("", "*" * 36, "* Waiting for client to connect... *", "*" * 36):
                out(line)
            sock = accept_one(listener, opts.port)
        chan = _Channel(sock)
        chan.send(res.info())
        peer = chan.recv()
        if (peer.get("test"), peer.get("size"), peer.get("iters")) != (
            opts.test, res.size, opts.iters
        ):
            raise PerftestError(
                f"the peer runs {peer.get('test')} -s {peer.get('size')} -n {peer.get('iters')}; "
                f"this end {opts.test} -s {res.size} -n {opts.iters}: they must match"
            )
        remote_ep = Endpoint.from_dict(peer["ep"])
        res.connect(remote_ep)
        lines = header_lines(opts, res, client)
        rdma = spec.opcode is not WrType.SEND
        lines += res.describe("local", res.local, res.mr.rkey, res.mr.vaddr, rdma)
        lines += res.describe("remote", remote_ep, int(peer["rkey"]), int(peer["vaddr"]), rdma)
        lines += [RESULT_LINE, LAT_HEADER if spec.latency else BW_HEADER]
        for line in lines:
            out(line)
        received = posted = 0
        if not spec.latency:
            fill = 0xC1 if client else 0x5E
            res.buf[:] = bytes([0x5E if not client else 0]) * res.size + bytes([fill]) * res.size
        if spec.opcode is WrType.SEND and (spec.latency or not client):
            posted = prepost(res, min(opts.rx_depth, opts.iters))
        chan.send({"ready": True})  # receives are posted, the QP is RTS
        chan.recv()
        result: BwResult | LatResult
        if spec.latency:
            result = lat_loop(res, peer, client, posted)
        elif client:
            result = bw_client(res, peer)
            chan.send({"seconds": result.seconds, "peak": result.peak_mb})
        else:
            if spec.opcode is WrType.SEND:
                received = bw_receiver(res, posted)
            done = chan.recv()
            result = BwResult(res.size, opts.iters, float(done["seconds"]), float(done["peak"]))
        row = result.row()
        out(row)
        out(RESULT_LINE)
        chan.send({"done": True})
        chan.recv()
        lines += [row, RESULT_LINE]
        return PerftestResult(opts.test, result, lines, received, bytes(res.buf))
    except IbError as exc:
        raise PerftestError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        if chan is not None:
            chan.close()
        res.close()


__all__ = [
    "TESTS",
    "BwResult",
    "LatResult",
    "PerftestError",
    "PerftestOptions",
    "PerftestResult",
    "bw_peak",
    "run",
]
