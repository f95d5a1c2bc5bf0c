"""``ib_subscribe`` / ``ib_unsubscribe``: InformInfo subscriptions and SA Reports.

:func:`subscribe` sends SubnAdmSet(InformInfo, Subscribe 1) to the port's SA
and returns a :class:`Subscription` at once (a :class:`~ibal.al.Dependent` of
the AL).  The outcome comes once as a :class:`SubRec` to ``callback`` (on the
AL's misc queue), to :meth:`Subscription.wait` and to ``await sub``; then every
SA Report whose Notice matches the subscription comes as a :class:`ReportRec`
to ``report_cb`` (misc queue; without one, to :meth:`Subscription.get_report`).
The port (:class:`ibal.sa.port.SaPort`) answers each Report with ReportResp.
:meth:`Subscription.unsubscribe` stops the reports at once, sends Subscribe 0
and runs ``destroy_cb(context)`` after its answer; no report callback follows
it.  When the SM asks its clients to re-register, or the SM, the port's LID
or state changes (PnP), the Set is sent again (the SA forgets subscriptions
then); a renewal the SA refuses is retried with back-off.  The protocol is
:class:`ibal.sa.inform_fsm.InformMachine`; this module carries out its actions.

Reports are routed by the subscription's own filter (:meth:`InformInfo.matches`,
the SA's rules), so several subscriptions of a port each get theirs.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ibal.al import Dependent, DestroyCallback, StashKey
from ibal.sa import inform_fsm as fsm
from ibal.sa.inform_fsm import ALL_TRAPS, InformInfo, Notice, SubPhase
from ibal.sa.pinned import PinnedUntilAnswered
from ibal.sa.port import SaPort
from ibal.sa.portwatch import REREGISTER_EVENTS, PortWatch
from ibal.sa.txn import SaAnswer, SaRequestLike
from ibal.sa.txn import SaRequester as _SaRequester
from ibal.sa.waitable import FirstOutcome
from ibal.status import IbError, InvalidAlHandle, InvalidHandle, InvalidParameter, Status, Timeout
from ibal.types import MadAddr
from ibal.wire.fields import FieldError
from ibal.wire.mad.consts import Method, SaAttr

if TYPE_CHECKING:
    from ibal.al import AccessLayer

__all__ = [
    "RENEW_EVENTS",
    "ReportRec",
    "SubRec",
    "SubReq",
    "Subscription",
    "ib_subscribe",
    "ib_unsubscribe",
    "subscribe",
]

log = logging.getLogger("ibal.sa")

REPORT_BACKLOG = 1024
"""Reports :meth:`Subscription.get_report` keeps (no ``report_cb``); older ones are dropped."""
FLAGS_SYNC = 0x00000001
"""``IB_FLAGS_SYNC`` for :class:`SubReq`: ``ib_subscribe`` returns after the sub callback."""
RENEW_EVENTS = REREGISTER_EVENTS
"""Port events after which the SA may have forgotten the port's subscriptions."""


class SaRequester(_SaRequester, Protocol):
    """The SA as seen from one port (``ibal.sa.port.SaPort``)."""

    def add_report_listener(
        self, fn: Callable[[bytes, MadAddr], object]
    ) -> Callable[[], None]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SubRec:
    """``ib_sub_rec_t``: a subscription's outcome.  ``error_status`` (the SA's MAD status)
    is valid with ``REMOTE_ERROR``; ``CANCELED`` (waiters only, no callback) when it was
    unsubscribed before the SA answered."""

    context: Any
    status: Status
    subscription: Subscription | None
    error_status: int = 0


@dataclass(frozen=True, slots=True)
class ReportRec:
    """``ib_report_rec_t``: one SA Report for a subscription (``p_notice`` decoded)."""

    context: Any
    notice: Notice


SubCallback = Callable[[SubRec], object]
ReportCallback = Callable[[ReportRec], object]


@dataclass
class SubReq:
    """``ib_sub_req_t``.  ``class_mgr_name`` is accepted and ignored (the SA is the port's
    SM's); ``flags`` :data:`FLAGS_SYNC` makes :func:`ib_subscribe` wait for the outcome."""

    inform_info: InformInfo
    pfn_report_cb: ReportCallback
    port_guid: int | None = None
    timeout_ms: int = 1000
    retry_cnt: int = 3
    flags: int = 0
    sub_context: Any = None
    pfn_sub_cb: SubCallback | None = None
    report_context: Any = None
    class_mgr_name: str | None = None


