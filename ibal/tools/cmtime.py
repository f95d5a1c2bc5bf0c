"""``ibal cmtime``: librdmacm's ``cmtime`` (rdma-core 44) over ``ibal.cm.rdma``.

The client resolves the route, creates an RC QP per connection, connects them
all at once (every REQ out before waiting), then disconnects them all at once,
timing each step as ``cmtime`` does (the whole step, and each connection's own
span for the max/min columns).  The server accepts every request on its port
(RC, TCP port space, no private data) and answers each DREQ; it runs until
stopped.  Either side interoperates with the real ``cmtime``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ibal.al import AccessLayer, Ca, Cq, Pd, Qp, QpCreate
from ibal.cm import rdma
from ibal.status import IbError, NotFound
from ibal.tools.common import ToolError
from ibal.types import Gid, QpType

__all__ = ["CmtimeError", "CmtimeOptions", "CmtimeResult", "CmtimeServer", "run_client"]

DEFAULT_PORT = 7471
STEPS = ("resolve route", "create qp", "connect", "disconnect", "destroy")


class CmtimeError(ToolError):
    """A cmtime run that could not complete."""


@dataclass
class CmtimeOptions:
    """``cmtime [-s server] [-b bind] [-c connections] [-p port] [-t timeout_ms]``."""

    server: str | None = None
    bind: str | None = None
    connections: int = 100
    port: int = DEFAULT_PORT
    timeout_ms: int = 2000


@dataclass
class CmtimeResult:
    """Per step: the whole step's seconds and each connection's own seconds."""

    total: dict[str, float] = field(default_factory=dict)
    each: dict[str, list[float]] = field(default_factory=dict)
    failed: int = 0

    def lines(self, connections: int) -> list[str]:
        """cmtime's table: step, total ms, max ms, min us, us / conn."""
        out = ["step              total ms     max ms     min us  us / conn"]
        for step in STEPS:
            if step not in self.total:
                continue
            each = self.each.get(step) or [0.0]
            t = self.total[step]
            out.append(f"{step:<13s}: {t * 1e3:11.2f}{max(each) * 1e3:11.2f}"
                       f"{min(each) * 1e6:11.2f}{t * 1e6 / connections:11.2f}")  # fmt: skip
        return out


class _Countdown:
    def __init__(self, n: int) -> None:
        self._left = n
        self._cond = threading.Condition()

    def done(self) -> None:
        with self._cond:
            self._left -= 1
            self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._left <= 0, timeout)


def run_client(al: AccessLayer, opts: CmtimeOptions, *,
               out: Callable[[str], None] = print) -> CmtimeResult:  # fmt: skip
    """The client's run against ``opts.server`` (cmtime's ``run_client``)."""
    if not opts.server:
        raise CmtimeError("the client needs a server address (-s)")
    if opts.connections < 1:
        raise CmtimeError(f"invalid connection count {opts.connections}")
    n, res = opts.connections, CmtimeResult()
    wait_s = max(opts.timeout_ms / 1000, 1.0) * 30
    try:
        out("resolving route")
        t0 = time.perf_counter()
        route = rdma.resolve_route(al, opts.server, src=opts.bind, timeout_ms=opts.timeout_ms)
        res.total["resolve route"] = time.perf_counter() - t0
        res.each["resolve route"] = [res.total["resolve route"]]
        ca = al.open_ca(route.ca_guid)
        pd, cq = ca.alloc_pd(), ca.create_cq(max(16, 2 * n))
        out("creating qp")
        qps, made, t0 = [], [], time.perf_counter()
        for _ in range(n):
            s = time.perf_counter()
            qp = pd.create_qp(QpCreate(QpType.RC, cq, cq, sq_depth=1, rq_depth=1))
            rdma.init_qp(qp, route)  # rdma_create_qp's INIT, in cmtime's "create qp" step
            qps.append(qp)
            made.append(time.perf_counter() - s)
        res.total["create qp"] = time.perf_counter() - t0
        res.each["create qp"] = made
        out("connecting")
        started: list[float] = []
        spans: list[float] = []
        lock = threading.Lock()
        up = _Countdown(n)

        def established(i: int, _c: rdma.RdmaConnection) -> None:
            with lock:
                spans.append(time.perf_counter() - started[i])
            up.done()

        conns = []
        t0 = time.perf_counter()
        for i, qp in enumerate(qps):
            started.append(time.perf_counter())
            conns.append(rdma.connect(al, route.dst, opts.port, qp, route=route,
                                      callback=functools.partial(established, i),
                                      retry_cnt=7, rnr_retry_cnt=7))  # fmt: skip
        if not up.wait(wait_s):
            raise CmtimeError(f"{len(spans)} of {n} connections established")
        res.total["connect"] = time.perf_counter() - t0
        res.each["connect"] = spans
        live = [c for c in conns if not _failed(c)]
        res.failed = n - len(live)
        if res.failed:
            out(f"{res.failed} of {n} connections failed: {_why(conns)}")
        out("disconnecting")
        down = _Countdown(len(live))
        spans_d: list[float] = []
        t0 = time.perf_counter()
        for c in live:
            s = time.perf_counter()
            c.connection.on_disconnect = functools.partial(_closed, spans_d, s, down)
            c.disconnect(wait=False)
        if not down.wait(wait_s):
            raise CmtimeError("not every DREQ was answered")
        res.total["disconnect"] = time.perf_counter() - t0
        res.each["disconnect"] = spans_d
        out("destroying qp")
        gone, t0 = [], time.perf_counter()
        for qp in qps:
            s = time.perf_counter()
            qp.destroy()
            gone.append(time.perf_counter() - s)
        res.total["destroy"] = time.perf_counter() - t0
        res.each["destroy"] = gone
        cq.destroy()
        pd.dealloc()
        ca.close()
    except IbError as exc:
        raise CmtimeError(str(exc)) from exc
    for line in res.lines(n):
        out(line)
    return res


