"""The Pythonic shape of the CM: :func:`connect`, :func:`listen`, :class:`Connection`.

::

    listener = ibal.cm.listen(al, 0x1234)            # server
    incoming = listener.get(timeout=5)                # blocks; or `await listener.next()`
    conn = incoming.accept(qp, private_data=b"hi")    # REP; returns once the RTU came

    conn = ibal.cm.connect(al, qp, path, 0x1234)      # client: REQ, REP, RTU; blocks
    conn.disconnect()                                 # DREQ; returns once the DREP came

Each blocking call has an awaitable twin (``await conn``, ``await
listener.next()``, :func:`connect_async`) and a callback form
(``callback=``: the call returns at once, ``callback(conn)`` runs on the
AL's misc queue when the outcome is known: ``conn.error`` is ``None`` there
if it is established, else why not).  The client sends the RTU and a
disconnected side its DREP by itself; the IBAL calls (``ibal.cm.api``) leave
every step to the caller.  A REJ raises :class:`ConnectionRejected` (its
reason, ARI and private data), no answer ``Timeout``.  Blocking calls raise
``InvalidState`` on the AL's callback threads.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ibal.al import AccessLayer, Qp, call_user, check_timeout, in_callback
from ibal.cm import fsm, ops
from ibal.cm.conn import CmConn
from ibal.cm.listens import ListenHandle
from ibal.cm.records import CmDreq, CmListen, CmRej, CmRep, CmReq
from ibal.status import IbError, InvalidParameter, InvalidState, Status, Timeout
from ibal.types import QpType
from ibal.wire.fields import Value
from ibal.wire.mad.cm import RejReason, SidrStatus

if TYPE_CHECKING:
    import asyncio

__all__ = ["Connection", "ConnectionRejected", "Incoming", "Listener", "SidrReply", "connect",
           "connect_async", "listen", "resolve_service", "resolve_service_async"]  # fmt: skip

K = fsm.UpcallKind
_PEER_LEFT = frozenset({fsm.CmState.DREQ_RCVD, fsm.CmState.TIMEWAIT})
ConnCallback = Callable[["Connection"], object]


class ConnectionRejected(IbError):
    """The peer rejected the connection (REJ): ``reason``, ``ari``, ``private_data``."""

    status = Status.REMOTE_ERROR

    def __init__(self, reason: int, ari: bytes = b"", private_data: bytes = b"") -> None:
        try:
            name = RejReason(reason).name
        except ValueError:
            name = str(reason)
        super().__init__(f"rejected: {name}")
        self.reason = reason
        self.ari = ari
        self.private_data = private_data


class _Outcome:
    """Set once: waiters, awaiters and a callback learn it.  Decided before it wakes
    anyone, so a callback run in between already sees ``done`` and ``error``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._decided = False
        self._error: BaseException | None = None
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def done(self) -> bool:
        return self._decided

    @property
    def error(self) -> BaseException | None:
        """Why it failed; ``None`` while undecided or when it succeeded."""
        return self._error

    def decide(self, error: BaseException | None = None) -> bool:
        """Record the outcome (the first one wins) without waking anyone yet."""
        with self._lock:
            if self._decided:
                return False
            self._error = error
            self._decided = True
            return True

    def wake(self) -> None:
        """Wake the waiters and awaiters of the decided outcome."""
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            futures, self._futures = self._futures, []
        for loop, fut in futures:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, fut, self._error)

    def set(self, error: BaseException | None = None) -> bool:
        first = self.decide(error)
        self.wake()
        return first

    def wait(self, timeout: float | None, what: str) -> None:
        timeout = check_timeout(timeout)
        if not self._event.is_set():
            if in_callback():
                if not self._decided:
                    raise InvalidState(f"{what} blocks: call it off the AL's callback threads")
            elif not self._event.wait(timeout):
                raise Timeout(f"{what}: nothing within {timeout} s of waiting")
        if self._error is not None:
            raise self._error

    def future(self) -> asyncio.Future[None]:
        import asyncio

        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if not self._event.is_set():
                self._futures.append((loop, fut))
                return fut
        _settle(fut, self._error)
        return fut


