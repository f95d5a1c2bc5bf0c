"""One port's MAD transport: QP0 or QP1 shared by every MAD client of the port.

IBAL multiplexes all alias QPs and MAD services of a port over the one QP1
(and QP0) the access layer owns.  Which QP that is depends on the provider:

* providers that expose special QPs (``Capabilities.special_qps``, the mock,
  later the userspace RoCE provider): :class:`SplQpTransport` creates the real
  QP0/QP1 once through ``create_spl_qp``, keeps receives posted and routes
  what arrives: responses by the high 32 bits of the TID (the agent id the
  transport stamped into the request), requests by (class, class version,
  method).  Unclaimed or malformed MADs are dropped and counted in ``stats``.
* providers whose kernel owns QP0/QP1 (``Capabilities.mad_agents``, rdma-core
  through libibumad): :class:`AgentTransport` hands each agent to the
  provider's ``register_mad_agent``; the kernel routes.

Either way upper layers see one interface, :meth:`MadTransport.register`,
chosen by the port (:func:`acquire`), never by the caller.  Agent callbacks
(``MadAgentSpec.recv_cb``/``send_cb``) are called on any thread and must only
queue: the AL's :class:`~ibal.al.alias.MadAgent` posts them to the dispatcher.
"""

from __future__ import annotations

import abc
import itertools
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ibal.al.dispatcher import log
from ibal.al.mad_sends import SendCqContext, SendRing
from ibal.al.mr import pin_buffer
from ibal.al.timer import Timer
from ibal.ci.interface import ChannelInterface
from ibal.status import (
    IbError,
    InsufficientResources,
    InvalidHandle,
    InvalidParameter,
    InvalidPort,
    ResourceBusy,
    Unsupported,
)
from ibal.types import (
    MAD_SIZE,
    MAD_STATUS_BAD_VERSION,
    MAD_STATUS_UNSUPPORTED_METHOD,
    QP1_WELL_KNOWN_QKEY,
    AccessFlags,
    Gid,
    Grh,
    MadAddr,
    MadAgentSpec,
    MadRecv,
    MadSend,
    MadSendDone,
    NetworkHeader,
    PdType,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    RecvOpt,
    RecvWr,
    Sge,
    Wc,
    WcStatus,
    is_int,
    mad_error_reply,
    mad_is_response,
    mad_vendor_oui,
)
from ibal.wire.mad.tid import Pending

if TYPE_CHECKING:
    from ibal.al.cica import CiCa

GRH_LEN = 40
SM_CLASSES = frozenset({0x01, 0x81})
"""Subnet management classes: QP0 only (every other class lives on QP1)."""
_SLOT = GRH_LEN + MAD_SIZE
_RECV_DEPTH = 512  # IB_MAD_QP_RECV_SIZE: a burst of CM REQs (cmtime -c 100) must not overrun it
_SEND_DEPTH = 64
_AGENT_IDS = itertools.count(1)


def check_mad_send(send: object, rmpp: bool = False) -> MadSend:
    """``send`` as a valid :class:`MadSend`, else ``InvalidParameter``.

    ``rmpp``: the agent's transport runs RMPP, so an RMPP-active message may be
    longer than one MAD (the transport segments it)."""
    if not isinstance(send, MadSend):
        raise InvalidParameter("a MadSend is required")
    mad = send.mad
    if type(mad) is not bytes or len(mad) != MAD_SIZE:  # the common case costs one test
        _check_mad(mad, rmpp)
    addr = send.addr
    if _checked.get(id(addr)) is not addr:
        _check_addr(addr)
    timeout, retries = send.timeout_ms, send.retries
    if (type(timeout) is not int or type(retries) is not int) and not (
        is_int(timeout) and is_int(retries)
    ):
        raise InvalidParameter("timeout_ms and retries are ints")
    if timeout < 0 or retries < 0:
        raise InvalidParameter("timeout_ms and retries are non-negative")
    if send.quiet and timeout:
        raise InvalidParameter("a quiet send waits for no response (timeout_ms 0)")
    return send


def _check_mad(mad: object, rmpp: bool) -> None:
    if not isinstance(mad, (bytes, bytearray, memoryview)) or len(mad) < MAD_SIZE:
        raise InvalidParameter(f"a MAD is {MAD_SIZE} bytes")
    if len(mad) != MAD_SIZE and not (rmpp and _rmpp_active(bytes(mad[:MAD_SIZE]))):
        raise InvalidParameter(
            f"a MAD is {MAD_SIZE} bytes (longer only as an active RMPP message of an agent "
            "registered with rmpp_version on a transport that segments)"
        )


# Addresses that passed the check, by identity (MadAddr is frozen; the entry holds it,
# so its id is not reused): a sweep sends thousands of MADs to one address object.
_checked: dict[int, MadAddr] = {}