class Subscription(PinnedUntilAnswered):
    """``ib_sub_handle_t``: one InformInfo subscription of one port (module docstring)."""

    _kind = "subscription"

    def __init__(
        self,
        al: AccessLayer,
        sa: SaRequester,
        info: InformInfo,
        *,
        callback: SubCallback | None,
        context: Any,
        report_cb: ReportCallback | None,
        report_context: Any,
        destroy_cb: DestroyCallback | None,
        timeout_ms: int,
        retry_cnt: int,
        owns_sa: bool = True,
    ) -> None:
        self._sa = sa
        self._owns_sa = owns_sa  # a hold of SaPort.open to drop at the end
        self._machine = fsm.InformMachine(info)
        self._callback = callback
        self._report_cb = report_cb
        self._report_context = report_context
        self._timeout_ms = timeout_ms
        self._retry_cnt = retry_cnt
        self._mlock = threading.RLock()  # one input (and its actions) at a time
        self._busy: int | None = None  # the thread inside _input
        self._later: list[Callable[[], list[fsm.Action]]] = []
        self._requests: dict[int, SaRequestLike] = {}
        self._first: FirstOutcome[SubRec] = FirstOutcome("subscription outcome")
        self._reports: collections.deque[ReportRec] = collections.deque(maxlen=REPORT_BACKLOG)
        self._report_ready = threading.Condition()
        self._leave_pin: contextlib.AbstractContextManager[None] | None = None
        self._remove_listener: Callable[[], None] | None = None
        self.stats: dict[str, int] = {"reports": 0, "malformed_notices": 0}
        self.unsubscribe_status: Status | None = None
        """The Subscribe 0 Set's outcome once the unsubscribe is over (``None`` before)."""
        # An SaPort that goes (its CA withdrawn) takes the subscription along.
        uses = (sa,) if isinstance(sa, Dependent) else ()
        super().__init__(al, context=context, destroy_cb=destroy_cb, uses=uses)

    # ------------------------------------------------------------------ public
    @property
    def info(self) -> InformInfo:
        return self._machine.info

    @property
    def port_guid(self) -> int:
        return self._sa.port_guid

    @property
    def phase(self) -> SubPhase:
        return self._machine.phase

    @property
    def renewals(self) -> int:
        """Renewals the SA accepted (after client reregister, SM, LID or state changes)."""
        return self._machine.renewals

    def wait(self, timeout: float | None = None) -> SubRec:
        """The outcome (``Timeout`` if it does not come in time); not on AL threads."""
        return self._first.wait(timeout)

    def __await__(self) -> Generator[Any, None, SubRec]:
        return self._first.__await__()

    def get_report(self, timeout: float | None = None) -> ReportRec:
        """The oldest report not yet taken (only without ``report_cb``); ``Timeout``."""
        with self._report_ready:
            if not self._report_ready.wait_for(lambda: bool(self._reports), timeout):
                raise Timeout(f"no report within {timeout} s")
            return self._reports.popleft()

    def unsubscribe(
        self,
        destroy_cb: DestroyCallback | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """``ib_unsubscribe``: no report from now on; Subscribe 0; then ``destroy_cb(context)``.

        The handle is invalid from the call on (a second call raises
        ``InvalidHandle``); the destroy callback runs once the SA answered the
        Set or the request gave up (:attr:`unsubscribe_status` says which).
        """
        self._destroy_pinned(destroy_cb, wait, timeout)  # cleanup waits for the Set's answer

    # ------------------------------------------------------------------ life cycle
    def _start(self) -> None:
        self._remove_listener = self._sa.add_report_listener(self._on_report)
        if getattr(self._sa, "stats", {}).get("reports_elsewhere"):
            log.warning("%r: another client of the port serves SA Reports: this "
                        "subscription's reports go there", self)  # fmt: skip
        _watch(self.al).add(self.port_guid, self)
        self._input(self._machine.subscribe)

    def on_destroying(self) -> None:
        # Also the AL's cascade: Subscribe 0 goes out without anyone waiting for it,
        # unless another subscription of the port holds the same (one) SA record.
        watch = _watch(self.al)
        watch.remove(self.port_guid, self)
        shared = watch.holds(self.port_guid, self.info)
        self._input(lambda: self._machine.unsubscribe(shared))

    def cleanup(self) -> None:
        remove, self._remove_listener = self._remove_listener, None
        if remove is not None:
            remove()
        with self._mlock:
            reqs, self._requests = list(self._requests.values()), {}
        for r in reqs:
            with contextlib.suppress(IbError):
                r.cancel()
        if self._owns_sa:
            with contextlib.suppress(IbError):
                self._sa.close()
        if self._first.value is None:
            self._first.set(SubRec(self.context, Status.CANCELED, self))

    def _renew(self) -> None:
        """Port watch (PnP queue): the SA may have forgotten us."""
        if self.alive:
            self._input(self._machine.reregister)

    # ------------------------------------------------------------------ the machine
    def _input(self, step: Callable[[], list[fsm.Action]]) -> None:
        with self._mlock:
            outer = self._busy
            self._busy = threading.get_ident()
            try:
                steps = [step]
                while steps:
                    for act in steps.pop(0)():
                        self._do(act)
                    steps += self._later
                    self._later.clear()
            finally:
                self._busy = outer

    def _do(self, act: fsm.Action) -> None:
        if isinstance(act, fsm.TransmitSet):
            self._send(act)
        elif isinstance(act, fsm.CancelRequest):
            req = self._requests.pop(act.tag, None)
            if req is not None:
                with contextlib.suppress(IbError):
                    req.cancel()
        elif isinstance(act, fsm.SubDone):
            rec = SubRec(self.context, act.status, self, act.mad_status)
            self._first.set(rec)
            if self._callback is not None:
                self.post_callback(self._callback, rec)
        elif isinstance(act, fsm.Deliver):
            self._deliver(act.notice)
        elif isinstance(act, fsm.ArmTimer):
            with contextlib.suppress(IbError):
                self.call_later(act.delay, self._input, self._machine.retry_due)
        elif isinstance(act, fsm.Finish):
            self.unsubscribe_status = act.status
            self._unpin()

    def _send(self, act: fsm.TransmitSet) -> None:
        tag = act.tag

        def answered(ans: SaAnswer) -> None:
            def step() -> list[fsm.Action]:
                self._requests.pop(tag, None)
                return self._machine.answer(tag, ans.status, ans.mad_status, ans.records)

            if self._busy == threading.get_ident():  # answered inside request(): after it
                self._later.append(step)
                return
            self._input(step)

        try:
            req = self._sa.request(
                Method.SET, SaAttr.INFORM_INFO, act.record, 0, timeout_ms=self._timeout_ms,
                retry_cnt=self._retry_cnt, callback=answered,
            )  # fmt: skip
        except IbError as exc:  # the SA port is gone (its AL closing), or none (RoCE)
            status = exc.status
            self._later.append(lambda: self._machine.answer(tag, status))
            return
        self._requests[tag] = req

    def _deliver(self, notice: Notice) -> None:
        self.stats["reports"] += 1
        rec = ReportRec(self._report_context, notice)
        if self._report_cb is not None:
            self.post_callback(self._report_cb, rec)
            return
        with self._report_ready:
            self._reports.append(rec)
            self._report_ready.notify_all()

    def _on_report(self, data: bytes, sender: MadAddr) -> None:
        """SaPort's report listener (misc queue): every Report of the port."""
        if not self.alive:
            return
        try:
            notice = Notice.decode(data)
        except FieldError:
            self.stats["malformed_notices"] += 1
            return
        self._input(lambda: self._machine.report(notice))


# ---------------------------------------------------------------------- renewals


class _PortWatch(PortWatch[Subscription]):
    """One PnP registration per AL: port events after which subscriptions are renewed."""

    def __init__(self, al: AccessLayer) -> None:
        super().__init__(al, Subscription._renew)

    def holds(self, port_guid: int, info: InformInfo) -> bool:
        """Whether a live subscription of the port has this InformInfo."""
        held = (SubPhase.SUBSCRIBING, SubPhase.ACTIVE)
        return any(s.info == info and s.alive and s.phase in held
                   for s in self.clients(port_guid))  # fmt: skip


_WATCH = StashKey[_PortWatch]()


def _watch(al: AccessLayer) -> _PortWatch:
    return PortWatch.of(al, _WATCH, _PortWatch)


# ---------------------------------------------------------------------- entry points


def _open_sa(al: AccessLayer, port_guid: int | None) -> SaRequester:
    return SaPort.open(al, port_guid)


def subscribe(
    al: AccessLayer,
    trap: int | None = None,
    port_guid: int | None = None,
    *,
    info: InformInfo | None = None,
    callback: SubCallback | None = None,
    report_cb: ReportCallback | None = None,
    context: Any = None,
    report_context: Any = None,
    destroy_cb: DestroyCallback | None = None,
    timeout_ms: int = 1000,
    retry_cnt: int = 3,
    sa: SaRequester | None = None,
) -> Subscription:
    """Subscribe ``port_guid`` (``None``: the first active port) to SA Reports of generic
    trap ``trap`` (``None``: every trap), or to what ``info`` selects; see the module
    docstring.  ``InvalidParameter`` for bad arguments, what ``SaPort.open`` raises
    (``InvalidGuid``, ``NoMatch``, ``InvalidAlHandle``).  ``sa``: the SA port to use
    (default ``SaPort.open(al, port_guid)``, closed with the subscription; one given
    here stays the caller's)."""
    from ibal.al import AccessLayer

    if not isinstance(al, AccessLayer):
        raise InvalidAlHandle(f"expected an AL handle, got {type(al).__name__}")
    if al.closed:
        raise InvalidAlHandle("the AL is closed")
    if info is not None and trap is not None:
        raise InvalidParameter("give trap or info, not both")
    for name, fn in (("callback", callback), ("report_cb", report_cb), ("destroy_cb", destroy_cb)):
        if fn is not None and not callable(fn):
            raise InvalidParameter(f"{name} must be callable")
    if type(timeout_ms) is not int or timeout_ms <= 0 or type(retry_cnt) is not int \
            or retry_cnt < 0:  # fmt: skip
        raise InvalidParameter("timeout_ms must be > 0 and retry_cnt >= 0")
    if info is None:
        try:
            info = InformInfo(trap_number=ALL_TRAPS if trap is None else trap)
        except (FieldError, TypeError) as exc:
            raise InvalidParameter(f"bad trap number {trap!r}: {exc}") from None
    elif not isinstance(info, InformInfo):
        raise InvalidParameter("info must be an InformInfo")
    requester = sa if sa is not None else _open_sa(al, port_guid)
    try:
        sub = Subscription(
            al, requester, info, callback=callback, context=context, report_cb=report_cb,
            report_context=report_context, destroy_cb=destroy_cb, timeout_ms=timeout_ms,
            retry_cnt=retry_cnt, owns_sa=sa is None,
        )  # fmt: skip
    except BaseException:
        if sa is None:
            with contextlib.suppress(IbError):
                requester.close()
        raise
    sub._start()
    return sub


def ib_subscribe(al: AccessLayer, req: SubReq) -> Subscription:
    """``ib_subscribe(h_al, p_sub_req, ph_sub)``: the handle is returned; with
    :data:`FLAGS_SYNC` after the sub callback ran."""
    if not isinstance(req, SubReq):
        raise InvalidParameter("ib_subscribe takes a SubReq")
    if not callable(req.pfn_report_cb):
        raise InvalidParameter("pfn_report_cb is required")
    if req.pfn_sub_cb is not None and not callable(req.pfn_sub_cb):
        raise InvalidParameter("pfn_sub_cb must be callable")
    ran = threading.Event()
    user_cb = req.pfn_sub_cb

    def sub_cb(rec: SubRec) -> None:
        try:
            if user_cb is not None:
                user_cb(rec)
        finally:
            ran.set()

    sub = subscribe(
        al, port_guid=req.port_guid, info=req.inform_info, callback=sub_cb,
        report_cb=req.pfn_report_cb, context=req.sub_context, report_context=req.report_context,
        timeout_ms=req.timeout_ms, retry_cnt=req.retry_cnt,
    )  # fmt: skip
    if req.flags & FLAGS_SYNC and sub.wait().status is not Status.CANCELED:
        # the callback runs on the misc queue, after the outcome is known
        while not ran.wait(0.1) and sub.alive:
            pass
    return sub


def ib_unsubscribe(
    sub: Subscription, destroy_cb: DestroyCallback | None = None, *, wait: bool = False
) -> None:
    """``ib_unsubscribe(h_sub, pfn_destroy_cb)``: ``InvalidHandle`` for anything but a live
    subscription; ``wait`` (``ib_sync_destroy``) blocks until the destroy is over."""
    if not isinstance(sub, Subscription):
        raise InvalidHandle(f"expected a subscription handle, got {type(sub).__name__}")
    sub.unsubscribe(destroy_cb, wait=wait)