def _settle(fut: asyncio.Future[None], error: BaseException | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)


class Connection:
    """One connection of the Pythonic API (either side).

    ``private_data``: what the peer sent with its REP (client) or REQ (server).
    ``on_disconnect(conn)`` (optional, misc queue) runs when the peer disconnects.
    """

    handle: CmConn

    def __init__(self, handle: CmConn | None, qp: Qp | None,
                 callback: ConnCallback | None) -> None:  # fmt: skip
        """``handle`` None: :func:`connect` passes :meth:`_deliver` to the request itself
        (its REP may come before the request call returns)."""
        self.qp = qp
        self.private_data = b""
        self.on_disconnect: ConnCallback | None = None
        self.peer_disconnected = False
        """The peer's DREQ ended the connection (set before ``closed``)."""
        self._callback = callback
        self.established = _Outcome()
        self.closed = _Outcome()
        self._rtu: IbError | bool = False  # the RTU _answer sent (True) or why it could not
        self._drep = False
        if handle is not None:
            self.handle = handle
            handle.deliver = self._deliver
            handle.answer = self._answer

    def __repr__(self) -> str:
        handle = getattr(self, "handle", None)
        state = "REQUESTING" if handle is None else handle.state.name
        return f"<Connection {state} qp={getattr(self.qp, 'num', None)}>"

    @property
    def state(self) -> fsm.CmState:
        return self.handle.state

    @property
    def error(self) -> BaseException | None:
        """Why the connection was not established (``None``: established, or not yet
        decided; ``established.done`` tells which), set before the callback runs."""
        return self.established.error

    def wait(self, timeout: float | None = None) -> Connection:
        """Block until established (``ConnectionRejected``, ``Timeout`` otherwise)."""
        self.established.wait(timeout, "Connection.wait")
        return self

    def __await__(self) -> Generator[Any, None, Connection]:
        yield from self.established.future().__await__()
        return self

    def disconnect(self, private_data: bytes = b"", *, wait: bool = True,
                   timeout: float | None = None) -> None:  # fmt: skip
        """Send DREQ (the QP goes to ERROR); ``wait``: block until the DREP (or its time-out).
        A peer's DREQ that came first (its upcall not yet run) ends it the same way."""
        if not self.closed.done:
            self._send_dreq(private_data)
        if wait:
            self.closed.wait(timeout, "Connection.disconnect")

    def wait_closed(self, timeout: float | None = None) -> None:
        """Block until the connection ended (disconnected by either side, rejected, failed)."""
        self.closed.wait(timeout, "Connection.wait_closed")

    async def disconnect_async(self, private_data: bytes = b"") -> None:
        if not self.closed.done:
            self._send_dreq(private_data)
        await self.closed.future()

    def _send_dreq(self, private_data: bytes) -> None:
        try:
            ops.disconnect(self.handle, CmDreq(qp=self.qp, pdata=private_data))
        except InvalidState:
            # The machine runs on the thread that received the peer's DREQ, ahead of the
            # upcalls it posted: the DREQ's upcall (DREP, closed) is on its way.
            if self.handle.state not in _PEER_LEFT:
                raise

    def close(self) -> None:
        """Forget the connection at once (DREQ/REJ sent as its state asks; no callbacks)."""
        with contextlib.suppress(IbError):
            self.handle.destroy()
        self.closed.set()
        self.established.set(InvalidState("the connection was closed"))

    # ------------------------------------------------------------------ upcalls
    def _answer(self, handle: CmConn, up: fsm.Deliver) -> None:
        """Under the agent's lock, on the thread the message came on, before the upcall
        is posted: the RTU to a REP and the DREP to a DREQ, which this shape sends by
        itself (no user code runs here)."""
        kind = up.kind
        if kind is K.REP and up.status is Status.SUCCESS:
            try:
                ops.rtu(handle)
                self._rtu = True
            except IbError as exc:
                self._rtu = exc
        elif kind is K.DREQ:
            with contextlib.suppress(IbError):
                ops.reply_disconnect(handle)
            self._drep = True

    def _deliver(self, handle: CmConn, up: fsm.Deliver) -> None:
        """Misc queue: the connection's callbacks, answered the simple way."""
        self.handle = handle  # set already, or the request's upcall beat its return
        f = up.fields or {}
        kind = up.kind
        if kind is K.REP:
            if up.status is not Status.SUCCESS:
                self._fail(Timeout("no REP came"))
                return
            self.private_data = _bytes(f.get("private_data"))
            try:
                if self._rtu is False:  # no answer ran (the handle came without one)
                    ops.rtu(handle)
                elif isinstance(self._rtu, IbError):
                    raise self._rtu
            except IbError as exc:
                with contextlib.suppress(IbError):
                    ops.reject(handle, CmRej(rej_status=RejReason.CONSUMER_DEFINED))
                self._fail(exc)
                return
            self._established()
        elif kind is K.RTU:
            if up.status is Status.SUCCESS:
                self._established()
            else:
                self._fail(Timeout("no RTU came"))
        elif kind is K.REJ:
            self._fail(ConnectionRejected(_int(f.get("reason")), _bytes(f.get("ari")),
                                          _bytes(f.get("private_data"))))  # fmt: skip
        elif kind is K.DREQ:
            self.peer_disconnected = True
            self._closed()  # the QP is in ERROR already; the peer learns it from the DREP
            if not self._drep:
                with contextlib.suppress(IbError):
                    ops.reply_disconnect(handle)
        elif kind in (K.DREP, K.STALE):
            self._closed()

    def _established(self) -> None:
        self._report(None)

    def _fail(self, error: BaseException) -> None:
        self._report(error)
        self.closed.set()

    def _report(self, error: BaseException | None) -> None:
        """The outcome, once: decided first (the callback sees ``established.done`` and
        ``error``), then the callback, then the waiters wake (as IBAL's SYNC)."""
        if not self.established.decide(error):
            return
        if self._callback is not None:
            call_user(self._callback, self)
        self.established.wake()

    def _closed(self) -> None:
        if self.closed.set():
            self._report(InvalidState("disconnected before it was established"))
            if self.on_disconnect is not None:
                call_user(self.on_disconnect, self)