def _closed(spans: list[float], start: float, down: _Countdown, _conn: object) -> None:
    spans.append(time.perf_counter() - start)
    down.done()


def _why(conns: list[rdma.RdmaConnection]) -> str:
    """The first failure's reason."""
    for c in conns:
        try:
            c.connection.wait(0)
        except IbError as exc:
            return str(exc)
    return ""


def _failed(c: rdma.RdmaConnection) -> bool:
    """Off the callback threads: whether ``c`` never got established."""
    try:
        c.connection.wait(0)
    except IbError:
        return True
    return False


class CmtimeServer:
    """Accepts every connection request on ``port`` and answers every disconnect.

    ``answered`` counts the accepts whose outcome is known and ``disconnected``
    the connections the peer closed; :meth:`failures` says how many of them
    never got established.  :meth:`close` stops listening and destroys the QPs.
    Requests are answered on the AL's misc queue, as they arrive.
    """

    def __init__(self, al: AccessLayer, port: int = DEFAULT_PORT, *,
                 addr: str | None = None) -> None:  # fmt: skip
        self.al = al
        self.answered = 0
        self.disconnected = 0
        self.refused = 0
        self.connections: list[rdma.RdmaConnection] = []
        self._lock = threading.Condition()
        self._cas: dict[int, tuple[Ca, Pd, Cq]] = {}
        self._qps: list[Qp] = []
        self.listener = rdma.listen(al, port, addr=addr, callback=self._request)

    def _verbs(self, gid: Gid) -> tuple[Pd, Cq]:
        for guid in self.al.get_ca_guids():
            if guid in self._cas:
                ca, pd, cq = self._cas[guid]
            else:
                ca = self.al.open_ca(guid)
                if ca.query().port_of_gid(gid.packed) is None:
                    ca.close()
                    continue
                pd = ca.alloc_pd()
                cq = ca.create_cq(4096)
                self._cas[guid] = (ca, pd, cq)
            if ca.query().port_of_gid(gid.packed) is not None:
                return pd, cq
        raise NotFound(f"no CA has GID {gid}")

    def _request(self, inc: rdma.RdmaIncoming) -> None:
        try:
            pd, cq = self._verbs(Gid(bytes(inc.incoming.fields["primary_remote_gid"])))
            qp = pd.create_qp(QpCreate(QpType.RC, cq, cq, sq_depth=1, rq_depth=1))
            self._qps.append(qp)
            conn = inc.accept(qp, callback=lambda _c: self._count("answered"))
            conn.connection.on_disconnect = lambda _c: self._count("disconnected")
            self.connections.append(conn)
        except IbError:
            self._count("refused")

    def failures(self) -> int:
        """Connections that never got established (call it off the callback threads)."""
        return sum(1 for c in self.connections if _failed(c)) + self.refused

    def _count(self, what: str) -> None:
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)
            self._lock.notify_all()

    def wait(self, predicate: Callable[[CmtimeServer], bool], timeout: float) -> bool:
        """Block until ``predicate(self)`` holds (``False`` after ``timeout`` seconds)."""
        with self._lock:
            return self._lock.wait_for(lambda: predicate(self), timeout)

    def close(self) -> None:
        self.listener.close()
        for qp in self._qps:
            with contextlib.suppress(IbError):
                qp.destroy()
        for ca, pd, cq in self._cas.values():
            cq.destroy()
            pd.dealloc()
            ca.close()

    def __enter__(self) -> CmtimeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
