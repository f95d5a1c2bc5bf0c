"""Alias QPs and MAD agents: MAD clients sharing one port's QP0/QP1 (IBAL ``al_qp_alias``).

``pd.get_spl_qp(port_guid, QpCreate(QpType.QP1_ALIAS, ...))`` returns an
:class:`AliasQp`; several may exist on a port, over the one real QP the
port's :mod:`~ibal.al.mad_port` transport owns (created with the first alias,
destroyed with the last).  Each alias registers :class:`MadAgent` s that send
MADs and receive those of their class, version and methods plus the
responses to their requests.  Both are dependent objects: destroying the PD,
closing the CA or the AL, or the CA going away destroys them; a MAD agent's
unfinished sends then complete with ``CANCELED`` before its destroy
callback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ibal.al import mad_port
from ibal.al.dispatcher import call_user
from ibal.al.obj import CaObject, DestroyCallback, SyncDestroy
from ibal.status import InvalidHandle, InvalidParameter, InvalidQpHandle, NotFound, Unsupported
from ibal.types import (
    MadAgentSpec,
    MadRecv,
    MadRecvCallback,
    MadSend,
    MadSendCallback,
    MadSendDone,
    QpType,
    WcStatus,
)

if TYPE_CHECKING:
    from ibal.al.pd import Pd


class AliasQp(CaObject):
    """A QP0/QP1 alias: a handle on the port's shared special QP for MAD clients."""

    _invalid = InvalidQpHandle
    _rank = 20
    _kind = "QP"
    _always_cleanup = True

    def __init__(self, pd: Pd, qp_type: QpType, port_num: int, context: Any) -> None:
        super().__init__(pd, context)
        self._pd = pd
        self._qp_type = qp_type
        self._port_num = port_num
        self._transport: mad_port.MadTransport | None = None

    def _open(self) -> None:
        """The ``make`` step of creation: join (or create) the port's transport."""
        qpn = 0 if self._qp_type is QpType.QP0_ALIAS else 1
        self._transport = mad_port.acquire(self._cica, self._port_num, qpn)
        self._h = self._transport

    @property
    def qp_type(self) -> QpType:
        return self._qp_type

    @property
    def num(self) -> int:
        """0 or 1: the QP this alias stands for."""
        return 0 if self._qp_type is QpType.QP0_ALIAS else 1

    @property
    def port_num(self) -> int:
        return self._port_num

    @property
    def pd(self) -> Pd:
        return self._pd

    @property
    def segments_rmpp(self) -> bool:
        """Whether agents registered with ``rmpp_version`` get RMPP from the port's
        transport (the kernel's MAD layer on libibumad; never the AL's special QPs)."""
        self._check()
        assert self._transport is not None
        return self._transport.segments_rmpp

    @property
    def transport_stats(self) -> dict[str, int]:
        """The port transport's counters: MADs dropped, by reason, and sends that waited for
        a slot (``sends_queued``); shared by every alias of the port."""
        self._check()
        assert self._transport is not None
        return dict(self._transport.stats)

    def register_agent(
        self,
        mgmt_class: int,
        class_version: int,
        *,
        recv_cb: MadRecvCallback,
        send_cb: MadSendCallback | None = None,
        methods: Iterable[int] = (),
        rmpp_version: int = 0,
        context: Any = None,
        inline: bool = False,
        oui: int = 0,
        recv_batch_cb: Callable[[Sequence[MadRecv]], object] | None = None,
    ) -> MadAgent:
        """A MAD client of this alias's QP on its port.

        ``recv_cb(MadRecv)`` gets requests of ``mgmt_class``/``class_version``
        whose method is in ``methods``, and responses to this agent's requests;
        ``send_cb(MadSendDone)`` one completion per :meth:`MadAgent.send`.
        Both run on the misc queue (``CANCELED`` ones on the teardown queue,
        right before the agent's destroy callback).  ``ResourceBusy`` if another agent of the
        port already serves one of the methods.  ``oui``: the vendor whose
        requests of a vendor range 2 class (0x30..0x4F) reach the agent (the
        class header's OUI; 0 for OpenIB's 00:14:05, libibumad's default).

        ``inline=True`` runs both on the thread that reports the MAD to the AL
        instead (the provider's own thread where it runs MAD agents, the
        completion queue on the AL's special-QP transport; IBAL's MAD callbacks
        run in a DPC the same way): one thread
        crossing less per MAD, for clients whose callbacks only hand the MAD
        on (queue it, set a flag).  Such callbacks must not block, must not
        wait for this AL's objects, and may run concurrently with the caller's
        :meth:`MadAgent.send`; :meth:`MadAgent.cancel`'s ``CANCELED`` and
        :meth:`MadAgent.defer` still go through the misc queue.

        ``recv_batch_cb`` (with ``inline`` only) takes ``recv_cb``'s place: it gets
        the received MADs as a sequence, several at once where the provider reads
        them together (in arrival order), so a client can act once per batch
        (send the next window of requests, say).
        """
        self._check()
        try:
            meths = frozenset(methods)
        except TypeError:
            raise InvalidParameter("methods must be an iterable of ints") from None
        if rmpp_version not in (0, 1):
            raise InvalidParameter(f"RMPP version {rmpp_version!r} (0 or 1)")
        if recv_batch_cb is not None and (not inline or not callable(recv_batch_cb)):
            raise InvalidParameter("recv_batch_cb is a callable, for inline agents only")
        agent = MadAgent(self, recv_cb, send_cb, context, rmpp_version)
        agent._recv_batch_cb = recv_batch_cb
        spec = MadAgentSpec(
            port_num=self._port_num,
            qp_num=self.num,
            mgmt_class=mgmt_class,
            class_version=class_version,
            recv_cb=agent._inline_recv if inline else agent._queue_recv,
            # inline with no send_cb: none at all, so the provider skips the upcall per send
            send_cb=(agent._inline_send_done if send_cb is not None else None)
            if inline
            else agent._queue_send_done,
            methods=meths,
            rmpp_version=rmpp_version,
            oui=oui,
            recv_batch_cb=agent._inline_recv_batch if recv_batch_cb is not None else None,
            send_cb_any_thread=not inline,
        )
        mad_port.check_agent_spec(spec)
        if not callable(recv_cb) or (send_cb is not None and not callable(send_cb)):
            raise InvalidParameter("recv_cb and send_cb must be callable")
        transport = self._transport
        assert transport is not None

        def make() -> None:
            agent._key = transport.register(spec)
            agent._transport = transport
            agent._h = agent._key

        return self._spawn(agent, make)

    def destroy(
        self,
        destroy_cb: DestroyCallback | SyncDestroy | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """``ib_destroy_qp`` on an alias: its agents go first; the last alias frees the QP."""
        self._destroy(destroy_cb, wait, timeout)

    def _cleanup(self) -> None:
        t, self._transport = self._transport, None
        if t is not None:
            mad_port.release(t)


class MadAgent(CaObject):
    """One MAD client registered on an alias QP (the transport-level half of a MAD service)."""

    _invalid = InvalidHandle
    _rank = 10
    _kind = "MAD agent"
    _always_cleanup = True

    def __init__(
        self,
        alias: AliasQp,
        recv_cb: MadRecvCallback,
        send_cb: MadSendCallback | None,
        context: Any,
        rmpp_version: int = 0,
    ) -> None:
        super().__init__(alias, context)
        self._alias = alias
        self.rmpp_version = rmpp_version
        """Non-zero: the transport runs RMPP for this agent (long messages both ways)."""
        self._recv_cb = recv_cb
        self._send_cb = send_cb
        self._key: Any = None
        self._transport: mad_port.MadTransport | None = None
        self._recv_batch_cb: Callable[[Sequence[MadRecv]], object] | None = None
        self._flushed: list[MadSendDone] = []
        self._flushing = False
        self._gone_hook: Callable[[], object] | None = None

    @property
    def alias(self) -> AliasQp:
        return self._alias

    @property
    def hi_tid(self) -> int | None:
        """The TID high 32 bits stamped on this agent's requests, when the AL assigns them
        (special-QP transports); ``None`` where the kernel does (libibumad)."""
        t = self._transport
        return t.hi_tid(self._key) if t is not None else None

    def send(self, send: MadSend) -> None:
        """Queue one MAD; ``send_cb`` reports it.  ``InvalidParameter`` for a MAD that is
        not 256 bytes (an RMPP agent's active RMPP message may be longer) or bad addressing,
        ``InsufficientResources`` when the port's queue is full."""
        mad_port.check_mad_send(send, rmpp=bool(self.rmpp_version))
        self._use()
        try:
            assert self._transport is not None
            self._transport.send(self._key, send)
        finally:
            self._unuse()

    def send_many(self, sends: Sequence[MadSend]) -> int:
        """Queue several MADs in order, each as :meth:`send` would; one call into the
        provider for all where it offers that.  Every one is checked first
        (``InvalidParameter``: none sent).  Returns how many were queued: fewer than
        ``len(sends)`` when the port could not take more (call again with the rest);
        raises :meth:`send`'s errors only when the first could not be queued."""
        rmpp = bool(self.rmpp_version)
        for send in sends:
            mad_port.check_mad_send(send, rmpp=rmpp)
        if not sends:
            return 0
        self._use()
        try:
            assert self._transport is not None
            return self._transport.send_many(self._key, sends)
        finally:
            self._unuse()

    def expect(self, send: MadSend) -> None:
        """Wait for the answer to a request this agent sends as RMPP segments itself
        (``send``: the request's first 256 bytes, address, ``timeout_ms`` > 0, context).

        ``send_cb`` then reports ``send.context`` once: ``SUCCESS`` before the answer's
        ``recv_cb`` (ACKs of the transfer do not count), or ``TIMEOUT_RETRY_ERR``.  Called
        again with the same context it re-arms the wait.  ``Unsupported`` where the
        transport runs RMPP itself (:attr:`AliasQp.segments_rmpp`).
        """
        mad_port.check_mad_send(send, rmpp=True)
        if send.timeout_ms <= 0:
            raise InvalidParameter("a response wait needs timeout_ms > 0")
        self._use()
        try:
            assert self._transport is not None
            done = self._transport.expect(self._key, send)
        finally:
            self._unuse()
        if done is None:
            raise Unsupported("this port's MAD transport waits for RMPP answers itself")

    def cancel(self, context: Any) -> None:
        """Stop the unfinished send whose ``MadSend.context`` is ``context``.

        Its ``send_cb`` then reports ``CANCELED`` (on the misc queue) and no other
        completion or response of it follows.  ``NotFound`` when no such send is
        pending (it already completed); ``Unsupported`` where the provider cannot
        stop a send (libibumad: the kernel owns the retries).
        """
        self._use()
        try:
            assert self._transport is not None
            found = self._transport.cancel(self._key, context)
        finally:
            self._unuse()
        if found is None:
            raise Unsupported("this port's MAD transport cannot cancel a send")
        if not found:
            raise NotFound("no such MAD send is pending")
        self._queue_send_done(MadSendDone(context, WcStatus.CANCELED))

    def on_gone(self, fn: Callable[[], object]) -> None:
        """For the layer above (the MAD service): ``fn()`` runs once on the teardown queue
        when the agent is gone, however it went (deregistered, or its alias, PD, CA or AL
        destroyed), after its ``CANCELED`` completions and before its destroy callback.
        A completion still queued then is not delivered: ``fn`` accounts for it."""
        self._gone_hook = fn

    def defer(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the misc queue, where this agent's callbacks run (so an
        upper layer's own completions keep their order with the agent's)."""
        self._check()
        self._mgr.queues.misc.post(call_user, fn, *args)

    def deregister(
        self,
        destroy_cb: DestroyCallback | SyncDestroy | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """End the agent (asynchronous); unfinished sends complete ``CANCELED`` first."""
        self._destroy(destroy_cb, wait, timeout)

    # ------------------------------------------------------------------ upcalls
    def _queue_recv(self, recv: MadRecv) -> None:
        self._mgr.queues.misc.post(self._run_recv, recv)

    def _queue_send_done(self, done: MadSendDone) -> None:
        if self._flushing:  # the cleanup's own unregister: it posts these itself
            self._flushed.append(done)
            return
        self._mgr.queues.misc.post(self._run_send_done, done)

    # Inline delivery: on the provider's thread, so a destroy the callback's reference
    # held up finishes on the teardown queue (not inside the provider's upcall).
    def _inline_recv(self, recv: MadRecv) -> None:
        if not self._enter():
            return
        try:
            if self._recv_batch_cb is not None:
                call_user(self._recv_batch_cb, (recv,))
            else:
                call_user(self._recv_cb, recv)
        finally:
            self._leave_inline()

    def _inline_recv_batch(self, recvs: Sequence[MadRecv]) -> None:
        cb = self._recv_batch_cb
        if cb is None or not self._enter():
            return
        try:
            call_user(cb, recvs)
        finally:
            self._leave_inline()

    def _inline_send_done(self, done: MadSendDone) -> None:
        if self._flushing:  # the cleanup's own unregister: it posts these itself
            self._flushed.append(done)
            return
        if self._send_cb is None or not self._enter():
            return
        try:
            call_user(self._send_cb, done)
        finally:
            self._leave_inline()

    def _run_recv(self, recv: MadRecv) -> None:
        if not self._enter():
            return
        try:
            call_user(self._recv_cb, recv)
        finally:
            self._leave()

    def _run_send_done(self, done: MadSendDone) -> None:
        if self._send_cb is None or not self._enter():
            return
        try:
            call_user(self._send_cb, done)
        finally:
            self._leave()

    def _cleanup(self) -> None:
        t, self._transport = self._transport, None
        if t is not None:
            self._flushing = True
            try:
                t.unregister(self._key)
            finally:
                self._flushing = False
        cb = self._send_cb
        if cb is not None:
            # On the teardown queue, where ``_finish`` (or the parent's) queues the
            # destroy callback after this: so the cancellations come first.
            for done in self._flushed:
                self._mgr.queues.teardown.post(call_user, cb, done)
        hook, self._gone_hook = self._gone_hook, None
        if hook is not None:
            self._mgr.queues.teardown.post(call_user, hook)
        self._flushed.clear()