def _check_addr(addr: object) -> None:
    if not isinstance(addr, MadAddr):
        raise InvalidParameter("MadSend.addr must be a MadAddr")
    fields = (addr.remote_qp, addr.remote_qkey, addr.dlid, addr.sl, addr.path_bits,
              addr.pkey_index)
    if any(not is_int(v) or v < 0 for v in fields):
        raise InvalidParameter("MAD addressing fields are non-negative ints")
    if addr.remote_qp > 0xFFFFFF or addr.dlid > 0xFFFF or addr.sl > 15:
        raise InvalidParameter("remote QP, DLID or SL out of range")
    if addr.grh is not None and not isinstance(addr.grh, Grh):
        raise InvalidParameter("MadAddr.grh must be a Grh")
    if len(_checked) >= 1024:
        _checked.clear()
    _checked[id(addr)] = addr


def check_agent_spec(spec: MadAgentSpec) -> None:
    """Range checks shared by both transports."""
    if spec.qp_num not in (0, 1):
        raise InvalidParameter("MAD agents live on QP0 or QP1")
    if not is_int(spec.mgmt_class) or not 0 <= spec.mgmt_class <= 0xFF:
        raise InvalidParameter(f"management class {spec.mgmt_class!r} out of range")
    if not is_int(spec.class_version) or not 0 <= spec.class_version <= 0xFF:
        raise InvalidParameter(f"class version {spec.class_version!r} out of range")
    if not is_int(spec.oui) or not 0 <= spec.oui <= 0xFFFFFF:
        raise InvalidParameter(f"OUI {spec.oui!r} out of range (24 bits)")
    if spec.oui and not spec.vendor_oui:
        raise InvalidParameter(
            f"class 0x{spec.mgmt_class:02x} has no OUI (vendor range 2 only: 0x30..0x4f)"
        )
    for m in spec.methods:
        if not is_int(m) or not 0 <= m < 0x80:
            raise InvalidParameter(f"method {m!r} is not a request method (0..0x7f)")
    if not callable(spec.recv_cb) or (spec.send_cb is not None and not callable(spec.send_cb)):
        raise InvalidParameter("recv_cb and send_cb must be callable")


class MadTransport(abc.ABC):
    """A port's QP0 or QP1 as the access layer uses it, whoever owns the real QP."""

    def __init__(self, cica: CiCa, port_num: int, qp_num: int) -> None:
        self.cica = cica
        self.port_num = port_num
        self.qp_num = qp_num
        self.users = 0
        self.stats: Counter[str] = Counter()
        """Received MADs dropped, by reason (``dropped_short``, ``dropped_unclaimed``, ...)."""

    @abc.abstractmethod
    def open(self) -> None:
        """Create what the transport needs at the provider (first user)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Destroy it again (last user gone)."""

    @abc.abstractmethod
    def register(self, spec: MadAgentSpec) -> Any:
        """Add an agent; returns its key for :meth:`send` and :meth:`unregister`."""

    @abc.abstractmethod
    def send(self, key: Any, send: MadSend) -> None:
        """Send one (checked) MAD for the agent ``key``."""

    def send_many(self, key: Any, sends: Sequence[MadSend]) -> int:
        """Queue ``sends`` in order: how many were queued (stops at the first that could
        not be; raises only when that is the first)."""
        for n, send in enumerate(sends):
            try:
                self.send(key, send)
            except IbError:
                if n == 0:
                    raise
                return n
        return len(sends)

    @abc.abstractmethod
    def unregister(self, key: Any) -> None:
        """Remove the agent; its unfinished sends complete with ``CANCELED``."""

    segments_rmpp = False
    """Whether an agent registered with ``rmpp_version`` gets RMPP from this transport."""

    def hi_tid(self, key: Any) -> int | None:
        """The TID high 32 bits this transport stamps on the agent's requests, if known."""
        return None

    def expect(self, key: Any, send: MadSend) -> bool | None:
        """Wait for the response to a request that goes out another way (an RMPP transfer's
        segments), as if ``send`` had been sent: its completion comes with the response or
        after ``send.timeout_ms``.  Again for the same TID: re-arm the wait.  ``None``:
        this transport does not (the kernel's MAD layer runs RMPP itself)."""
        return None

    def cancel(self, key: Any, context: Any) -> bool | None:
        """Forget the agent's unfinished send whose context is ``context``, without a callback.

        ``True``: it was pending and no completion of it will follow; ``False``:
        no such send is pending; ``None``: this transport cannot stop sends.
        """
        return None


# ---------------------------------------------------------------- special QPs


@dataclass(eq=False)
class _SplAgent:
    spec: MadAgentSpec
    agent_id: int
    pending: Pending[_Out] = field(init=False)
    """Its sends by TID low 32 bits (the high half routed the answer here), or a serial."""

    def __post_init__(self) -> None:
        self.pending = Pending(self.spec.mgmt_class, tid_bits=32)


