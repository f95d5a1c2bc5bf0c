"""The SA as seen from one local port: :class:`SaPort`, the I/O layer of ``ibal.sa``.

One :class:`SaPort` per (AL instance, port), shared: :meth:`SaPort.open`
gives the existing one (and counts the holder), :meth:`SaPort.close` drops a
hold; it lives until the last holder closes it or its AL closes.  It owns a
CA handle, a PD, the port's QP1 alias and one MAD service of class SUBN_ADM
version 2 on it (with RMPP sessions on the AL's timers where the port's
transport does not run RMPP itself).  Reports: the SA ports of one manager on
one port share one receiver (:mod:`ibal.sa.reports`): the first with report
listeners registers a second service for unsolicited Reports, and every
port with listeners hears each Report.  It uses its CA handle: a CA
withdrawn takes it along.

:meth:`SaPort.request` runs an :class:`~ibal.sa.txn.SaTxn` to the port's SM
LID (QP1, Q_Key 0x80010000).  The port's SM LID/SL serve first tries for up to
a second and are read again on any PnP event of the port and for every
retry, so an SM that moved or came back is found without restarting
anything; with no SM LID a try goes nowhere and the request times out.  The
tries are timed on the AL's timers through one timer per port, armed for the
earliest deadline of its requests (a ``ManualClock`` steps them in tests).

Threads: an answer's callback (``callback(answer)``) and the report listeners
run on the thread that reports the MAD to the AL (the umad provider's receive
thread, the AL's special-QP completion thread), with no hop to another queue;
answers the port makes itself (time-out, failed send) on the AL's misc queue.
They must not block nor wait for this AL's objects (sending another request
is fine), and may run concurrently with each other; the ``CANCELED`` answers
of a closing AL (or ``close``/port loss) run on the thread that closes it.
:meth:`SaRequest.wait` blocks (never on an AL thread); ``await request``
works on any event loop.

RoCE: an Ethernet port has no SA.  A PathRecord Get/GetTable there goes to
``ibal.sa.roce.start`` (path resolution from the GIDs and the IP stack, on
the port's timers, docs/sa.md "RoCE paths"), whose answer ends the request's
transaction like an SA's; any other request on such a port raises
``Unsupported`` at call time.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import threading
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from ibal import osrandom
from ibal.al import AccessLayer, Dependent, PnpClass, PnpOrder, StashKey, call_user, in_callback
from ibal.mad import MadElement, MadService, MadSvc, enable_rmpp, put_mad, reg_mad_svc
from ibal.sa.reports import ReportHub, hub_of
from ibal.sa.txn import (
    SA_DATA,
    SA_HEADER_SIZE,
    Abandon,
    Action,
    ArmTimer,
    Finish,
    SaAnswer,
    SaTxn,
    SendTry,
)
from ibal.status import (
    IbError,
    InvalidGuid,
    InvalidParameter,
    InvalidState,
    NoMatch,
    ResourceBusy,
    Status,
    Timeout,
    Unsupported,
)
from ibal.types import QP1_WELL_KNOWN_QKEY, LinkLayer, LinkState, MadAddr, QpType, WcStatus, is_int
from ibal.wire.mad import header as mad_header
from ibal.wire.mad.consts import Method, MgmtClass, SaAttr
from ibal.wire.mad.sa import NOTICE

if TYPE_CHECKING:
    import asyncio

    from ibal.al import AliasQp, Ca, PnpRec, PnpRegistration, Timer
    from ibal.sa.roce import RoceAnswer, RoceRequest

__all__ = ["ReportListener", "SaPort", "SaRequest"]

log = logging.getLogger("ibal.sa")

SA_CLASS_VERSION = 2
ReportListener = Callable[[bytes, MadAddr], object]
AnswerCallback = Callable[[SaAnswer], object]
_PORTS: StashKey[dict[int, SaPort]] = StashKey()
_PORTS_LOCK = threading.Lock()
_ROCE_METHODS = frozenset({Method.GET, Method.GET_TABLE})
_SM_ADDR_AGE = 1.0
"""Seconds a read of the port's SM LID/SL serves first tries (PnP events for the port
and every retry read it afresh): a new SM is found within that, or by the retry."""
_SLACK = 1e-9


class SaRequest:
    """One SA request in flight (made by :meth:`SaPort.request`)."""

    def __init__(self, port: SaPort, txn: SaTxn, callback: AnswerCallback | None) -> None:
        self.port = port
        self.txn = txn
        self._callback = callback
        self._lock = threading.Lock()
        self._done: threading.Event | None = None  # made by a wait() before the answer
        self._answer: SaAnswer | None = None
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[SaAnswer]]] = []
        self._due: float | None = None  # the machine's timer, on the port's deadline heap
        self._tries: dict[int, MadElement] = {}  # TID -> the element of that try
        self.roce: RoceRequest | None = None
        """On an Ethernet port: the path resolution (its ``answer.path`` has the MAC)."""

    def __repr__(self) -> str:
        a = self._answer
        state = a.status.name if a is not None else "pending"
        return f"<SaRequest method 0x{self.txn.method:02x} attr 0x{self.txn.attr_id:04x} {state}>"

    @property
    def done(self) -> bool:
        return self._answer is not None

    @property
    def answer(self) -> SaAnswer | None:
        """The answer once done, else ``None``."""
        return self._answer

    def cancel(self) -> None:
        """Stop it: the callback still runs once, with ``CANCELED`` (nothing if it ended)."""
        self.port._run(self, lambda: self.txn.cancel())
        if self.roce is not None:
            self.roce.cancel()

    def wait(self, timeout: float | None = None) -> SaAnswer:
        """Block until the answer (``Timeout`` after ``timeout`` seconds of waiting, the
        request still going); ``InvalidState`` on an AL callback thread."""
        answer = self._answer
        if answer is not None:
            return answer
        if in_callback():
            raise InvalidState("SaRequest.wait blocks: call it off the AL's callback threads")
        with self._lock:  # the event only for a request someone waits for
            if self._answer is None and self._done is None:
                self._done = threading.Event()
            done = self._done
        if done is not None and not done.wait(timeout):
            raise Timeout(f"no answer within {timeout} s of waiting")
        assert self._answer is not None
        return self._answer

    def __await__(self) -> Generator[Any, None, SaAnswer]:
        import asyncio

        loop = asyncio.get_running_loop()
        fut: asyncio.Future[SaAnswer] = loop.create_future()
        with self._lock:
            if self._answer is None:
                self._futures.append((loop, fut))
            else:
                fut.set_result(self._answer)
        return fut.__await__()

    def _deliver(self, answer: SaAnswer) -> None:
        with self._lock:
            if self._answer is not None:
                return
            self._answer = answer
            futures, self._futures = self._futures, []
            done = self._done
        if done is not None:
            done.set()
        for loop, fut in futures:
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody awaits
                loop.call_soon_threadsafe(_set_result, fut, answer)
        if self._callback is not None:
            call_user(self._callback, answer)


def from_sa(sender: MadAddr | None, sa: MadAddr | None) -> bool:
    """Whether an answer from ``sender`` can be the SA's, which was asked at ``sa``.

    The LID and QP (and on a global route the GID) the request went to must be where
    the answer came from; a LID of 0 or the permissive LID was no address to compare.
    """
    if sender is None or sa is None:
        return sa is None
    if sa.dlid not in (0, 0xFFFF) and sender.dlid != sa.dlid:
        return False
    if sender.remote_qp != sa.remote_qp:
        return False
    return sa.grh is None or sender.grh is None or sender.grh.dgid == sa.grh.dgid


def _set_result(fut: asyncio.Future[SaAnswer], answer: SaAnswer) -> None:
    if not fut.done():
        fut.set_result(answer)


def _find_port(al: AccessLayer, port_guid: int | None) -> tuple[int, int]:
    """(CA GUID, port number) of ``port_guid`` (``None``: the first ACTIVE port)."""
    if port_guid is not None and not is_int(port_guid):
        raise InvalidParameter(f"a port GUID is an int, not {type(port_guid).__name__}")
    for ca_guid in al.get_ca_guids():
        try:
            attr = al.query_ca_by_guid(ca_guid)
        except InvalidGuid:
            continue  # withdrawn meanwhile
        for p in attr.ports:
            if port_guid is None and p.link_state is LinkState.ACTIVE:
                return ca_guid, p.port_num
            if port_guid is not None and p.port_guid == port_guid:
                return ca_guid, p.port_num
    if port_guid is None:
        raise NoMatch("no local port is ACTIVE")
    raise InvalidGuid(f"no local port has GUID 0x{port_guid:016x}")


class SaPort(Dependent):
    """The SA reached from one local port (see the module docstring)."""

    _kind = "SA port"

    @classmethod
    def open(cls, al: AccessLayer, port_guid: int | None = None) -> SaPort:
        """The AL's :class:`SaPort` for ``port_guid`` (``None``: the first ACTIVE port),
        made on first use; each call is a hold that :meth:`close` drops.

        ``InvalidGuid`` for a GUID no local port has, ``NoMatch`` when no port is
        active, ``InvalidAlHandle`` for a closed AL.
        """
        if not isinstance(al, AccessLayer):
            raise InvalidParameter("SaPort.open takes an AccessLayer")
        ca_guid, port_num = _find_port(al, port_guid)
        guid = al.query_ca_by_guid(ca_guid).port(port_num).port_guid
        with _PORTS_LOCK:
            ports = al.stash.setdefault(_PORTS, {})
            sa = ports.get(guid)
            if sa is not None and sa.alive and sa._svc_alive():
                sa._holds += 1
                return sa
            sa = cls(al, ca_guid, port_num, guid)
            ports[guid] = sa
            return sa

    def __init__(self, al: AccessLayer, ca_guid: int, port_num: int, port_guid: int) -> None:
        self.port_guid = port_guid
        self._sa_port_num = port_num
        self._holds = 1
        self._sa_lock = threading.RLock()
        self._requests: dict[int, SaRequest] = {}  # id -> pending request
        self._listeners: dict[int, ReportListener] = {}
        self._ids = itertools.count(1)
        self.stats: dict[str, int] = {"reports": 0, "stale_answers": 0, "forged_answers": 0}
        # The SA's address (one MadAddr object, so the AL checks it once) and when it was
        # read; None: read it at the next try.
        self._sm_addr: tuple[MadAddr, float] | None = None
        # One AL timer for all requests: a heap of (deadline, seq, request), the timer
        # armed for the earliest; entries of answered requests are skipped when due.
        self._deadlines: list[tuple[float, int, SaRequest]] = []
        self._deadline_seq = itertools.count()
        self._timer: Timer | None = None
        self._timer_at: float | None = None
        self._pnp: PnpRegistration | None = None
        self._clock = al.timers.clock  # the manager's, for its life
        self.ca: Ca = al.open_ca(ca_guid)
        self.service: MadService | None = None
        self._reports: MadService | None = None  # the hub's Report receiver, while it holds it
        self._hub: ReportHub | None = None  # joined with the first report listener
        self._alias: AliasQp | None = None
        try:
            attr = self.ca.query_port(port_num)
            self.link_layer: LinkLayer = attr.link_layer
            if self.link_layer is LinkLayer.INFINIBAND:
                self.service = self._register()
            # It uses its CA handle: a CA withdrawn (or closed) takes the port along.
            super().__init__(al, uses=(self.ca,))
            if self.link_layer is LinkLayer.INFINIBAND:
                # Before user clients: their SM_CHANGE handlers query with a fresh SA address.
                self._pnp = al.reg_pnp(PnpClass.PORT, self._on_pnp, order=PnpOrder.SA)
        except BaseException:
            with contextlib.suppress(IbError):
                self.ca.close()
            raise

    def __repr__(self) -> str:
        return f"<SaPort {self.ca.name} port {self.port_num} 0x{self.port_guid:016x}>"

    @property
    def port_num(self) -> int:
        """The local port's number on :attr:`ca`."""
        return self._sa_port_num

    # ------------------------------------------------------------------ set-up
    def _register(self) -> MadService:
        """The requests' service (no unsolicited MADs: the port's Report receiver is taken
        only by a port that has report listeners, see :meth:`_serve_reports`)."""
        self._alias = self.ca.alloc_pd().get_spl_qp(self.port_guid, QpType.QP1_ALIAS)
        svc = MadSvc(MgmtClass.SUBN_ADM, SA_CLASS_VERSION, self._on_recv, self._on_sent)
        # inline: the answer goes from the receive thread to the request's machine and
        # callback with no queue hop (a thread crossing less per query).
        service = reg_mad_svc(self._alias, svc, inline=True)
        if not service.transport_rmpp:
            enable_rmpp(service, self.ca.al.timers, class_header_size=SA_HEADER_SIZE)
        return service

    def take_reports(self, hub: ReportHub) -> bool | None:
        """Called by ``hub`` (under its lock): register the port's Report receiver here.
        True when taken, False where there is no SA (RoCE), None when another client of
        the port (another process, through the kernel) serves them."""
        alias = self._alias
        if alias is None:
            return False
        svc = MadSvc(MgmtClass.SUBN_ADM, SA_CLASS_VERSION, self._on_recv, self._on_sent,
                     methods=frozenset({Method.REPORT}), support_unsol=True)  # fmt: skip
        try:
            self._reports = reg_mad_svc(alias, svc, inline=True)
        except ResourceBusy:
            # Queries work; Reports go to the other client.
            log.info("%r: SA Reports are served by another client of the port", self)
            for m in hub.members():
                m.stats["reports_elsewhere"] = 1
            return None
        return True

    def release_reports(self) -> None:
        """Called by the hub (under its lock) when this port leaves: let the receiver go,
        at once, so the next member can register its own."""
        svc, self._reports = self._reports, None
        if svc is not None:
            with contextlib.suppress(IbError):
                svc.deregister()

    def report_listeners(self) -> list[ReportListener]:
        """This port's report listeners (a copy)."""
        with self._sa_lock:
            return list(self._listeners.values())

    def _on_pnp(self, rec: PnpRec) -> None:
        """PnP queue: any event of this port (LID, SM, state, re-register) may move the SA."""
        if rec.guid == self.port_guid:
            self._sm_addr = None

    def _svc_alive(self) -> bool:
        return self.service is None or self.service.alive

    def close(self) -> None:
        """Drop one hold (from :meth:`open`); the last one destroys it: its pending
        requests end ``CANCELED``."""
        with _PORTS_LOCK:
            self._holds -= 1
            last = self._holds <= 0
            if last:
                ports = self.al.stash.get(_PORTS, {})
                if ports.get(self.port_guid) is self:
                    del ports[self.port_guid]
        if last:
            with contextlib.suppress(IbError):
                self.destroy()

    # ------------------------------------------------------------------ requests
    def request(
        self,
        method: int,
        attr_id: int,
        data: bytes = b"",
        comp_mask: int = 0,
        *,
        attr_mod: int = 0,
        timeout_ms: int = 1000,
        retry_cnt: int = 3,
        callback: AnswerCallback | None = None,
    ) -> SaRequest:
        """Ask the SA; ``callback(answer)`` gets the :class:`SaAnswer` once (on the
        receive thread or the misc queue, see the module docstring: never block there).

        ``InvalidParameter`` for a field that does not fit or a bad time-out,
        ``Unsupported`` for a request other than a PathRecord Get/GetTable on a
        RoCE port, ``InvalidHandle`` once the port (or its AL) is gone.
        """
        self.check()
        if callback is not None and not callable(callback):
            raise InvalidParameter("callback must be callable")
        try:
            txn = SaTxn(method, attr_id, bytes(data), comp_mask, attr_mod, timeout_ms,
                        retry_cnt, self._new_tid)  # fmt: skip
        except (ValueError, TypeError) as exc:  # FieldError is a ValueError
            raise InvalidParameter(str(exc)) from None
        req = SaRequest(self, txn, callback)
        if self.link_layer is not LinkLayer.INFINIBAND:
            if method not in _ROCE_METHODS or attr_id != SaAttr.PATH_RECORD:
                raise Unsupported(f"{self.ca.name} port {self.port_num} is {self.link_layer.value}"
                                  f": no SA, only PathRecord Get/GetTable are resolved")
            with self._sa_lock:
                self._requests[id(req)] = req
            self._roce_start(req)
            return req
        with self._sa_lock:
            self._requests[id(req)] = req
        self._run(req, lambda: txn.start(self._now()))
        return req

    def _roce_start(self, req: SaRequest) -> None:
        """The RoCE hook: ``ibal.sa.roce`` resolves the path (misc queue, the port's
        timers); its answer resolves the transaction, once."""
        from ibal.sa import roce  # only Ethernet ports load it

        txn = req.txn

        def done(answer: RoceAnswer) -> None:
            self._run(req, lambda: txn.resolve(answer.sa_answer()))

        req.roce = roce.start(self, txn.method, txn.data, txn.comp_mask,
                              timeout_ms=txn.timeout_ms, retry_cnt=txn.retry_cnt,
                              callback=done)  # fmt: skip

    def _new_tid(self) -> int:
        # the low half from the OS: counted TIDs let a forger answer a request it never
        # saw (it replaced a PathRecord on the mock); the high half is the agent's
        while True:
            low = osrandom.randbits(32)
            if low:
                return low

    def _now(self) -> float:
        return self._clock.now()

    def _run(self, req: SaRequest, event: Callable[[], list[Action]]) -> None:
        """Feed one event to the request's machine and carry out its actions."""
        with self._sa_lock:
            actions = event()
            finish: SaAnswer | None = None
            for a in actions:  # exact types (the machine's own), most frequent first
                kind = type(a)
                if kind is ArmTimer:
                    self._arm(req, a.at)  # type: ignore[union-attr]
                elif kind is SendTry:
                    self._send_try(req, a)  # type: ignore[arg-type]
                elif kind is Finish:
                    finish = a.answer  # type: ignore[union-attr]
                    self._requests.pop(id(req), None)
                elif isinstance(a, Abandon):
                    self._abandon(req, a.tid)
            # A send failing at once ends the request: its Finish comes from the machine.
        if finish is not None:
            req._deliver(finish)

    def _sa_addr(self, fresh: bool) -> MadAddr | None:
        """The SA's address (``None``: no SM to ask); ``IbError`` when the port is gone.
        A first try uses a recent read; a retry (the SA may have moved) reads afresh."""
        now = self._now()
        cached = self._sm_addr
        if cached is not None and not fresh and now - cached[1] < _SM_ADDR_AGE:
            return cached[0]
        attr = self.ca.query_port(self.port_num)
        if not attr.sm_lid or attr.link_state is not LinkState.ACTIVE:
            self._sm_addr = None
            return None
        addr = cached[0] if cached is not None else None
        if addr is None or addr.dlid != attr.sm_lid or addr.sl != attr.sm_sl:
            addr = MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=attr.sm_lid,
                           sl=attr.sm_sl)  # fmt: skip
        self._sm_addr = (addr, now)
        return addr

    def _send_try(self, req: SaRequest, a: SendTry) -> None:
        service = self.service
        assert service is not None
        try:
            addr = self._sa_addr(fresh=a.attempt > 1)
        except IbError as exc:
            self._later_fail(req, a.tid, f"the port is gone ({exc})")
            return
        if addr is None:
            return  # no SM to ask: the try's time-out runs out
        e = service.pool_key.get_mad()
        e.mad[:] = a.mad
        e.addr = addr
        e.resp_expected, e.timeout_ms, e.retry_cnt = True, req.txn.timeout_ms, 0
        e.context1, e.context2 = req, a.tid
        try:
            service.send(e)
        except IbError as exc:
            put_mad(e)
            self._later_fail(req, a.tid, str(exc))
            return
        req._tries[a.tid] = e

    def _later_fail(self, req: SaRequest, tid: int, detail: str) -> None:
        # Called under the machine's event: the failure is its own event, run next.
        if not self.post_callback(self._run, req, lambda: req.txn.on_send_failed(tid, detail)):
            req._deliver(SaAnswer(Status.CANCELED, detail="the SA port is closing"))

    def _abandon(self, req: SaRequest, tid: int) -> None:
        e = req._tries.pop(tid, None)
        if e is None or self.service is None:
            return
        with contextlib.suppress(IbError):  # NotFound: its completion is on the way
            self.service.cancel(e)

    def _arm(self, req: SaRequest, at: float | None) -> None:
        """The machine's timer for ``req`` (under ``_sa_lock``): an entry on the port's
        deadline heap; disarming only forgets it (its entry is skipped when due)."""
        req._due = at
        if at is None:
            return
        heap = self._deadlines
        if len(heap) > 2 * len(self._requests) + 256:  # mostly answered requests: compact
            heap[:] = [d for d in heap if d[2]._due == d[0]]
            heapq.heapify(heap)
        heapq.heappush(heap, (at, next(self._deadline_seq), req))
        if self._timer_at is None or at < self._timer_at:
            self._arm_port_timer(at)

    def _arm_port_timer(self, at: float) -> None:
        self._timer_at = at
        delay = max(at - self._now(), 0.0)
        t = self._timer
        with contextlib.suppress(IbError):  # the AL's timers closed: it is going away
            if t is None:
                self._timer = self.call_later(delay, self._on_timer)
            else:
                t.reschedule(delay)

    def _on_timer(self) -> None:
        """Misc queue: the earliest deadline came; each request due gets its timer event."""
        with self._sa_lock:
            now = self._now()
            heap = self._deadlines
            due: list[SaRequest] = []
            while heap and heap[0][0] <= now + _SLACK:
                at, _, req = heapq.heappop(heap)
                if req._due == at:
                    req._due = None  # once, however many entries it has
                    due.append(req)
            while heap and heap[0][2]._due != heap[0][0]:
                heapq.heappop(heap)  # answered meanwhile: no reason to wake for it
            self._timer_at = None
            if heap:
                self._arm_port_timer(heap[0][0])
        for req in due:
            self._run(req, lambda r=req: r.txn.on_timer(self._now()))  # type: ignore[misc]

    # ------------------------------------------------------------------ MADs in
    def _on_sent(self, e: MadElement) -> None:
        """Receive thread (inline service): a send ended (a try, or a ReportResp of ours)."""
        req = e.context1
        if isinstance(req, SaRequest) and e.status is WcStatus.SUCCESS and e.resp_expected:
            return  # its response comes next and gives the element back
        if isinstance(req, SaRequest):
            with self._sa_lock:
                if req._tries.get(e.context2) is e:
                    del req._tries[e.context2]  # timed out or failed: the timer decides
        put_mad(e)

    def _on_recv(self, e: MadElement) -> None:
        """Receive thread (inline service): a response to a try, or an unsolicited Report."""
        request = e.request
        if request is not None:
            req = request.context1
            mad = bytes(e.mad)
            forged = not from_sa(e.addr, request.addr)
            put_mad([e, request])
            if isinstance(req, SaRequest):
                tid = request.context2
                with self._sa_lock:
                    if req._tries.get(tid) is request:
                        del req._tries[tid]
                if forged:
                    # the right TID from the wrong sender: not the SA's answer; the try
                    # is lost (the transport matched it), the time-out sends the next
                    self.stats["forged_answers"] += 1
                    return
                before = req.txn.stale
                self._run(req, lambda: req.txn.on_response(mad))
                self.stats["stale_answers"] += req.txn.stale - before
            return
        if e.mad[3] == Method.REPORT:
            self._report(e)
            return
        put_mad(e)

    def _report(self, e: MadElement) -> None:
        """Receive thread: a Report for the hub's ports; then the one ReportResp."""
        notice = bytes(e.mad[SA_DATA : SA_DATA + NOTICE.size])
        sender = e.addr
        assert sender is not None
        hub = self._hub
        self.stats["reports"] += 1  # the holder counts each; the others each they hear
        for port, listeners in hub.deliveries() if hub is not None else []:
            if port is not self:
                port.stats["reports"] += 1
            for fn in listeners:
                call_user(fn, notice, sender)
        # ReportResp: the Report back with the response method, to its sender.
        e.mad[:] = mad_header.respond(bytes(e.mad[: len(e.mad)]))
        e.resp_expected = False
        e.context1 = None
        try:
            assert self.service is not None
            self.service.send(e)
        except IbError as exc:
            log.warning("%r: ReportResp not sent: %s", self, exc)
            put_mad(e)

    def add_report_listener(self, fn: ReportListener) -> Callable[[], None]:
        """``fn(notice_bytes, sender)`` for each SA Report (receive thread; the port answers the
        ReportResp after the listeners ran); returns the function that removes ``fn``."""
        if not callable(fn):
            raise InvalidParameter("a report listener must be callable")
        self.check()
        key = next(self._ids)
        with self._sa_lock:
            self._listeners[key] = fn
            hub = self._hub
            if hub is None and self._alias is not None:
                hub = self._hub = hub_of(self.al.manager, self.port_guid)
        if hub is not None:
            hub.join(self)  # outside our lock: the hub calls other ports' methods

        def remove() -> None:
            with self._sa_lock:
                self._listeners.pop(key, None)

        return remove

    # ------------------------------------------------------------------ teardown
    @property
    def pending(self) -> int:
        """Requests not yet answered."""
        return len(self._requests)

    def on_destroying(self) -> None:
        hub, self._hub = self._hub, None
        if hub is not None:
            hub.leave(self)  # a Report receiver held here passes to the next listener
        pnp, self._pnp = self._pnp, None
        if pnp is not None:
            with contextlib.suppress(IbError):
                pnp.dereg()
        with self._sa_lock:
            reqs = list(self._requests.values())
        for req in reqs:
            self._cancel_closing(req)

    def _cancel_closing(self, req: SaRequest) -> None:
        self._run(req, lambda: req.txn.cancel("the SA port is closing"))
        if req.roce is not None:  # its timers die with the port: end it too
            req.roce.cancel()

    def cleanup(self) -> None:
        with _PORTS_LOCK:
            ports = self.al.stash.get(_PORTS, {})
            if ports.get(self.port_guid) is self:
                del ports[self.port_guid]
        with contextlib.suppress(IbError):
            self.ca.close()