def connect(al: AccessLayer, qp: Qp, path: object, service_id: int, private_data: bytes = b"",
            *, callback: ConnCallback | None = None, timeout: float | None = None,
            **options: Any) -> Connection:  # fmt: skip
    """Connect ``qp`` over ``path`` (a PathRecord) to whoever listens on ``service_id``.

    Blocks until established (REP received, QP in RTS, RTU sent) unless ``callback`` is
    given; ``options`` are :class:`ibal.cm.records.CmReq` fields (``resp_res``,
    ``retry_cnt``...; ``resp_res`` and ``init_depth`` default to 1 here).
    """
    options.setdefault("resp_res", 1)
    options.setdefault("init_depth", 1)
    timeout = check_timeout(timeout)
    req = _record(CmReq, svc_id=service_id, primary_path=_path(path), qp=qp, rep_cb=_noop,
                  qp_type=getattr(qp, "qp_type", QpType.RC), pdata=private_data,
                  **options)  # fmt: skip
    # The object first: the REP's upcall may run on the misc queue before request returns.
    conn = Connection(None, qp, callback)
    conn.handle = ops.request(al, req, deliver=conn._deliver, answer=conn._answer)
    if callback is None:
        conn.wait(timeout)
    return conn


async def connect_async(al: AccessLayer, qp: Qp, path: object, service_id: int,
                        private_data: bytes = b"", **options: Any) -> Connection:  # fmt: skip
    conn = connect(al, qp, path, service_id, private_data, callback=lambda c: None, **options)
    return await conn