@dataclass(eq=False)
class _Out:
    """One send until its ``MadSendDone``: on the wire, then maybe awaiting its response."""

    agent: _SplAgent
    mad: bytes
    send: MadSend
    key: int = 0
    """Its key in ``agent.pending``; the entry is gone once the send has ended."""
    expect: bool = False
    """Only the response wait (the request left as RMPP segments of the agent's own)."""
    on_wire: int = 0
    timer: Timer | None = None
    queued: bool = False
    """In the backlog, waiting for a send slot."""


_Reports = list[tuple[_Out, WcStatus]]


class SplQpTransport(MadTransport):
    """The AL's own QP0/QP1 on a provider that exposes special QPs.

    Response time-outs run on the manager's timer service (so a test steps
    them with a ``ManualClock``); they fire on the misc queue.
    """

    def __init__(self, cica: CiCa, port_num: int, qp_num: int) -> None:
        super().__init__(cica, port_num, qp_num)
        self._lock = threading.Lock()
        self._agents: dict[int, _SplAgent] = {}
        # (class, version, method, OUI): the OUI is 0 outside vendor range 2
        self._methods: dict[tuple[int, int, int, int], _SplAgent] = {}
        # slots, backlog, address handles, the send CQ
        self._ring = SendRing(self._lock, self.stats, _SEND_DEPTH, self._wanted, self._sent)
        self._open = False
        self._h_pd: Any = None
        self._h_cq: Any = None  # receives: armed, drained on the completion queue
        self._scq_context = SendCqContext(self)  # sends: reaped by their poster (mad_sends)
        self._h_qp: Any = None
        self._mr: Any = None
        self._buf = bytearray(_SLOT * (_RECV_DEPTH + _SEND_DEPTH))
        self._export: Any = None
        self._vaddr = 0
        self._lkey = 0
        # Sends the transport makes itself (answers to unserved requests): no callbacks.
        self._responder = _SplAgent(
            MadAgentSpec(port_num, qp_num, 0, 0, recv_cb=lambda _r: None), 0
        )
        # The send batch of the thread draining a receive batch (see on_completion).
        self._tls = threading.local()

    # ------------------------------------------------------------------ set-up
    def open(self) -> None:
        ci, cica = self.cica.ci, self.cica
        qp_type = QpType.QP0 if self.qp_num == 0 else QpType.QP1
        undo: list[Any] = []
        try:
            self._h_pd = ci.allocate_pd(cica.h_ca, PdType.SQP)
            undo.append(lambda: ci.deallocate_pd(self._h_pd))
            self._h_cq = ci.create_cq(cica.h_ca, _RECV_DEPTH, self).handle
            undo.append(lambda: ci.destroy_cq(self._h_cq))
            h_scq = ci.create_cq(cica.h_ca, _SEND_DEPTH, self._scq_context).handle
            undo.append(lambda: ci.destroy_cq(h_scq))
            view, self._export, self._vaddr = pin_buffer(self._buf)
            keys = ci.register_mr(self._h_pd, view, self._vaddr, AccessFlags.LOCAL_WRITE)
            self._mr, self._lkey = keys.handle, keys.lkey
            undo.append(lambda: ci.deregister_mr(self._mr))
            caps = QpCaps(sq_depth=_SEND_DEPTH, rq_depth=_RECV_DEPTH)
            created = ci.create_spl_qp(
                self._h_pd, self.port_num, qp_type, caps, h_scq, self._h_cq, self
            )
            self._h_qp = created.handle
            undo.append(lambda: ci.destroy_qp(self._h_qp, 0))
            qkey = QP1_WELL_KNOWN_QKEY if self.qp_num == 1 else 0
            ci.modify_qp(self._h_qp, QpMod(QpState.INIT, pkey_index=0, qkey=qkey))
            ci.modify_qp(self._h_qp, QpMod(QpState.RTR))
            ci.modify_qp(self._h_qp, QpMod(QpState.RTS, sq_psn=0))
            ci.post_recv(self._h_qp, [self._recv_wr(i) for i in range(_RECV_DEPTH)])
            ci.enable_cq_notify(self._h_cq, False)
        except BaseException:
            for fn in reversed(undo):
                try:
                    fn()
                except IbError as exc:
                    log.warning("ibal: undoing the MAD QP set-up failed: %s", exc)
            raise
        self._ring.start(ci, self._h_pd, self._h_qp, h_scq, self._buf, _RECV_DEPTH, _SLOT,
                         self._vaddr, self._lkey, self.port_num)  # fmt: skip
        self._open = True

    def _recv_wr(self, slot: int) -> RecvWr:
        return RecvWr(slot, [Sge(self._vaddr + slot * _SLOT, _SLOT, self._lkey)])

    def close(self) -> None:
        ci = self.cica.ci
        with self._lock:
            if not self._open:
                return
            self._open = False
            avs = self._ring.clear()
            for agent in self._agents.values():  # normally none: agents go before the QP
                for _key, out in agent.pending.items():
                    if out.timer is not None:
                        out.timer.cancel()
        # The QP first: after destroy_qp no WR completes, so the AVs and buffer are free.
        steps: list[tuple[str, Any]] = [
            ("destroy_qp", lambda: ci.destroy_qp(self._h_qp, 0)),
            *(("destroy_av", (lambda a=av: ci.destroy_av(a))) for av in avs),
            ("deregister_mr", lambda: ci.deregister_mr(self._mr)),
            ("destroy_cq", lambda: ci.destroy_cq(self._h_cq)),
            ("destroy_cq", lambda: ci.destroy_cq(self._ring.h_cq)),
            ("deallocate_pd", lambda: ci.deallocate_pd(self._h_pd)),
        ]
        for name, fn in steps:
            try:
                fn()
            except Exception as exc:  # teardown goes on: the CA may be going away
                log.warning("ibal: %s of the MAD QP on %s failed: %s", name, self.cica.name, exc)

    # ------------------------------------------------------------------ agents
    def register(self, spec: MadAgentSpec) -> _SplAgent:
        if spec.rmpp_version:
            raise Unsupported(
                "the access layer's special QPs run no RMPP (a MAD service runs its own: "
                "ibal.mad.enable_rmpp)"
            )
        with self._lock:
            oui = spec.vendor_oui
            keys = [(spec.mgmt_class, spec.class_version, m, oui) for m in spec.methods]
            taken = [k for k in keys if k in self._methods]
            if taken:
                c, v, m, _o = taken[0]
                of = f" OUI {oui:06x}" if oui else ""
                raise ResourceBusy(
                    f"class 0x{c:02x}{of} version {v} method 0x{m:02x} has an agent on "
                    f"port {self.port_num} QP{self.qp_num}"
                )
            agent = _SplAgent(spec, next(_AGENT_IDS) & 0xFFFFFFFF)
            self._agents[agent.agent_id] = agent
            for k in keys:
                self._methods[k] = agent
        return agent

    def hi_tid(self, key: Any) -> int | None:
        return key.agent_id if isinstance(key, _SplAgent) else None

    def expect(self, key: Any, send: MadSend) -> bool:
        mad = bytearray(send.mad[:MAD_SIZE])
        with self._lock:
            agent = self._agents.get(key.agent_id) if isinstance(key, _SplAgent) else None
            if agent is None or agent is not key:
                raise InvalidHandle("MAD agent is not registered here")
            mad[8:12] = agent.agent_id.to_bytes(4, "big")
            out_key = int.from_bytes(mad[12:16], "big")
            out = agent.pending.get(out_key)
            if out is None or not (out.expect and out.send.context is send.context):
                out = _Out(agent, bytes(mad), send, expect=True)
                out.key = agent.pending.add(out, out_key)  # InvalidParameter: TID outstanding
            else:
                out.send = send
            if out.timer is not None:
                out.timer.cancel()
            self._arm(out)
        return True

    def cancel(self, key: Any, context: Any) -> bool:
        with self._lock:
            agent = self._agents.get(key.agent_id) if isinstance(key, _SplAgent) else None
            if agent is None or agent is not key:
                raise InvalidHandle("MAD agent is not registered here")
            for out_key, out in agent.pending.items():
                if out.send.context is context:
                    # A copy still on the wire completes into nothing (_finish finds no entry).
                    agent.pending.end(out_key)
                    if out.timer is not None:
                        out.timer.cancel()
                    return True
        return False

    def unregister(self, key: Any) -> None:
        with self._lock:
            agent = self._agents.pop(key.agent_id, None) if isinstance(key, _SplAgent) else None
            if agent is None:
                raise InvalidHandle("MAD agent is not registered here")
            for k in [k for k, a in self._methods.items() if a is agent]:
                del self._methods[k]
            canceled = [out for _key, out in agent.pending.drain() if not out.send.quiet]
            self._ring.disown(lambda out: out.agent is agent)  # still completes; nobody hears
            for out in canceled:
                if out.timer is not None:
                    out.timer.cancel()
        cb = agent.spec.send_cb
        if cb is not None:
            for out in canceled:
                cb(MadSendDone(out.send.context, WcStatus.CANCELED))

    def send(self, key: Any, send: MadSend) -> None:
        mad = bytearray(send.mad)
        request = not mad_is_response(mad)
        with self._lock:
            agent = self._live_agent(key)
            out = self._new_out(agent, mad, send, request)
            batch: list[_Out] | None = getattr(self._tls, "batch", None)
            if batch is not None:
                batch.append(out)  # leaves with the receive batch's other answers
            else:
                try:
                    self._ring.post(out)
                except BaseException:
                    agent.pending.end(out.key)
                    raise
            if send.timeout_ms > 0 and request:
                self._arm(out)
        if batch is None:
            self._reap_sends(poster=True)

    def _live_agent(self, key: Any) -> _SplAgent:
        """The agent ``key`` names, registered here on an open port (under the lock)."""
        agent = self._agents.get(key.agent_id) if isinstance(key, _SplAgent) else None
        if agent is None or agent is not key:
            raise InvalidHandle("MAD agent is not registered here")
        if not self._open:
            raise InvalidHandle("the port's MAD QP is closed")
        return agent

    def _new_out(self, agent: _SplAgent, mad: bytearray, send: MadSend, request: bool) -> _Out:
        """``send`` as an :class:`_Out` of ``agent``, pending (under the lock)."""
        if request:
            mad[8:12] = agent.agent_id.to_bytes(4, "big")
        waits = request and send.timeout_ms > 0
        out = _Out(agent, bytes(mad), send)
        tid = int.from_bytes(mad[12:16], "big") if waits else None
        out.key = agent.pending.add(out, tid, send.retries)  # InvalidParameter: outstanding
        return out

    def send_many(self, key: Any, sends: Sequence[MadSend]) -> int:
        """One ``post_send`` for the sends that find a slot (the rest wait behind them)."""
        if len(sends) < 2 or getattr(self._tls, "batch", None) is not None:
            return super().send_many(key, sends)
        outs: list[_Out] = []
        with self._lock:
            agent = self._live_agent(key)
            for send in sends:
                mad = bytearray(send.mad)
                request = not mad_is_response(mad)
                try:
                    outs.append(self._new_out(agent, mad, send, request))
                except IbError:
                    if not outs:
                        raise
                    break  # the caller sends the rest again (a TID still outstanding)
            refused = self._ring.post_many(outs)
            for out in refused:
                agent.pending.end(out.key)
            sent = outs[: len(outs) - len(refused)]
            if not sent:
                raise InsufficientResources("the port's MAD QP took none of the sends")
            for out in sent:
                if out.send.timeout_ms > 0 and not mad_is_response(out.mad):
                    self._arm(out)
        self._reap_sends(poster=True)
        return len(sent)

    def _arm(self, out: _Out) -> None:
        out.timer = self.cica.mgr.timers.call_later(
            out.send.timeout_ms / 1000, self._expired, out, owner=self
        )

    def _expired(self, out: _Out) -> None:
        """Misc queue, when a response time-out expires: re-send or give up."""
        retried = False
        with self._lock:
            if out.agent.pending.waiting(out.key) is not out or not self._open:
                return
            if out.agent.pending.retry(out.key):
                try:
                    self._ring.post(out)
                    self._arm(out)
                    retried = True
                except IbError as exc:
                    log.debug("ibal: MAD retry failed: %s", exc)
        if retried:
            self._reap_sends(poster=False)
            return
        self._finish(out, WcStatus.TIMEOUT_RETRY_ERR)

    def _finish(self, out: _Out, status: WcStatus, deferred: _Reports | None = None) -> None:
        """End the send and report it, once (not under the lock): nothing if it ended.
        ``deferred``: on a poster's thread, where a report that may not run on any thread
        waits to go to the completion queue."""
        with self._lock:
            if out.agent.pending.end(out.key, out) is None:
                return
            if out.timer is not None:
                out.timer.cancel()
        if out.send.quiet:
            return  # nobody hears it: no report, no hop to the completion queue
        if deferred is not None and not out.agent.spec.send_cb_any_thread:
            deferred.append((out, status))
            return
        self._report(out, status)

    def _report_all(self, reports: _Reports) -> None:
        """Completion queue: the reports a poster's thread left (inline agents' callbacks)."""
        for out, status in reports:
            self._report(out, status)

    def _report(self, out: _Out, status: WcStatus) -> None:
        """``send_cb`` of a send that has ended (not under the lock)."""
        cb = out.agent.spec.send_cb
        if cb is not None:
            cb(MadSendDone(out.send.context, status))

    # ------------------------------------------------------------------ completions
    def _reap_sends(self, *, poster: bool) -> None:
        """Take the completed sends on this thread (not under the lock).  ``poster``: the
        thread that called :meth:`send` (it may hold its own locks), so a report that must
        not run there is queued."""
        deferred: _Reports | None = [] if poster else None
        self._ring.reap(deferred)
        if deferred:
            self.cica.post_completion(self._report_all, deferred)

    @staticmethod
    def _wanted(out: _Out) -> bool:
        """A send still waiting for its slot is wanted until it ends (cancel, time-out)."""
        return out.agent.pending.get(out.key) is out

    def on_send_completion(self) -> None:
        """Completion queue, after the armed send CQ's upcall."""
        with self._lock:
            self._ring.fired()
        self._reap_sends(poster=False)

    def on_completion(self) -> None:
        """Dispatcher task after the CQ's upcall: drain, rearm, drain again.

        Each drain is a receive batch: its MADs are copied out and its slots go back
        with one ``post_recv`` before any is handled; what the agents send on this
        thread while they handle it (a CM's answers, the replies to unserved
        requests) collects and leaves after it with one ``post_send`` (one datagram
        batch at the provider)."""
        ci = self.cica.ci
        tls = self._tls
        outer: list[_Out] | None = getattr(tls, "batch", None)  # a drain under a drain
        for rearm in (False, True, False):
            with self._lock:
                if not self._open:
                    return
                if rearm:
                    ci.enable_cq_notify(self._h_cq, False)
                    continue
                wcs = ci.poll_cq(self._h_cq, _RECV_DEPTH)
            if not wcs:
                continue
            # Every MAD copied out first, so the slots go back before any is handled: a
            # burst beyond the batch (1,000 REQs of cmtime -c 1000) finds receives posted.
            recvs = [self._received(wc) for wc in wcs]
            if not self._repost(wcs):
                return
            batch: list[_Out] = [] if outer is None else outer  # the outer one flushes
            tls.batch = batch
            try:
                for recv in recvs:
                    if recv is not None:
                        self._handle(recv)
            finally:
                tls.batch = outer
                if outer is None:
                    self._end_batch(batch)

    def _repost(self, wcs: list[Wc]) -> bool:
        """The slots of ``wcs`` back on the receive queue, one ``post_recv``; ``False``
        once the transport is closed."""
        with self._lock:
            if not self._open:
                return False
            self.cica.ci.post_recv(self._h_qp, [self._recv_wr(wc.wr_id) for wc in wcs])
        return True

    def _handle(self, recv: MadRecv) -> None:
        try:
            self._route(recv)
        except Exception:  # one MAD's failure must not lose the rest of the batch
            self.stats["dropped_handler_error"] += 1
            log.exception("ibal: handling a received MAD failed")

    def _end_batch(self, batch: list[_Out]) -> None:
        """The receive batch was handled: its answers go out."""
        if not batch:
            return
        failed: list[_Out] = []
        with self._lock:
            if not self._open:
                return
            wanted = [out for out in batch if self._wanted(out)]  # ended meanwhile: dropped
            if wanted:
                failed = self._ring.post_many(wanted)
        if failed:
            self.stats["send_failed"] += len(failed)
            for out in failed:
                self._finish(out, WcStatus.LOCAL_OP_ERR)
        self._reap_sends(poster=False)

    def _sent(self, out: _Out | None, status: WcStatus, failed: list[_Out],
              deferred: _Reports | None) -> None:  # fmt: skip
        """The ring's ``on_done``: ``out``'s last copy left the wire."""
        for f in failed:
            self._finish(f, WcStatus.LOCAL_OP_ERR, deferred)
        if out is None or out.on_wire:
            return
        if status is not WcStatus.SUCCESS:
            self._finish(out, status, deferred)
        elif out.send.timeout_ms == 0 or mad_is_response(out.mad):
            self._finish(out, WcStatus.SUCCESS, deferred)

    def _received(self, wc: Wc) -> MadRecv | None:
        """The MAD of one receive completion, copied out of its slot (``None``: dropped)."""
        try:
            got = read_mad_slot(self._buf, wc.wr_id * _SLOT, wc, self.stats)
        except Exception:  # a broken header must not keep the batch's slots off the queue
            self.stats["dropped_malformed"] += 1
            return None
        if got is None:
            return None
        mad, grh = got
        addr = MadAddr(
            remote_qp=wc.src_qp,
            remote_qkey=QP1_WELL_KNOWN_QKEY if self.qp_num == 1 else 0,
            dlid=wc.slid,
            sl=wc.sl,
            path_bits=wc.path_bits,
            pkey_index=wc.pkey_index,
            grh=grh,
        )
        return MadRecv(mad, addr, self.port_num, self.qp_num)

    def _route(self, recv: MadRecv) -> None:
        mad = recv.mad
        if mad[0] != 1:  # base version
            self.stats["dropped_bad_version"] += 1
            return
        if (mad[1] in SM_CLASSES) != (self.qp_num == 0):
            self.stats["dropped_wrong_qp"] += 1  # SMPs only on QP0, the rest only on QP1
            return
        if mad[18] or mad[19]:  # the common header's reserved 16 bits
            self.stats["dropped_reserved"] += 1
            return
        out: _Out | None = None
        with self._lock:
            if mad_is_response(mad):
                agent = self._agents.get(int.from_bytes(mad[8:12], "big"))
                out = agent.pending.waiting(int.from_bytes(mad[12:16], "big")) if agent else None
                if out is None:
                    if agent is None or agent.spec.rmpp_version != 0 or not _rmpp_active(mad):
                        # The kernel's MAD layer drops these too: nobody waits for them.
                        self.stats["dropped_unmatched_response"] += 1
                        return
                    # Later segments and ACKs of an RMPP transfer the agent runs itself
                    # (rmpp_version 0): the TID names the agent; no transaction ends.
                    out = None
                if out is not None and out.expect and _rmpp_active(mad) and mad[25] != 1:
                    # An ACK (or STOP/ABORT) of the request's own transfer: not its answer.
                    out = None
                if out is not None:
                    spec = out.agent.spec
                    if (mad[1:3] != out.mad[1:3] or mad[1] != spec.mgmt_class
                            or mad[2] != spec.class_version):
                        # A forged or broken answer must not end the transaction it names,
                        # nor one the agent will drop (a class version it does not speak,
                        # even when the request asked in it): ending it here would stop
                        # the retries and time-out, and nothing would ever complete it.
                        self.stats["dropped_mismatched_response"] += 1
                        return
                    if (recv.addr.grh is None) != (out.send.addr.grh is None):
                        # As Linux's MAD layer matches: an answer with a GRH to a request
                        # sent without one (or the reverse) came another way; it is not
                        # this request's.  (Neither checks the answerer's LID: an answer
                        # may come from another LID than the request went to.)
                        self.stats["dropped_wrong_source"] += 1
                        return
                    out.agent.pending.end(out.key)  # answered: no time-out, no late error
                    if out.timer is not None:
                        out.timer.cancel()
            else:
                agent = self._methods.get((mad[1], mad[2], mad[3], mad_vendor_oui(mad)))
        if agent is None:
            self._unclaimed(recv)
            return
        if out is not None:  # the answer proves the send: its completion goes first
            self._report(out, WcStatus.SUCCESS)
        agent.spec.recv_cb(recv)

    def _unclaimed(self, recv: MadRecv) -> None:
        """A request no agent serves: answer a Get/Set as IBA requires, drop the rest.

        An SMP (LID-routed or directed route) goes to the CA's own SMA instead: every
        CA port has one (IBA 14.2), so with no SMA agent registered the provider's
        local MAD processing answers it (``ci.local_mad``), never a "class not
        supported" status; without a local MAD path it is dropped and counted."""
        mad = recv.mad
        if self.qp_num == 0:
            self._to_sma(recv)
            return
        with self._lock:
            status = unserved_status(self._methods, mad[1], mad[2], mad_vendor_oui(mad))
        reply = mad_error_reply(mad, status)
        if reply is None:
            self.stats["dropped_unclaimed"] += 1
            return
        if self._reply(reply, recv, "dropped_unclaimed"):
            self.stats[f"answered_0x{status:04x}"] += 1

    def _to_sma(self, recv: MadRecv) -> None:
        try:
            answer = self.cica.ci.local_mad(self.cica.h_ca, self.port_num, bytes(recv.mad))
        except IbError as exc:  # Unsupported: the provider has no SMA to ask
            log.debug("ibal: the SMA could not answer an SMP: %s", exc)
            self.stats["dropped_unserved_smp"] += 1
            return
        if len(answer) != MAD_SIZE or not mad_is_response(answer):
            self.stats["dropped_unserved_smp"] += 1  # the SMA answers nothing (a Trap...)
            return
        if self._reply(bytes(answer), recv, "dropped_unserved_smp"):
            self.stats["answered_by_sma"] += 1

    def _reply(self, reply: bytes, recv: MadRecv, failure: str) -> bool:
        with self._lock:
            if not self._open:
                return False
            out = _Out(self._responder, reply, MadSend(reply, recv.addr))
            out.key = self._responder.pending.add(out, None)
            batch: list[_Out] | None = getattr(self._tls, "batch", None)
            if batch is not None:
                batch.append(out)
                return True
            try:
                self._ring.post(out)
            except IbError as exc:
                self._responder.pending.end(out.key)
                log.debug("ibal: answering an unserved MAD failed: %s", exc)
                self.stats[failure] += 1
                return False
        self._reap_sends(poster=False)
        return True


