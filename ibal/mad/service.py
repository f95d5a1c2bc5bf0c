"""MAD services (IBAL ``ib_reg_mad_svc`` / ``ib_send_mad`` / ``ib_cancel_mad``).

A :class:`MadService` is one management class and version on an alias QP
(QP0 or QP1 of a port), built on the AL's :class:`~ibal.al.MadAgent`, so the
port picks the transport (the AL's own special QP, or the kernel's through
libibumad) and the caller never does.  It adds what IBAL's MAD service adds
to a bare agent: MAD elements from a pool, lists of sends, the response
linked to its request, cancel, a per-service bound on unsolicited MADs held
by the user, receive-side checks with drop counters, and the RMPP seam.

Threads: ``send_cb`` and ``recv_cb`` run on the AL's misc queue (the thread
that runs MAD agent callbacks; they must not block), or for a service
registered ``inline`` on the thread that reports the MAD to the AL; completions of a
deregistration run on the teardown queue just before the destroy callback.
:meth:`MadService.send`, :meth:`~MadService.cancel` and
:meth:`~MadService.deregister` may be called from any thread, callbacks
included.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ibal.al import SYNC_DESTROY, AliasQp, Ca, MadAgent
from ibal.mad.pool import ElementState, MadElement, MadPool, PoolKey
from ibal.mad.svc import (
    RMPP_CLASSES,
    TID_LO,
    MadSvc,
    MadSvcType,
    RmppSessions,
    Taker,
    check_element,
    check_svc,
    is_response,
    malformed,
    rmpp_active,
    unserved_attr,
)
from ibal.status import (
    IbError,
    InvalidHandle,
    InvalidParameter,
    NotFound,
    Unsupported,
)
from ibal.types import (
    MAD_SIZE,
    MadAddr,
    MadRecv,
    MadSend,
    MadSendDone,
    WcStatus,
    mad_error_reply,
)
from ibal.wire.mad.consts import MadStatus
from ibal.wire.mad.rmpp import RMPP_DATA, RMPP_VERSION, RmppFlags, RmppHeader, RmppType
from ibal.wire.mad.tid import Pending


@dataclass(eq=False)
class _Sending:
    """One send of an element: the transport's context, so a late completion of an
    earlier send cannot end a later one of the same element."""

    element: MadElement


DatagramCb = Callable[[bytes, MadAddr], object]
_INTERNAL = object()  # context of the service's own replies (no element, no callback)
RMPP_TRANSFER_BOUND_MS = 30_000
"""How long an RMPP request's answer may take while its segments still go out (the
sender's total time-out); once every segment is ACKed the element's own time-out runs."""


class MadService:
    """``ib_mad_svc_handle_t``: one registered MAD service (see :func:`reg_mad_svc`)."""

    def __init__(self, alias: AliasQp, svc: MadSvc, pool_key: PoolKey,
                 datagram_cb: DatagramCb | None = None) -> None:  # fmt: skip
        self.alias = alias
        self.svc = svc
        self.pool_key = pool_key
        self.datagram_cb = datagram_cb
        """Takes unsolicited requests as bytes (see :func:`reg_mad_svc`)."""
        self.stats: Counter[str] = Counter()
        """Received MADs this service dropped or answered itself, by reason."""
        self._lock = threading.Lock()
        self._out: dict[int, _Sending] = {}  # id(element) -> its send in progress
        self._awaiting: Pending[MadElement] = Pending(svc.mgmt_class, tid_bits=32)
        self._unsol_held = 0
        self._takers: dict[int, Taker] = {}  # id(request) -> who gets its outcome instead
        self._agent: MadAgent | None = None
        self._gone = False
        self.rmpp: RmppSessions | None = None
        self.transport_rmpp = False
        """The port's transport runs RMPP for this service (the kernel's MAD layer): RMPP
        sends go out whole and transfers arrive reassembled; ``rmpp`` is not used."""

    def __repr__(self) -> str:
        s = self.svc
        return f"<MadService class 0x{s.mgmt_class:02x} v{s.mgmt_version} on QP{self.alias.num}>"

    def _attach(self, agent: MadAgent) -> None:
        self._agent = agent
        self.transport_rmpp = bool(agent.rmpp_version)
        agent.on_gone(self._gone_now)

    @property
    def alive(self) -> bool:
        """False once deregistered or destroyed with its alias, PD, CA or AL."""
        agent = self._agent
        return agent is not None and not self._gone and agent.alive

    def _gone_now(self) -> None:
        """Teardown queue, once the agent is gone (however): every send not yet reported
        ends ``CANCELED`` here, one completion each (one the transport had finished but
        whose completion was still queued when the teardown began included)."""
        self._gone = True
        with self._lock:
            left = [t.element for t in self._out.values()]
        for e in left:
            self._complete(e, WcStatus.CANCELED)
        with self._lock:
            self._awaiting.drain()
            takers, self._takers = list(self._takers.values()), {}
        for taker in takers:  # sent, still waiting for the answer: it will not come
            taker(WcStatus.CANCELED, None)

    @property
    def hi_tid(self) -> int | None:
        """The TID high half the transport stamps on requests (``None`` if the kernel's)."""
        return self._agent_or_raise().hi_tid

    @property
    def outstanding(self) -> int:
        """Elements sent and not yet reported by ``send_cb``."""
        return len(self._out)

    def all_stats(self) -> dict[str, int]:
        """This service's counters plus the port transport's (shared by the port)."""
        merged = Counter(self.alias.transport_stats)
        merged.update(self.stats)
        return dict(merged)

    def _agent_or_raise(self) -> MadAgent:
        agent = self._agent
        if agent is None or self._gone or not agent.alive:
            raise InvalidHandle("the MAD service is deregistered")
        return agent

    # ------------------------------------------------------------------ sending
    def send(self, elements: MadElement | Iterable[MadElement]) -> None:
        """``ib_send_mad``: send each element; ``send_cb`` reports each once.

        Every element is checked before any goes out (``InvalidParameter``,
        ``InvalidSetting`` for an unsupported RMPP version).  A request whose TID
        low half is 0 gets one from the service; the transport writes the high
        half (shown in the element when the AL assigns it).  If the transport
        refuses one mid-list, the ones before it stay sent and the exception's
        ``mad_failure`` attribute is the first element not sent.
        """
        agent = self._agent_or_raise()
        items = [elements] if isinstance(elements, MadElement) else list(elements)
        if not items:
            raise InvalidParameter("no MAD elements to send")
        for e in items:
            check_element(e, self.svc)
        if len({id(e) for e in items}) != len(items):
            raise InvalidParameter("an element is listed twice")
        hi = agent.hi_tid
        for e in items:
            try:
                self._send_one(agent, e, hi)
            except IbError as exc:
                exc.mad_failure = e  # type: ignore[attr-defined]
                raise

    def _send_one(self, agent: MadAgent, e: MadElement, hi: int | None) -> None:
        waits = e.resp_expected and not e.is_response
        with self._lock:
            if not e.is_response:
                if hi is not None:
                    e.mad[8:12] = hi.to_bytes(4, "big")
                if int.from_bytes(e.mad[TID_LO], "big") == 0:
                    e.mad[TID_LO] = self._awaiting.fresh_tid().to_bytes(4, "big")
            low = int.from_bytes(e.mad[TID_LO], "big")
            if e.rmpp_version and self.rmpp is None and not self.transport_rmpp:
                raise Unsupported(
                    "RMPP transfers need ibal.transport.rmpp sessions (service.rmpp is not set)"
                )
            if (e.rmpp_version and not self.transport_rmpp and self.alias.segments_rmpp
                    and self.svc.mgmt_class not in RMPP_CLASSES):
                # The kernel's MAD layer drops a response no send of ours waits for unless
                # its class is an RMPP one: our own sessions' ACKs would never arrive.
                raise Unsupported(f"the kernel's MAD layer runs RMPP for the RMPP classes "
                                  f"only, not 0x{self.svc.mgmt_class:02x}")
            if waits:
                self._awaiting.add(e, low)  # InvalidParameter: that TID is outstanding
            e.state = ElementState.SENDING
            e.status = WcStatus.SUCCESS
            token = _Sending(e)
            self._out[id(e)] = token
        assert e.addr is not None
        if e.rmpp_version and self.transport_rmpp:
            # The transport segments: version 1, DATA, Active; it fills the rest per segment.
            e.mad[24:36] = bytes([RMPP_VERSION, RmppType.DATA, RmppFlags.ACTIVE]) + bytes(9)
        elif e.rmpp_version and self.rmpp is not None:
            addr = e.addr
            key = (addr.dlid, addr.remote_qp, bytes(e.mad[8:16]))
            if waits:
                # The answer may follow the final ACK at once: the transport must already
                # wait for it (re-armed with the element's own time-out when the transfer ends).
                agent.expect(self._wait_for(e, token, RMPP_TRANSFER_BOUND_MS))
            self.rmpp.start(key, e, lambda m: self._raw_send(m, addr))
            return
        retries = 0 if self.svc.svc_type is MadSvcType.RAW else e.retry_cnt
        send = MadSend(bytes(e.mad), e.addr, e.timeout_ms if waits else 0, retries, context=token)
        try:
            agent.send(send)
        except BaseException:
            with self._lock:
                self._out.pop(id(e), None)
                if waits:
                    self._awaiting.end(low, e)
                e.state = ElementState.USER
            raise

    @staticmethod
    def _wait_for(e: MadElement, token: _Sending, extra_ms: int = 0) -> MadSend:
        assert e.addr is not None
        wait = e.timeout_ms * (1 + e.retry_cnt) + extra_ms
        return MadSend(bytes(e.mad[:MAD_SIZE]), e.addr, wait, 0, context=token)

    def send_datagram(self, mad: bytes, addr: MadAddr) -> None:
        """Send one MAD of this service that waits for nothing (no element, no ``send_cb``,
        no retry): for classes that match and retry their messages themselves (the CM).

        ``mad`` is the whole 256-byte MAD, its TID as the caller formed it (the
        transport still writes the high half of a request's).  ``InvalidParameter`` for
        another class or version, or what the transport refuses."""
        agent = self._agent_or_raise()
        if mad[1] != self.svc.mgmt_class or mad[2] != self.svc.mgmt_version:
            raise InvalidParameter("the MAD is not of this service's class and version")
        agent.send(MadSend(mad, addr, context=_INTERNAL, quiet=True))

    def send_taken(self, element: MadElement, taker: Taker) -> None:
        """Send a request whose outcome goes to ``taker(status, response)`` (once, on the
        misc queue) instead of the service's callbacks: the base of :func:`transact`."""
        if not isinstance(element, MadElement) or element.is_response:
            raise InvalidParameter("only a request has an outcome to take")
        element.resp_expected = True
        with self._lock:
            self._takers[id(element)] = taker
        try:
            self.send(element)
        except BaseException:
            with self._lock:
                self._takers.pop(id(element), None)
            raise

    def cancel(self, element: MadElement) -> None:
        """``ib_cancel_mad``: stop a pending send; ``send_cb`` reports it ``CANCELED``.

        ``NotFound`` when the element is not being sent by this service (never
        sent, or its completion is already on its way).
        """
        agent = self._agent_or_raise()
        if not isinstance(element, MadElement):
            raise InvalidParameter("cancel takes a MadElement")
        taker: Taker | None = None
        with self._lock:
            token = self._out.get(id(element))
            if token is None or token.element is not element:
                low = int.from_bytes(element.mad[TID_LO], "big")
                if id(element) not in self._takers or self._awaiting.end(low, element) is None:
                    raise NotFound("the MAD element is not pending on this service")
                taker = self._takers.pop(id(element))
        if taker is not None:
            # Its send is reported but its answer never reached it (the kernel's MAD layer
            # matched a response this service then dropped): without this, transact's own
            # time-out would cancel into nothing and wait forever.
            agent.defer(taker, WcStatus.CANCELED, None)
            return
        try:
            agent.cancel(token)  # its CANCELED completion comes through _on_send_done
        except NotFound:
            if not (element.rmpp_version and self.rmpp is not None):
                raise
            # Segments of the service's own RMPP: the transfer's end will come late.
            self._complete(element, WcStatus.CANCELED, queue=agent)
        except Unsupported:
            # The kernel owns the send: finish it here; its own completion is ignored.
            self._complete(element, WcStatus.CANCELED, queue=agent)

    # ------------------------------------------------------------------ completions
    def _on_send_done(self, done: MadSendDone) -> None:
        """Misc queue (teardown queue when deregistering): one transport completion."""
        token = done.context
        if isinstance(token, _Sending):
            self._complete(token.element, done.status, token=token)

    def _complete(
        self,
        e: MadElement,
        status: WcStatus,
        queue: MadAgent | None = None,
        token: _Sending | None = None,
    ) -> None:
        """End ``e``'s send once; a completion of an earlier send of it (``token``) or
        one that ended here already (canceled, answered) is counted and ignored."""
        with self._lock:
            cur = self._out.get(id(e))
            if cur is None or cur.element is not e or (token is not None and cur is not token):
                self.stats["late_completion"] += 1
                return
            del self._out[id(e)]
            low = int.from_bytes(e.mad[TID_LO], "big")
            if status is not WcStatus.SUCCESS:
                self._awaiting.end(low, e)
            e.status = status
            e.state = ElementState.USER
            taker = self._takers.get(id(e))
            if taker is not None and status is not WcStatus.SUCCESS:
                del self._takers[id(e)]
        if taker is not None:
            if status is not WcStatus.SUCCESS:
                if queue is not None:
                    queue.defer(taker, status, None)
                else:
                    taker(status, None)
            return  # SUCCESS: the response goes to the taker next
        cb = self.svc.send_cb
        if cb is not None:
            if queue is not None:
                queue.defer(cb, e)
            else:
                cb(e)

    def _on_recv(self, recv: MadRecv, whole: bool = False) -> None:
        """Misc queue: a MAD the transport routed to this service (``whole``: a message
        the RMPP sessions reassembled)."""
        mad = recv.mad
        if self.transport_rmpp and not whole and rmpp_active(mad, self.svc):
            reassembled = transport_message(mad)
            if reassembled is None:
                # Cut short (umad2sim carries the first segment only): delivered as it
                # came, RMPP header and all, so the client sees the transfer is incomplete.
                self.stats["rmpp_cut"] += 1
            else:
                mad = reassembled
            whole = True
        reason = malformed(mad, self.svc, whole)
        if reason:
            self.stats[reason] += 1
            if is_response(mad) and self._agent_or_raise().hi_tid is None:
                # The kernel's MAD layer matched it to our request (by TID and class
                # only) and ended the send: end the request too, or it waits for ever.
                with self._lock:
                    asked = self._awaiting.answer(int.from_bytes(mad[TID_LO], "big"), mad)
                if asked is not None:
                    self._end_unanswered(asked)
            return
        response = is_response(mad)
        if not whole and rmpp_active(mad, self.svc):
            self._rmpp_in(recv)
            return
        if not response and self.svc.support_unsol and unserved_attr(mad, self.svc):
            self._answer_unserved_attr(recv)
            return
        if not response and self.datagram_cb is not None:
            self.datagram_cb(mad, recv.addr)  # no element, nothing held: no backlog bound
            return
        request: MadElement | None = None
        with self._lock:
            if response:
                request = self._awaiting.answer(int.from_bytes(mad[TID_LO], "big"), mad)
                if request is None:
                    self.stats["dropped_unmatched_response"] += 1
                    return
            elif not self.svc.support_unsol:
                self.stats["dropped_unsolicited"] += 1
                return
            elif self._unsol_held >= self.svc.max_unsolicited:
                self.stats["dropped_backlog"] += 1
                return
            else:
                self._unsol_held += 1
        try:
            e = self.pool_key.get_mad(max(len(mad), MAD_SIZE))
        except IbError:
            self.stats["dropped_no_element"] += 1
            if not response:
                with self._lock:
                    self._unsol_held -= 1
            elif request is not None:
                self._end_unanswered(request)
            return
        e.mad[:] = mad  # a reassembled message keeps its exact length, even under 256 bytes
        e.addr = recv.addr
        e.port_num, e.qp_num = recv.port_num, recv.qp_num
        if request is not None:
            with self._lock:
                unfinished = id(request) in self._out
            if unfinished:  # the answer proves the send (a provider may report it later)
                self._complete(request, WcStatus.SUCCESS)
            e.request = request
            e.send_context1, e.send_context2 = request.context1, request.context2
            with self._lock:
                taker = self._takers.pop(id(request), None)
            if taker is not None:
                taker(WcStatus.SUCCESS, e)
                return
        else:
            e.on_put = self._unsol_returned
        self.svc.recv_cb(e)

    def _end_unanswered(self, request: MadElement) -> None:
        """``request``'s answer came and ended the transport's wait, but cannot be handed
        over: end the request with an error rather than leave it waiting."""
        with self._lock:
            unfinished = id(request) in self._out
            taker = None if unfinished else self._takers.pop(id(request), None)
        if unfinished:
            self._complete(request, WcStatus.GENERAL_ERR)
        elif taker is not None:  # its send was reported; its taker waits
            request.status = WcStatus.GENERAL_ERR
            taker(WcStatus.GENERAL_ERR, None)
        else:  # reported to send_cb already: its recv_cb never comes
            self.stats["answer_lost"] += 1

    def _unsol_returned(self, _e: MadElement) -> None:
        with self._lock:
            self._unsol_held -= 1

    # ------------------------------------------------------------------ RMPP seam
    def rmpp_send_done(self, element: MadElement, status: WcStatus, answered: bool = False
                       ) -> None:
        """The RMPP sessions report a transfer's end (``send_cb`` follows, on the misc queue);
        ``answered``: the answer's own transfer has begun (double-sided RMPP)."""
        agent = self._agent_or_raise()
        with self._lock:
            token = self._out.get(id(element))
            low = int.from_bytes(element.mad[TID_LO], "big")
            waits = token is not None and self._awaiting.get(low) is element
        if status is WcStatus.SUCCESS and waits and not answered and token is not None:
            try:  # the wait for the answer starts now, with the element's own time-out
                agent.expect(self._wait_for(element, token))
                return
            except IbError:
                pass  # it ended meanwhile (answered or canceled)
        if waits and token is not None and status is not WcStatus.SUCCESS:
            with contextlib.suppress(IbError):
                agent.cancel(token)  # the transport's wait ends too; its CANCELED is late
        self._complete(element, status, queue=agent)

    def rmpp_message_in(self, mad: bytes, addr: MadAddr) -> None:
        """The RMPP sessions deliver a reassembled message (as if one MAD had arrived)."""
        self._agent_or_raise().defer(
            self._on_recv, MadRecv(bytes(mad), addr, self.alias.port_num, self.alias.num), True
        )

    def _rmpp_in(self, recv: MadRecv) -> None:
        sessions = self.rmpp
        if sessions is None:
            self.stats["dropped_rmpp_unsupported"] += 1
            return
        key = (recv.addr.dlid, recv.addr.remote_qp, bytes(recv.mad[8:16]))
        if not sessions.feed(key, recv.mad, recv.addr, lambda m: self._raw_send(m, recv.addr)):
            self.stats["dropped_rmpp_unclaimed"] += 1

    def _raw_send(self, mad: bytes, addr: MadAddr) -> None:
        agent = self._agent
        if agent is not None:
            agent.send(MadSend(mad, addr, context=_INTERNAL, quiet=True))

    def _answer_unserved_attr(self, recv: MadRecv) -> None:
        reply = mad_error_reply(recv.mad, MadStatus.METHOD_ATTR_UNSUPPORTED)
        agent = self._agent
        if reply is None or agent is None:
            self.stats["dropped_unserved_attr"] += 1
            return
        try:
            agent.send(MadSend(reply, recv.addr, context=_INTERNAL, quiet=True))
        except IbError:
            self.stats["dropped_unserved_attr"] += 1
            return
        self.stats["answered_0x000c"] += 1

    # ------------------------------------------------------------------ teardown
    def deregister(
        self,
        destroy_cb: Callable[[Any], object] | object | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """End the service (asynchronous): pending sends complete ``CANCELED``, then
        ``destroy_cb(svc.context)`` (teardown queue); ``wait=True`` blocks until then.
        ``InvalidHandle`` if already deregistered."""
        agent = self._agent_or_raise()
        sync = wait or destroy_cb is SYNC_DESTROY
        user_cb = None if destroy_cb is SYNC_DESTROY or destroy_cb is None else destroy_cb
        if user_cb is not None and not callable(user_cb):
            raise InvalidParameter("destroy_cb must be callable (or SYNC_DESTROY)")
        self._gone = True

        def finished(_ctx: Any) -> None:
            # Teardown queue, after _gone_now ended whatever the transport had not reported.
            if user_cb is not None:
                user_cb(self.svc.context)

        agent.deregister(finished, wait=sync, timeout=timeout)


_LAST = int(RmppFlags.LAST)  # a plain int: IntFlag arithmetic costs per MAD


def transport_message(mad: bytes) -> bytes | None:
    """A message the transport reassembled, as the service's own sessions deliver one
    (exact length, RMPP header area zero); ``None`` when it is only a first segment.

    The transport hands over the first segment's header.  A message of one segment
    has the Last flag and its PayloadLength gives the exact length (a provider pads
    a short one to 256 bytes); a longer one arrives longer than a MAD.  A shorter
    one without the Last flag is a sender's whole message in one MAD that no RMPP
    layer touched (umad2sim passes OpenSM's one-MAD answers at their length).
    Anything else (256 bytes, no Last flag) is the first segment of a transfer the
    transport did not carry (umad2sim).
    """
    h = RmppHeader.of(mad)
    if h.flags & _LAST:
        end = RMPP_DATA + h.payload_length if h.payload_length else len(mad)
    elif len(mad) != MAD_SIZE:
        end = len(mad)
    else:
        return None
    return bytes(mad[:24]) + bytes(12) + bytes(mad[RMPP_DATA : min(end, len(mad))])


def reg_mad_svc(
    alias: AliasQp, svc: MadSvc, pool_key: PoolKey | None = None, *, inline: bool = False,
    datagram_cb: DatagramCb | None = None,
) -> MadService:
    """``ib_reg_mad_svc``: register ``svc`` on a QP0/QP1 alias.

    Received MADs are elements of ``pool_key`` (a private unbounded pool when
    ``None``); the user gives them back with :func:`~ibal.mad.put_mad`.
    ``inline=True``: ``send_cb``/``recv_cb`` run on the thread that reports the
    MAD to the AL instead of the misc queue (``AliasQp.register_agent``'s
    ``inline``: they must not block, nor wait for this AL's objects).
    ``datagram_cb(mad, addr)`` (an ibal extension) takes ``recv_cb``'s place for
    unsolicited requests that passed the service's checks: the MAD's bytes, no
    element to give back, for a client that reads them at once (the CM);
    responses still come as elements.
    ``InvalidParameter`` for a bad QP or description, ``ResourceBusy`` when
    another client of the port already serves one of the methods.
    """
    if not isinstance(alias, AliasQp) or not alias.alive:
        raise InvalidParameter("a MAD service lives on a live QP0/QP1 alias QP")
    check_svc(svc, alias.num)
    if pool_key is None:
        pool_key = MadPool(None, 0, 0, 64).register(alias.pd)
    elif not isinstance(pool_key, PoolKey):
        raise InvalidParameter("pool_key must be a PoolKey")
    if datagram_cb is not None and not callable(datagram_cb):
        raise InvalidParameter("datagram_cb must be callable")
    service = MadService(alias, svc, pool_key, datagram_cb)
    # Where the transport runs RMPP (the kernel's MAD layer), a service that does RMPP
    # lets it: the kernel drops RMPP segments and ACKs of an agent registered without.
    does_rmpp = svc.svc_type is not MadSvcType.RAW and svc.mgmt_class in RMPP_CLASSES
    agent = alias.register_agent(
        svc.mgmt_class,
        svc.mgmt_version,
        recv_cb=service._on_recv,
        send_cb=service._on_send_done,
        methods=svc.methods if svc.support_unsol else (),
        rmpp_version=1 if does_rmpp and alias.segments_rmpp else 0,
        context=svc.context,
        oui=svc.oui,
        inline=inline,
    )
    service._attach(agent)
    return service


def local_mad(ca: Ca, port_num: int, element: MadElement) -> MadElement:
    """``ib_local_mad`` with elements: the CA's own answer to ``element`` (no wire).

    The answer is an element of the request's pool key, linked to it as a
    response received from the fabric would be (``request``, ``send_context*``).
    ``InvalidPort``/``InvalidParameter`` as :meth:`Ca.local_mad`;
    ``Unsupported`` where the provider has no local MAD path.
    """
    if not isinstance(element, MadElement) or element.state is not ElementState.USER:
        raise InvalidParameter("local_mad takes a MadElement the caller holds")
    answer = ca.local_mad(port_num, bytes(element.mad[:MAD_SIZE]))
    resp = element.pool_key.get_mad(len(answer))
    resp.mad[:] = answer
    resp.request = element
    resp.send_context1, resp.send_context2 = element.context1, element.context2
    resp.port_num = port_num
    return resp
