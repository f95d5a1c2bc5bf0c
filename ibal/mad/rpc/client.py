"""The matching and retry core: :class:`MadClient` over a :class:`MadPort`.

Responses are matched by the TID's low half; the time-out and retries are the
client's own, each retry under a fresh TID, so a late answer to a try given up
is dropped (``stats["stale"]``).  ``poll``/``call`` run on the caller's thread;
the port's callbacks only queue what arrives, except during :meth:`MadClient.drive`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from ibal.mad.rpc.portid import PortId
from ibal.mad.rpc.request import MadError, Reply, Request, build_mad, smp
from ibal.records import record
from ibal.status import IbError
from ibal.wire.mad.consts import Method, MgmtClass, SaAttr

__all__ = ["DEFAULT_RETRIES", "DEFAULT_TIMEOUT_MS", "MadClient", "MadPort"]

DEFAULT_TIMEOUT_MS = 500
DEFAULT_RETRIES = 2
_TID_LOW = 0xFFFFFFFF
_SMP_CLASSES = frozenset((MgmtClass.SUBN_LID, MgmtClass.SUBN_DR))  # on QP0


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


@record
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
        m_key: int = 0,
    ) -> None:
        if timeout_ms <= 0 or retries < 0:
            raise ValueError("timeout_ms must be positive and retries not negative")
        if not 0 <= m_key < 1 << 64:
            raise ValueError("m_key must fit 64 bits")
        self.port = port
        self.m_key = m_key  # every SMP's M_Key (the diagnostics' -y)
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
        return build_mad(r, tid, self.m_key if qp == 0 else 0), r.to, qp, self.timeout_ms, tid

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
        return self._data(smp(Method.GET, attr, to, mod, b""))

    def smp_set(self, attr: int, to: PortId, data: bytes, mod: int = 0) -> bytes:
        """SubnSet(attr): the data the SMA answered with."""
        return self._data(smp(Method.SET, attr, to, mod, data))

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
        from ibal.wire.mad import sa

        mask = sa.component_mask(sa.NODE_RECORD, ["port_guid"])
        rec = self.sa_get(SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(port_guid=port_guid), mask)
        return PortId(int(sa.NODE_RECORD.decode(rec)["lid"]))

    def close(self) -> None:
        self.port.close()