def _rmpp_active(mad: bytes) -> bool:
    """Whether bytes 24..27 read as an active RMPP header (version 1, a type 1..4, the
    Active flag): a class without RMPP has data there, which rarely looks like this."""
    return mad[24] == 1 and 1 <= mad[25] <= 4 and bool(mad[26] & 0x01)


def unserved_status(
    served: Iterable[tuple[int, int, int, int]], mgmt_class: int, class_version: int,
    oui: int = 0,
) -> int:
    """The status owed to a request nobody serves (IBA 13.4.7): bad version when the
    class at that version has no agent on the port, unsupported method otherwise.
    A vendor range 2 class is one class per OUI: another vendor's is not served.

    ``served``: the (class, version, method, OUI) keys the port serves.
    """
    if any(c == mgmt_class and v == class_version and o == oui for c, v, _m, o in served):
        return MAD_STATUS_UNSUPPORTED_METHOD
    return MAD_STATUS_BAD_VERSION


def read_mad_slot(
    buf: bytearray, off: int, wc: Wc, stats: Counter[str]
) -> tuple[bytes, Grh | None] | None:
    """The MAD and the sender's GRH from a receive slot (GRH area, then the MAD) at
    ``off`` of ``buf``; ``None`` (counted in ``stats``) for an error or short receive.
    Shared by every UD QP that carries MADs (the port's QP0/QP1, IBMF alternate QPs)."""
    if wc.status is not WcStatus.SUCCESS:
        stats["dropped_recv_error"] += 1
        return None
    if wc.length - GRH_LEN < MAD_SIZE:
        stats["dropped_short"] += 1
        return None
    mad = bytes(buf[off + GRH_LEN : off + GRH_LEN + MAD_SIZE])
    grh = None
    if wc.recv_opt & RecvOpt.GRH_VALID:
        raw = wc.grh if wc.grh is not None else bytes(buf[off : off + GRH_LEN])
        grh = sender_grh(raw, wc.network_header)
    return mad, grh