class Incoming:
    """A REQ waiting for :meth:`accept` or :meth:`reject` (from :meth:`Listener.get`)."""

    def __init__(self, handle: CmConn, fields: dict[str, Value]) -> None:
        self.handle = handle
        self.fields = fields
        self.service_id = _int(fields.get("service_id"))
        self.private_data = _bytes(fields.get("private_data"))
        self.sidr = handle.cep is not None and handle.cep.sidr
        """A SIDR_REQ (answer it with :meth:`answer`), not a REQ."""
        self.connection = Connection(handle, None, None)
        self.connection.private_data = self.private_data

    def __repr__(self) -> str:
        return f"<Incoming REQ 0x{self.service_id:016x}>"

    def accept(self, qp: Qp, private_data: bytes = b"", *, callback: ConnCallback | None = None,
               timeout: float | None = None, **options: Any) -> Connection:  # fmt: skip
        """REP with ``qp``; blocks until the RTU (or data) came unless ``callback`` is given."""
        conn = self.connection
        conn.qp = qp
        conn._callback = callback
        options.setdefault("init_depth", _int(self.fields.get("responder_resources")))
        timeout = check_timeout(timeout)
        qp_type = getattr(qp, "qp_type", None)
        ops.accept(self.handle, _record(CmRep, qp=qp, qp_type=qp_type, pdata=private_data,
                                        **options))  # fmt: skip
        if callback is None:
            conn.wait(timeout)
        return conn

    def reject(self, reason: int = RejReason.CONSUMER_DEFINED, *, ari: bytes = b"",
               private_data: bytes = b"") -> None:  # fmt: skip
        """REJ the REQ (a SIDR_REQ: SIDR_REP with status REJECT; ``reason`` unused)."""
        ops.reject(self.handle, CmRej(rej_status=reason, ari=ari, pdata=private_data))

    def answer(self, qp: Qp, private_data: bytes = b"") -> None:
        """Answer a SIDR_REQ with UD ``qp`` (the SIDR_REP carries its number and Q_Key)."""
        ops.sidr_reply(self.handle, CmRep(qp=qp, qp_type=QpType.UD, status=SidrStatus.SUCCESS,
                                          pdata=private_data))  # fmt: skip


class Listener:
    """REQs (``ud``: SIDR_REQs) to one service ID, queued for :meth:`get` (or handed to
    ``callback``)."""

    def __init__(self, al: AccessLayer, service_id: int, *,
                 callback: Callable[[Incoming], object] | None = None, compare_offset: int = 0,
                 compare: bytes = b"", port_guid: int = 0, ud: bool = False,
                 backlog: int = 128) -> None:  # fmt: skip
        self._queue: queue.Queue[Incoming] = queue.Queue()
        self._callback = callback
        rec = _record(CmListen, svc_id=service_id, req_cb=_noop, port_guid=port_guid,
                      compare_buffer=compare, compare_offset=compare_offset,
                      qp_type=QpType.UD if ud else QpType.RC, backlog=backlog)  # fmt: skip
        self.handle: ListenHandle = ops.listen(al, rec, on_request=self._on_request)

    def __repr__(self) -> str:
        return f"<Listener 0x{self.handle.svc_id:016x}>"

    def _on_request(self, listen: ListenHandle, handle: CmConn, fields: dict[str, Value]) -> None:
        # Under the agent's lock: only wire the upcall; the REQ upcall follows on misc.
        def deliver(h: CmConn, up: fsm.Deliver) -> None:
            if up.kind in (K.REQ, K.SIDR_REQ):
                incoming = Incoming(h, dict(up.fields or fields))
                if self._callback is not None:
                    call_user(self._callback, incoming)
                else:
                    self._queue.put(incoming)
            else:  # pragma: no cover  (Incoming replaces deliver at once)
                pass

        handle.deliver = deliver

    def get(self, timeout: float | None = None) -> Incoming:
        """The next REQ (``Timeout`` after ``timeout`` seconds)."""
        if in_callback():
            raise InvalidState("Listener.get blocks: call it off the AL's callback threads")
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            raise Timeout(f"no REQ within {timeout} s") from None

    async def next(self) -> Incoming:
        import asyncio

        return await asyncio.to_thread(self._queue.get)

    def close(self) -> None:
        """Stop listening (REQs in the queue stay; their connections work)."""
        with contextlib.suppress(IbError):
            self.handle.cancel()


