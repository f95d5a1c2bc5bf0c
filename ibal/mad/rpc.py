"""A MAD client for diagnostics tools (libibmad's RPC layer, in ibal terms).

:class:`MadClient` sends SMPs (LID routed or directed route), PerfMgt and SA
requests and matches their responses by TID, with its own response time-out
and retries, in two forms: blocking (:meth:`MadClient.call` and the
``smp_get``/``perf_get``/``sa_get`` helpers) and many in flight
(:meth:`MadClient.post` + :meth:`MadClient.poll`, or :meth:`MadClient.call_many`
with a window of outstanding requests).

Targets are :class:`PortId`\\ s, addressed like libibmad's ``ib_portid_t``: a
LID, a directed-route path (``"0,1,3"``: the out port of each hop after the
local port 0) or a port GUID resolved through the SA (:meth:`MadClient.resolve`).

The client talks to one port through a :class:`MadPort`: :class:`AlMadPort`
drives the AL's transport-level MAD agents (an alias QP per QP0/QP1, one
agent per class), so the CA's provider picks the transport.  The time-out is
the client's own: under umad2sim (ibsim) nothing times an unanswered request
out, so each retry is a fresh TID and a late answer to an earlier try is
dropped.  ``poll``/``call`` run on the caller's thread; the port's callbacks
only queue what arrives.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from ibal.mad import header
from ibal.mad.consts import DR_DIRECTION, MadStatus, Method, MgmtClass, SaAttr
from ibal.status import IbError

__all__ = [
    "VIAS",
    "AlMadPort",
    "MadClient",
    "MadError",
    "MadPort",
    "PortId",
    "Reply",
    "Request",
    "ServiceMadPort",
    "parse_dr_path",
    "parse_portid",
    "pick_port",
    "smp_request",
]

DEFAULT_TIMEOUT_MS = 500
DEFAULT_RETRIES = 2
_TID_LOW = 0xFFFFFFFF
_SMP_CLASSES = frozenset((MgmtClass.SUBN_LID, MgmtClass.SUBN_DR))  # on QP0


class MadError(RuntimeError):
    """A query failed: no answer after the retries, or an error status in the answer."""


@dataclass(frozen=True, slots=True)
class PortId:
    """A destination like libibmad's ``ib_portid_t``: a LID, or a directed-route path.

    ``dr_path`` lists the out ports of the hops (``()`` is the local port);
    ``dr_slid``/``dr_dlid`` are the DR SMP's LID-routed ends (0xFFFF: none).
    """

    lid: int = 0
    dr_path: tuple[int, ...] | None = None
    dr_slid: int = 0xFFFF
    dr_dlid: int = 0xFFFF

    def __post_init__(self) -> None:
        if self.dr_path is None and not 0 < self.lid < 0xFFFF:
            raise ValueError(f"LID {self.lid} is not a unicast LID")
        if self.dr_path is not None:
            if len(self.dr_path) > 63:
                raise ValueError("a directed route has at most 63 hops")
            if any(not 1 <= p <= 254 for p in self.dr_path):
                raise ValueError(f"directed route {self.dr_path}: ports are 1..254")

    @property
    def directed(self) -> bool:
        return self.dr_path is not None

    def __str__(self) -> str:
        """How infiniband-diags names it (``Lid 2``, ``DR path slid 65535; dlid 65535; 0,1``)."""
        from ibal.mad.dump import portid_str

        if self.dr_path is None:
            return portid_str(self.lid)
        return portid_str(0, self.dr_path, self.dr_slid, self.dr_dlid)


def parse_dr_path(text: str) -> tuple[int, ...]:
    """``"0,1,3"`` -> ``(1, 3)``: the first entry is the local port (must be 0)."""
    try:
        hops = [int(x, 0) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise ValueError(f"{text!r} is not a directed route like 0,1,3") from None
    if not hops or hops[0] != 0:
        raise ValueError(f"directed route {text!r} must start at port 0")
    return tuple(hops[1:])


def parse_portid(text: str, *, directed: bool = False) -> PortId:
    """A target as the tools take it: a LID (decimal or 0x..), or with ``directed`` a DR path."""
    if directed:
        return PortId(dr_path=parse_dr_path(text))
    try:
        lid = int(text, 0)
    except ValueError:
        raise ValueError(f"{text!r} is not a LID") from None
    return PortId(lid)


@dataclass(slots=True)
class Request:
    """One query: class, method, attribute and modifier, data, and where it goes."""

    mgmt_class: int
    method: int
    attr_id: int
    to: PortId
    attr_mod: int = 0
    data: bytes = b""
    comp_mask: int = 0  # SA only
    context: Any = None


@dataclass(slots=True)
class Reply:
    """How a :class:`Request` ended: the response MAD, or ``None`` after the retries."""

    request: Request
    mad: bytes | None
    tries: int

    @property
    def status(self) -> int:
        """The MAD status (the DR D bit masked); ``-1`` when nothing came."""
        if self.mad is None:
            return -1
        st = int.from_bytes(self.mad[4:6], "big")
        return st & ~DR_DIRECTION if self.mad[1] == MgmtClass.SUBN_DR else st

    @property
    def ok(self) -> bool:
        return self.status == 0

    @property
    def data(self) -> memoryview:
        """The attribute data (a view of the response); ``MadError`` if it failed."""
        if self.mad is None or self.status != 0:
            raise MadError(self.error())
        return header.payload(self.mad)

    def error(self) -> str:
        r = self.request
        what = f"attr 0x{r.attr_id:04x} mod {r.attr_mod} class 0x{r.mgmt_class:02x} to {r.to}"
        if self.mad is None:
            return f"no response to {what} after {self.tries} tries"
        try:
            name = MadStatus(self.status).name
        except ValueError:
            name = "?"
        return f"{what}: status 0x{self.status:04x} ({name})"


class MadPort(Protocol):
    """What :class:`MadClient` needs from a port: send a MAD, and queue what arrives.

    ``start(on_mad)``: from then on, every response MAD reaching the port's
    agents is passed to ``on_mad`` (from any thread; it only queues).
    """

    lid: int
    sm_lid: int

    def start(self, on_mad: Callable[[bytes], None]) -> None: ...

    def send(self, mad: bytes, to: PortId, qp: int, timeout_ms: int) -> None: ...

    def abandon(self, tid: int) -> None:
        """The client gave up the request with TID low half ``tid`` (it may still complete)."""

    def close(self) -> None: ...


@dataclass(slots=True)
class _Out:
    request: Request
    deadline: float
    tries: int
    tid: int = 0


class MadClient:
    """Queries over one port; see the module docstring.

    ``timeout_ms`` is per try, ``retries`` the tries after the first.
    Methods are for one thread (the caller's).
    """

    def __init__(
        self,
        port: MadPort,
        *,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retries: int = DEFAULT_RETRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if timeout_ms <= 0 or retries < 0:
            raise ValueError("timeout_ms must be positive and retries not negative")
        self.port = port
        self.timeout_ms = timeout_ms
        self.retries = retries
        self._clock = clock
        self._rx: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._out: dict[int, _Out] = {}  # TID low 32 bits -> request in flight
        self._order: deque[tuple[float, int]] = deque()  # (deadline, tid) in send order
        self._tids = itertools.count(int.from_bytes(os.urandom(2), "big") << 8 | 1)
        self._done: list[Reply] = []
        self.stats = {"sent": 0, "retried": 0, "timed_out": 0, "stale": 0}
        # drive(): answers are handled on the thread that delivers them, under the lock
        self._lock = threading.RLock()
        self._pump: Callable[[list[Reply]], None] | None = None
        self._pumping = False
        port.start(self._deliver)
        start_batches = getattr(port, "start_batches", None)
        if start_batches is not None:
            start_batches(self._deliver_many)

    def _deliver(self, mad: bytes) -> None:
        """The port's callback (any thread): queue ``mad``, or during :meth:`drive` handle it."""
        if self._pump is None:
            self._rx.put(mad)
        else:
            self._deliver_many((mad,))

    def _deliver_many(self, mads: Sequence[bytes]) -> None:
        """MADs the port delivers together (any thread): one pass of the pump for them all."""
        if self._pump is None:
            for mad in mads:
                self._rx.put(mad)
            return
        with self._lock:
            pump = self._pump
            if self._pumping or pump is None:  # delivered from inside a send, or the run ended
                for mad in mads:
                    self._rx.put(mad)
                return
            self._pumping = True
            try:
                replies: list[Reply] = []
                for mad in mads:
                    self._take(mad, replies)
                pump(replies)
            finally:
                self._pumping = False

    def drive(
        self,
        first: Iterable[Request],
        on_reply: Callable[[Reply], Iterable[Request]],
        *,
        window: int = 32,
        tick: Callable[[], None] | None = None,
        tick_every: float = 0.1,
    ) -> None:
        """Run requests to the end, each reply handled on the thread that delivers it.

        Posts ``first`` (at most ``window`` in flight); each :class:`Reply` goes to
        ``on_reply``, which returns the requests that follow from it, until none is
        left.  ``on_reply`` runs where the answer arrives (the provider's receive
        thread for an :class:`AlMadPort`'s inline agents: no thread hand-off per
        answer; the caller's thread for time-outs), one call at a time under the
        client's lock, so it must not block.  The caller's thread waits, expires
        requests and calls ``tick`` (under the lock) about every ``tick_every`` s.
        An exception of ``on_reply`` or a send ends the run and is raised here.
        """
        if window < 1:
            raise ValueError("window must be at least 1")
        backlog: deque[Request] = deque(first)
        finished = threading.Event()
        errors: list[BaseException] = []

        def pump(replies: list[Reply]) -> None:  # under the lock
            try:
                while True:
                    for rep in replies:
                        backlog.extend(on_reply(rep))
                    room = min(window - len(self._out), len(backlog))
                    if room > 0:  # the window's free places in one batch
                        self.post_many([backlog.popleft() for _ in range(room)])
                    replies = []
                    self._drain(replies)  # answered from inside a send (a synchronous port)
                    if not replies:
                        break
                if not backlog and not self._out:
                    finished.set()
            except BaseException as exc:
                errors.append(exc)
                finished.set()

        with self._lock:
            if self._out or self._pump is not None:
                raise RuntimeError("drive() needs a client with nothing in flight")
            self._pump = pump
            self._pumping = True
            try:
                pump([])
            finally:
                self._pumping = False
        try:
            while not finished.is_set():
                with self._lock:
                    now = self._clock()
                    wait = self._order[0][0] - now if self._order else self.timeout_ms / 1000
                if finished.wait(max(min(wait, tick_every), 0.001)):
                    break
                with self._lock:
                    self._pumping = True
                    try:
                        replies: list[Reply] = []
                        self._drain(replies)
                        self._expire(replies)
                        pump(replies)
                    finally:
                        self._pumping = False
                    if tick is not None:
                        tick()
        finally:
            with self._lock:
                self._pump = None
        if errors:
            raise errors[0]

    # ------------------------------------------------------------ many in flight
    @property
    def outstanding(self) -> int:
        """Requests posted and not yet returned by :meth:`poll`."""
        return len(self._out)

    def post(self, req: Request) -> None:
        """Send ``req`` (does not wait); its :class:`Reply` comes from :meth:`poll`."""
        self._send(_Out(req, 0.0, 0))

    def post_many(self, reqs: Sequence[Request]) -> None:
        """:meth:`post` each; one call into the port for them all where it takes a batch
        (:meth:`AlMadPort.send_many`: one provider call, one foreign call, for a window)."""
        send_many = getattr(self.port, "send_many", None)
        if send_many is None or len(reqs) < 2:
            for r in reqs:
                self.post(r)
            return
        deadline = self._clock() + self.timeout_ms / 1000
        outs = [_Out(r, deadline, 0) for r in reqs]
        items = [self._prepare(out) for out in outs]
        n = 0
        try:
            while n < len(items):
                n += send_many(items[n:] if n else items)
        finally:
            for out, item in zip(outs[:n], items, strict=False):
                self._sent(out, item[4])

    def _prepare(self, out: _Out) -> tuple[bytes, PortId, int, int, int]:
        """The MAD of ``out``'s next try under a fresh TID: (mad, to, qp, timeout_ms, tid).
        ``out.deadline`` must be set."""
        tid = next(self._tids) & _TID_LOW or next(self._tids) & _TID_LOW
        r = out.request
        qp = 0 if r.mgmt_class in _SMP_CLASSES else 1
        return _build(r, tid), r.to, qp, self.timeout_ms, tid

    def _sent(self, out: _Out, tid: int) -> None:
        out.tid = tid
        out.tries += 1
        self._out[tid] = out
        self._order.append((out.deadline, tid))
        self.stats["sent"] += 1

    def _send(self, out: _Out) -> None:
        out.deadline = self._clock() + self.timeout_ms / 1000
        mad, to, qp, timeout_ms, tid = self._prepare(out)
        self.port.send(mad, to, qp, timeout_ms)
        self._sent(out, tid)

    def poll(self, timeout: float | None = None) -> list[Reply]:
        """Replies that ended since the last call; waits up to ``timeout`` s for the first."""
        done, self._done = self._done, []
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            self._drain(done)
            self._expire(done)
            if done or not self._out:
                return done
            now = self._clock()
            wait = self._order[0][0] - now if self._order else self.timeout_ms / 1000
            if deadline is not None:
                wait = min(wait, deadline - now)
                if wait <= 0:
                    return done
            with contextlib.suppress(queue.Empty):
                self._take(self._rx.get(timeout=max(wait, 0.0)), done)

    def _drain(self, done: list[Reply]) -> None:
        get = self._rx.get_nowait
        while True:
            try:
                mad = get()
            except queue.Empty:
                return
            self._take(mad, done)

    def _take(self, mad: bytes, done: list[Reply]) -> None:
        out = self._out.pop(int.from_bytes(mad[12:16], "big"), None)
        if out is None or not mad[3] & 0x80 or mad[1] != out.request.mgmt_class:
            if out is not None:  # not ours after all: keep waiting
                self._out[out.tid] = out
            self.stats["stale"] += 1
            return
        done.append(Reply(out.request, mad, out.tries))

    def _expire(self, done: list[Reply]) -> None:
        now = self._clock()
        order = self._order
        while order and order[0][0] <= now:
            _, tid = order.popleft()
            out = self._out.get(tid)
            if out is None or out.tid != tid:
                continue  # answered, or re-sent under a new TID
            del self._out[tid]
            self.port.abandon(tid)
            if out.tries <= self.retries:
                self.stats["retried"] += 1
                try:
                    self._send(out)
                    continue
                except IbError:
                    pass
            self.stats["timed_out"] += 1
            done.append(Reply(out.request, None, out.tries))

    def call_many(self, reqs: Iterable[Request], window: int = 32) -> list[Reply]:
        """Every request's reply, in request order, at most ``window`` in flight."""
        if window < 1:
            raise ValueError("window must be at least 1")
        pending = list(reqs)
        for n, r in enumerate(pending):
            r.context = (n, r.context)
        replies: list[Reply | None] = [None] * len(pending)
        it = iter(pending)
        left = len(pending)
        for r in itertools.islice(it, window):
            self.post(r)
        while left:
            for rep in self.poll():
                n, rep.request.context = rep.request.context
                replies[n] = rep
                left -= 1
                nxt = next(it, None)
                if nxt is not None:
                    self.post(nxt)
        return [r for r in replies if r is not None]

    # ------------------------------------------------------------ blocking
    def call(self, req: Request) -> Reply:
        """Send ``req`` and wait for its reply (other replies are kept for :meth:`poll`)."""
        self.post(req)
        while True:
            for rep in self.poll():
                if rep.request is req:
                    return rep
                self._done.append(rep)

    def _data(self, req: Request) -> bytes:
        rep = self.call(req)
        if rep.mad is None or rep.status:
            raise MadError(rep.error())
        return bytes(rep.data)

    def smp_get(self, attr: int, to: PortId, mod: int = 0) -> bytes:
        """SubnGet(attr) of ``to`` (LID routed or directed route): the 64-byte data."""
        return self._data(_smp(Method.GET, attr, to, mod, b""))

    def smp_set(self, attr: int, to: PortId, data: bytes, mod: int = 0) -> bytes:
        """SubnSet(attr): the data the SMA answered with."""
        return self._data(_smp(Method.SET, attr, to, mod, data))

    def perf_get(self, attr: int, lid: int, data: bytes = b"", mod: int = 0) -> bytes:
        """PerfMgt Get(attr) of the PMA at ``lid`` (``data``: e.g. the PortSelect)."""
        return self._data(Request(MgmtClass.PERF, Method.GET, attr, PortId(lid), mod, data))

    def perf_set(self, attr: int, lid: int, data: bytes, mod: int = 0) -> bytes:
        """PerfMgt Set(attr) (resets counters with PortCounters' CounterSelect)."""
        return self._data(Request(MgmtClass.PERF, Method.SET, attr, PortId(lid), mod, data))

    def sa_get(self, attr: int, data: bytes = b"", comp_mask: int = 0) -> bytes:
        """SubnAdmGet(attr) to the SM's LID: the one record's data area."""
        to = PortId(self.port.sm_lid)
        req = Request(MgmtClass.SUBN_ADM, Method.GET, attr, to, 0, data, comp_mask)
        return self._data(req)

    def resolve_guid(self, port_guid: int) -> PortId:
        """A port GUID's LID, asked of the SA (a NodeRecord by PortGUID), as ``-G`` does."""
        from ibal.mad import sa

        mask = sa.component_mask(sa.NODE_RECORD, ["port_guid"])
        rec = self.sa_get(SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(port_guid=port_guid), mask)
        return PortId(int(sa.NODE_RECORD.decode(rec)["lid"]))

    def close(self) -> None:
        self.port.close()


def _smp(method: int, attr: int, to: PortId, mod: int, data: bytes) -> Request:
    cls = MgmtClass.SUBN_DR if to.directed else MgmtClass.SUBN_LID
    return Request(cls, method, attr, to, mod, data)


def smp_request(attr: int, to: PortId, mod: int = 0, *, context: Any = None) -> Request:
    """A SubnGet(attr) request for :meth:`MadClient.post`."""
    req = _smp(Method.GET, attr, to, mod, b"")
    req.context = context
    return req


def _byte(table: Any, name: str) -> int:
    return int(table.by_name[name].offset) // 8


_TID = _byte(header.MAD_HEADER, "tid")
_HOPS = _byte(header.DR_HEADER, "hop_count")
_PATH = _byte(header.DR_SMP, "initial_path") + 1  # entry 0 of the path is unused
assert _HOPS + 1 == _TID < _TID + 8 <= _PATH  # the order _build patches them in
_templates: dict[tuple[Any, ...], bytes] = {}


def _build(r: Request, tid: int) -> bytes:
    """The request's MAD: a checked build once per kind of request, then a copy of it
    with this TID (and DR path) patched in, which is what a sweep's many SMPs differ by."""
    to = r.to
    key = (r.mgmt_class, r.method, r.attr_id, r.attr_mod, r.data, r.comp_mask, to.dr_slid,
           to.dr_dlid, None if to.dr_path is None else 0)  # fmt: skip
    tpl = _templates.get(key)
    if tpl is None:
        if len(_templates) > 512:
            _templates.clear()
        tpl = _templates[key] = bytes(header.build(
            r.mgmt_class, r.method, r.attr_id, tid=0, attr_mod=r.attr_mod, data=r.data,
            dr_path=() if to.dr_path is not None else None, dr_slid=to.dr_slid,
            dr_dlid=to.dr_dlid, comp_mask=r.comp_mask,
        ))  # fmt: skip
    path = to.dr_path
    if path is None:
        return tpl[:_TID] + tid.to_bytes(8, "big") + tpl[_TID + 8 :]
    n = len(path)
    # hop count (byte 7), TID (8..15) and initial path (129..) patched into the template
    return b"".join((tpl[:_HOPS], bytes((n,)), tid.to_bytes(8, "big"), tpl[_TID + 8 : _PATH],
                     bytes(path), tpl[_PATH + n :]))  # fmt: skip


# ---------------------------------------------------------------- the AL's agents


@dataclass
class AlMadPort:
    """A port of an open AL CA, through its QP0/QP1 alias QPs and one agent per class.

    ``ca``/``port_num`` as :func:`pick_port` chose them; the CA is closed by
    :meth:`close` only if ``owns_ca``.
    """

    ca: Any
    port_num: int
    port_guid: int
    lid: int
    sm_lid: int
    owns_ca: bool = True
    _pd: Any = None
    _aliases: dict[int, Any] = field(default_factory=dict)
    _agents: dict[int, Any] = field(default_factory=dict)
    _on_mad: Callable[[bytes], None] | None = None
    _transport_waits: bool = False
    _on_mads: Callable[[Sequence[bytes]], None] | None = None

    def start(self, on_mad: Callable[[bytes], None]) -> None:
        self._on_mad = on_mad
        self._pd = self.ca.alloc_pd()
        self._transport_waits = not self.ca.capabilities.mad_agents

    def start_batches(self, on_mads: Callable[[Sequence[bytes]], None]) -> None:
        """Optional for a :class:`MadPort`: MADs the provider reads together come to
        ``on_mads`` in one call (instead of ``on_mad`` each); call before the first send."""
        self._on_mads = on_mads

    def _agent(self, mgmt_class: int, qp: int) -> Any:
        agent = self._agents.get(mgmt_class)
        if agent is not None:
            return agent
        from ibal.mad.consts import CLASS_VERSION
        from ibal.types import QpType

        alias = self._aliases.get(qp)
        if alias is None:
            kind = QpType.QP0_ALIAS if qp == 0 else QpType.QP1_ALIAS
            alias = self._aliases[qp] = self._pd.get_spl_qp(self.port_guid, kind)
        on_mad = self._on_mad
        assert on_mad is not None

        def recv(r: Any) -> None:
            on_mad(r.mad)

        on_mads = self._on_mads
        batch = None if on_mads is None else lambda rs: on_mads([r.mad for r in rs])
        # inline: ``recv`` only queues (or the client's drive() handles the answers, without
        # blocking), so it runs on the provider's thread: no thread crossing per MAD
        agent = alias.register_agent(
            mgmt_class, CLASS_VERSION.get(mgmt_class, 1), recv_cb=recv, inline=True,
            recv_batch_cb=batch,
        )  # fmt: skip
        self._agents[mgmt_class] = agent
        return agent

    def send(self, mad: bytes, to: PortId, qp: int, timeout_ms: int) -> None:
        from ibal.types import MadSend

        agent = self._agent(mad[1], qp)
        # timeout_ms 0 for the transport: the client times requests out itself (a
        # waiting transport would refuse a TID it still waits for, and umad2sim
        # never ends the wait); special-QP transports then drop the answer, so
        # there the transport's own wait is kept (one try; the client retries).
        agent.send(MadSend(mad, _addr(to, qp), timeout_ms if self._transport_waits else 0))

    def send_many(self, items: Sequence[tuple[bytes, PortId, int, int, int]]) -> int:
        """Send ``(mad, to, qp, timeout_ms, ...)`` items in order through one
        :meth:`~ibal.al.MadAgent.send_many` (those of the first item's class): how many
        were sent; raises as :meth:`send` only when the first could not be."""
        from ibal.types import MadSend

        first = items[0][0]
        cls, qp0 = first[1], items[0][2]
        agent = self._agent(cls, qp0)
        waits = self._transport_waits
        sends = []
        for mad, to, qp, timeout_ms, _tid in items:
            if mad[1] != cls:
                break
            sends.append(MadSend(mad, _addr(to, qp), timeout_ms if waits else 0))
        return int(agent.send_many(sends))

    def abandon(self, tid: int) -> None:
        """Nothing to undo: with ``timeout_ms`` 0 the transport keeps no state for it."""

    def close(self) -> None:
        for agent in self._agents.values():
            agent.deregister(wait=True)
        self._agents.clear()
        for alias in self._aliases.values():
            alias.destroy(wait=True)
        self._aliases.clear()
        if self._pd is not None:
            self._pd.dealloc(wait=True)
            self._pd = None
        if self.owns_ca:
            self.ca.close(wait=True)


@dataclass
class ServiceMadPort(AlMadPort):
    """The same port through the MAD service (:func:`ibal.mad.reg_mad_svc`), one per class.

    Each request is a pool element sent with ``resp_expected`` (the service links
    the response to it); the client's time-out cancels an element it gave up,
    since under umad2sim the transport would wait for it for ever.
    """

    _sent: dict[int, tuple[Any, Any]] = field(default_factory=dict)  # TID low -> (svc, elem)

    def _agent(self, mgmt_class: int, qp: int) -> Any:
        service = self._agents.get(mgmt_class)
        if service is not None:
            return service
        from ibal.mad import reg_mad_svc
        from ibal.mad.consts import CLASS_VERSION
        from ibal.mad.svc import MadSvc
        from ibal.types import QpType

        alias = self._aliases.get(qp)
        if alias is None:
            kind = QpType.QP0_ALIAS if qp == 0 else QpType.QP1_ALIAS
            alias = self._aliases[qp] = self._pd.get_spl_qp(self.port_guid, kind)
        svc = MadSvc(mgmt_class, CLASS_VERSION.get(mgmt_class, 1), recv_cb=self._recv,
                     send_cb=self._done)  # fmt: skip
        service = self._agents[mgmt_class] = reg_mad_svc(alias, svc)
        return service

    def _recv(self, e: Any) -> None:
        from ibal.mad import put_mad

        on_mad = self._on_mad
        assert on_mad is not None
        on_mad(bytes(e.mad))
        put_mad(e)

    def _done(self, e: Any) -> None:
        from ibal.mad import put_mad

        self._sent.pop(int.from_bytes(e.mad[12:16], "big"), None)
        put_mad(e)

    def send(self, mad: bytes, to: PortId, qp: int, timeout_ms: int) -> None:
        service = self._agent(mad[1], qp)
        e = service.pool_key.get_mad()
        e.mad[:] = mad
        e.addr = _addr(to, qp)
        e.resp_expected, e.timeout_ms, e.retry_cnt = True, timeout_ms, 0
        tid = int.from_bytes(mad[12:16], "big")
        self._sent[tid] = (service, e)
        try:
            service.send(e)
        except BaseException:
            self._sent.pop(tid, None)
            raise

    def send_many(self, items: Sequence[tuple[bytes, PortId, int, int, int]]) -> int:
        """One pool element per MAD, as :meth:`send` (the service sends one at a time)."""
        for n, (mad, to, qp, timeout_ms, *_) in enumerate(items):
            try:
                self.send(mad, to, qp, timeout_ms)
            except IbError:
                if n == 0:
                    raise
                return n
        return len(items)

    def abandon(self, tid: int) -> None:
        from ibal.status import NotFound

        got = self._sent.get(tid)
        if got is not None:
            with contextlib.suppress(NotFound):
                got[0].cancel(got[1])

    def close(self) -> None:
        for service in self._agents.values():
            service.deregister(wait=True)
        self._agents.clear()
        super().close()


def _addr(to: PortId, qp: int) -> Any:
    if to.directed:  # to the permissive LID, or LID-routed to where the directed part starts
        return _lid_addr(to.lid if to.dr_slid != 0xFFFF and to.lid else 0xFFFF, 0)
    return _lid_addr(to.lid, qp)


@functools.lru_cache(maxsize=4096)
def _lid_addr(lid: int, qp: int) -> Any:
    """One (frozen) address per LID and QP: a sweep sends thousands of SMPs to one."""
    from ibal.types import QP1_WELL_KNOWN_QKEY, MadAddr

    if qp == 0:
        return MadAddr(remote_qp=0, remote_qkey=0, dlid=lid)
    return MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=lid)