def sender_grh(raw: bytes, header: NetworkHeader | None = None) -> Grh:
    """The sender as a reply's GRH, from a receive's 40-byte GRH area.

    An IBA GRH or RoCE v2 IPv6 header gives the source GID and flow fields; a
    RoCE v2 IPv4 header (last 20 bytes) the IPv4-mapped GID of its source.
    """
    if header is NetworkHeader.IPV4:
        ip = raw[20:40]
        return Grh(
            dgid=Gid(b"\0" * 10 + b"\xff\xff" + bytes(ip[12:16])),
            hop_limit=ip[8],
            traffic_class=ip[1],
        )
    word0 = int.from_bytes(raw[0:4], "big")
    return Grh(
        dgid=Gid(bytes(raw[8:24])),
        flow_label=word0 & 0xFFFFF,
        hop_limit=raw[7],
        traffic_class=(word0 >> 20) & 0xFF,
    )


# ---------------------------------------------------------------- provider agents


class AgentTransport(MadTransport):
    """A provider that registers MAD agents itself (the kernel owns QP0/QP1); it runs
    RMPP for agents registered with ``rmpp_version`` (the kernel's MAD layer does)."""

    segments_rmpp = True

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def register(self, spec: MadAgentSpec) -> Any:
        return self.cica.ci.register_mad_agent(self.cica.h_ca, spec)

    def send(self, key: Any, send: MadSend) -> None:
        self.cica.ci.send_mad(key, send)

    def send_many(self, key: Any, sends: Sequence[MadSend]) -> int:
        ci = self.cica.ci
        impl = getattr(type(ci), "send_mad_many", None)
        if impl is None or impl is ChannelInterface.send_mad_many:  # not offered
            return super().send_many(key, sends)
        n = ci.send_mad_many(key, sends)
        if n <= 0 and sends:  # the contract says raise: take the first alone, for its error
            self.send(key, sends[0])
            return 1
        return min(n, len(sends))

    def unregister(self, key: Any) -> None:
        self.cica.ci.unregister_mad_agent(key)