def listen(al: AccessLayer, service_id: int, **kw: Any) -> Listener:
    """Listen on ``service_id`` (see :class:`Listener`)."""
    return _record(Listener, al=al, service_id=service_id, **kw)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class SidrReply:
    """A SIDR_REP: ``status`` (``SidrStatus``), the UD QP number and Q_Key to send to."""

    status: SidrStatus
    qpn: int
    qkey: int
    private_data: bytes
    info: bytes


class _SidrWait:
    def __init__(self, callback: Callable[[SidrReply | BaseException], object] | None) -> None:
        self.outcome = _Outcome()
        self.reply: SidrReply | None = None
        self.callback = callback

    def deliver(self, handle: CmConn, up: fsm.Deliver) -> None:
        f = up.fields
        result: SidrReply | BaseException
        if up.status is not Status.SUCCESS or f is None:
            result = Timeout("no SIDR_REP came")
            self.outcome.set(result)
        else:
            status = _int(f.get("status"))
            known = status in SidrStatus._value2member_map_
            self.reply = result = SidrReply(
                SidrStatus(status) if known else SidrStatus.REJECT, _int(f.get("qpn")),
                _int(f.get("qkey")), _bytes(f.get("private_data")),
                _bytes(f.get("additional_info")))  # fmt: skip
            self.outcome.set()
        with contextlib.suppress(IbError):
            handle.destroy()
        if self.callback is not None:
            call_user(self.callback, result)


def resolve_service(al: AccessLayer, path: object, service_id: int, private_data: bytes = b"",
                    *, timeout_ms: int = 1000, retries: int = 3,
                    callback: Callable[[SidrReply | BaseException], object] | None = None,
                    timeout: float | None = None) -> SidrReply | None:  # fmt: skip
    """SIDR: ask who serves ``service_id`` on a UD QP at the path's end; blocks for the
    :class:`SidrReply` (``Timeout`` without one) unless ``callback`` is given (then ``None``
    is returned and ``callback(reply or exception)`` runs on the misc queue)."""
    waiter = _SidrWait(callback)
    ops.sidr_request(al, CmReq(svc_id=service_id, primary_path=_path(path), rep_cb=_noop,
                               qp_type=QpType.UD, pdata=private_data, timeout_ms=timeout_ms,
                               max_cm_retries=retries), deliver=waiter.deliver)  # fmt: skip
    if callback is not None:
        return None
    waiter.outcome.wait(timeout, "resolve_service")
    assert waiter.reply is not None
    return waiter.reply


async def resolve_service_async(al: AccessLayer, path: object, service_id: int,
                                private_data: bytes = b"", **kw: Any) -> SidrReply:  # fmt: skip
    waiter = _SidrWait(None)
    ops.sidr_request(al, CmReq(svc_id=service_id, primary_path=_path(path), rep_cb=_noop,
                               qp_type=QpType.UD, pdata=private_data, **kw),
                     deliver=waiter.deliver)  # fmt: skip
    await waiter.outcome.future()
    assert waiter.reply is not None
    return waiter.reply


def _record(cls: type[Any], **fields: Any) -> Any:
    """``cls(**fields)``, an unknown field ``InvalidParameter`` naming it (not a TypeError)."""
    try:
        return cls(**fields)
    except TypeError as e:
        raise InvalidParameter(f"{cls.__name__}: {e}") from None


def _noop(*_args: object) -> None:
    """The records' required callbacks: the Pythonic shape delivers through its objects."""


def _path(path: object) -> Any:
    """A PathRecord's fields (an ``ibal.sa`` Record, or already a mapping)."""
    return getattr(path, "fields", path)


def _bytes(v: object) -> bytes:
    return bytes(v) if isinstance(v, bytes | bytearray) else b""


def _int(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0