VIAS: Final = ("service", "agent")


def pick_port(
    al: Any, ca_name: str | None = None, port_num: int | None = None, *, via: str = "service"
) -> AlMadPort:
    """The port the tools use: ``-C``/``-P``, else the first CA with an ACTIVE port.

    ``ca_name`` matches a CA's name or its GUID (hex).  ``via``: ``"service"``
    (the MAD service, :class:`ServiceMadPort`) or ``"agent"`` (the AL's bare
    MAD agents, :class:`AlMadPort`).  ``MadError`` if no port fits.
    """
    if via not in VIAS:
        raise ValueError(f"via must be one of {VIAS}")
    kind = ServiceMadPort if via == "service" else AlMadPort
    from ibal.types import LinkState

    seen: list[str] = []
    for guid in al.get_ca_guids():
        ca = al.open_ca(guid)
        keep = False
        try:
            if ca_name and ca_name not in (ca.name, f"{guid:016x}", hex(guid)):
                continue
            attr = ca.query()
            ports: Sequence[Any] = attr.ports
            for p in ports:
                seen.append(f"{ca.name}/{p.port_num} {p.link_state.name}")
                if port_num is not None and p.port_num != port_num:
                    continue
                if port_num is None and p.link_state is not LinkState.ACTIVE:
                    continue
                keep = True
                return kind(ca, p.port_num, p.port_guid, p.lid, p.sm_lid)
        finally:
            if not keep:
                ca.close(wait=True)
    want = f"CA {ca_name}" if ca_name else "a CA"
    if port_num is not None:
        want += f" port {port_num}"
    raise MadError(f"no {want} with an active port (seen: {', '.join(seen) or 'no CA'})")