# ---------------------------------------------------------------- per-port registry

_lock = threading.Lock()
_ports: dict[tuple[int, int, int], MadTransport] = {}  # (id(cica), port, qpn)


def transport_kind(cica: CiCa, qp_num: int) -> type[MadTransport]:
    """Which transport serves ``qp_num`` on this CA; ``Unsupported`` if none."""
    caps = cica.capabilities
    if caps.mad_agents:
        return AgentTransport
    if (QpType.QP0 if qp_num == 0 else QpType.QP1) in caps.special_qps:
        return SplQpTransport
    raise Unsupported(caps.reason(f"QP{qp_num} MADs (neither special QPs nor MAD agents)"))


def acquire(cica: CiCa, port_num: int, qp_num: int) -> MadTransport:
    """The port's transport for ``qp_num``, created on first use; pair with :func:`release`."""
    if cica.port(port_num) is None:
        raise InvalidPort(f"CA {cica.name} has no port {port_num!r}")
    kind = transport_kind(cica, qp_num)
    key = (id(cica), port_num, qp_num)
    with _lock:
        t = _ports.get(key)
        if t is None or t.cica is not cica:
            t = kind(cica, port_num, qp_num)
            t.open()  # under the lock: a second user waits for the QP rather than racing it
            _ports[key] = t
        t.users += 1
        return t


def release(t: MadTransport) -> None:
    """One user less; the last one destroys the real QP."""
    with _lock:
        t.users -= 1
        if t.users > 0:
            return
        key = (id(t.cica), t.port_num, t.qp_num)
        if _ports.get(key) is t:
            del _ports[key]
    t.close()


def lookup(cica: CiCa, port_num: int, qp_num: int) -> MadTransport | None:
    """The transport in use on a port, if any (diagnostics and tests)."""
    with _lock:
        t = _ports.get((id(cica), port_num, qp_num))
        return t if t is not None and t.cica is cica else None
