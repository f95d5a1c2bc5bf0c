"""``ib_join_mcast`` / ``ib_leave_mcast``: multicast membership through the SA.

:func:`join_mcast` sends SubnAdmSet(MCMemberRecord) to the port's SA and
returns a :class:`McastMembership` at once; the outcome comes as a
:class:`McastRec` to ``callback`` (on the AL's misc queue), to
:meth:`McastMembership.wait` and to ``await membership``.  On success a UD QP
is attached to the group's ``(MGID, MLID)``.  The membership is a
:class:`~ibal.al.Dependent` of the QP (or of the port, for a join without a
QP): :meth:`McastMembership.leave` (or destroying the QP, or closing the AL)
detaches the QP and sends SubnAdmDelete.  When the port's SM asks its clients
to re-register (PnP ``CLIENT_REREGISTER``), or the SM, the port's LID or its
state changes, the join is sent again and the callback gets a record with
``rejoin=True`` (errors too, retried with back-off).  The protocol is
:class:`ibal.sa.mcast_fsm.McastMachine`; this module only carries out its actions.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ibal.al import Ca, Dependent, DestroyCallback, McastAttachment, Qp, StashKey
from ibal.sa import mcast_fsm as fsm
from ibal.sa.mcast_fsm import JoinState, McastPhase, MemberRec, Scope
from ibal.sa.pinned import PinnedUntilAnswered
from ibal.sa.port import SaPort
from ibal.sa.portwatch import REREGISTER_EVENTS, PortWatch
from ibal.sa.txn import SaAnswer, SaRequester, SaRequestLike
from ibal.sa.waitable import FirstOutcome
from ibal.status import (
    IbError,
    InvalidGid,
    InvalidMcastHandle,
    InvalidParameter,
    InvalidPkey,
    InvalidPort,
    InvalidQpHandle,
    InvalidServiceType,
    Status,
)
from ibal.types import Gid, QpType
from ibal.wire.mad.consts import Method, SaAttr

if TYPE_CHECKING:
    from ibal.al import AccessLayer


@dataclass(frozen=True, slots=True)
class McastRec:
    """``ib_mcast_rec_t``: one join outcome, as the callback and :meth:`~McastMembership.wait`
    get it.  ``error_status`` (the SA's MAD status) is valid only with REMOTE_ERROR;
    ``membership`` and ``member_rec`` only with SUCCESS.  ``rejoin``: the join was
    redone after a client reregister or SM/LID change (ibal's addition)."""

    context: Any
    status: Status
    error_status: int = 0
    membership: McastMembership | None = None
    member_rec: MemberRec | None = None
    rejoin: bool = False


McastCallback = Callable[[McastRec], object]

REJOIN_EVENTS = REREGISTER_EVENTS
"""Port events after which the SA may have forgotten the port's memberships."""


class McastMembership(PinnedUntilAnswered):
    """``ib_mcast_handle_t``: one port's (and QP's) membership of one group."""

    _invalid = InvalidMcastHandle
    _kind = "multicast membership"

    def __init__(
        self,
        owner: Qp | tuple[Ca, int],
        sa: SaRequester,
        machine: fsm.McastMachine,
        *,
        callback: McastCallback | None,
        context: Any,
        destroy_cb: DestroyCallback | None,
        timeout_ms: int,
        retry_cnt: int,
        owns_sa: bool = False,
    ) -> None:
        self._qp = owner if isinstance(owner, Qp) else None
        self._sa = sa
        self._machine = machine
        self._callback = callback
        self._timeout_ms = timeout_ms
        self._retry_cnt = retry_cnt
        self._mlock = threading.RLock()  # one input (and its actions) at a time
        self._requests: dict[int, SaRequestLike] = {}
        self._attachment: McastAttachment | None = None
        self._first: FirstOutcome[McastRec] = FirstOutcome("join outcome")
        self._leave_pin: contextlib.AbstractContextManager[None] | None = None
        self._sa_hold: SaPort | None = sa if owns_sa and isinstance(sa, SaPort) else None
        self._later: list[Callable[[], list[fsm.Action]]] = []  # inputs an action produced
        self._end = False  # the first join failed: destroy once its report is out
        self.leave_status: Status | None = None
        """The Delete's outcome once the leave is over (``None`` before)."""
        super().__init__(owner, context=context, destroy_cb=destroy_cb)

    # ------------------------------------------------------------------ public
    @property
    def qp(self) -> Qp | None:
        """The QP attached on success (``None`` for a join without a QP)."""
        return self._qp

    @property
    def phase(self) -> McastPhase:
        return self._machine.phase

    @property
    def member_rec(self) -> MemberRec | None:
        """The SA's record of the last successful join (MGID, MLID, Q_Key, ...)."""
        return self._machine.record

    @property
    def attachment(self) -> McastAttachment | None:
        """The QP's attachment to the group, while there is one."""
        return self._attachment

    def wait(self, timeout: float | None = None) -> McastRec:
        """The first join's outcome (``Timeout`` if it does not come in time).

        Not on the AL's callback threads: the outcome is delivered there."""
        return self._first.wait(timeout)

    def __await__(self) -> Generator[Any, None, McastRec]:
        return self._first.__await__()

    def leave(
        self,
        destroy_cb: DestroyCallback | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """``ib_leave_mcast``: detach now, SubnAdmDelete, then ``destroy_cb(context)``.

        The handle is invalid from the call on (a second leave raises
        ``InvalidMcastHandle``); the destroy callback runs once the SA answered
        the Delete or the request gave up (``leave_status`` says which).
        """
        self._destroy_pinned(destroy_cb, wait, timeout)  # cleanup waits for the Delete's answer

    # ------------------------------------------------------------------ life cycle
    def _start(self) -> None:
        watch = _watch(self.al)
        watch.uses(self._sa)
        watch.add(self._sa.port_guid, self)
        self._input(self._machine.join)

    def _farewell(self) -> None:
        """The AL is closing: send the Delete now, before the SA port goes."""
        self._input(self._machine.leave)

    def on_destroying(self) -> None:
        # Also the cascade of the QP or the AL: the Delete goes out without waiting.
        _watch(self.al).remove(self._sa.port_guid, self)
        self._input(self._machine.leave)

    def cleanup(self) -> None:
        # A Delete still out keeps going (the QP's or the AL's cascade does not wait
        # for it); its answer ends the machine and drops our hold on the SA port.
        if self._machine.phase is McastPhase.LEFT:
            self._release_sa()

    def _release_sa(self) -> None:
        with self._mlock:
            sa, self._sa_hold = self._sa_hold, None
        if sa is not None:
            with contextlib.suppress(IbError):
                sa.close()

    def _rejoin(self) -> None:
        """Port watch (PnP queue): the SA may have forgotten us."""
        if self.alive:
            self._input(self._machine.reregister)

    # ------------------------------------------------------------------ the machine's actions
    def _input(self, step: Callable[[], list[fsm.Action]]) -> None:
        reports: list[fsm.Deliver] = []
        with self._mlock:
            steps = [step]
            while steps:
                for act in steps.pop(0)():
                    self._do(act, reports)
                steps += self._later
                self._later.clear()
            end, self._end = self._end, False
        for rep in reports:
            self._deliver(rep)
        # a failed first join ends after its report (the misc queue keeps the order)
        if end and (self._callback is None or not self.post_callback(self._destroy_quietly)):
            self._destroy_quietly()

    def _destroy_quietly(self) -> None:
        with contextlib.suppress(IbError):
            self.destroy()

    def _do(self, act: fsm.Action, reports: list[fsm.Deliver]) -> None:
        if isinstance(act, fsm.TransmitSet | fsm.TransmitDelete):
            method = Method.SET if isinstance(act, fsm.TransmitSet) else Method.DELETE
            self._send(method, act.tag, act.record, act.comp_mask)
        elif isinstance(act, fsm.CancelRequest):
            req = self._requests.pop(act.tag, None)
            if req is not None:
                with contextlib.suppress(IbError):
                    req.cancel()
        elif isinstance(act, fsm.Attach):
            self._attach_qp(act, reports)
        elif isinstance(act, fsm.Detach):
            att, self._attachment = self._attachment, None
            if att is not None:
                with contextlib.suppress(IbError):  # gone with its QP already
                    att.detach()
        elif isinstance(act, fsm.Deliver):
            reports.append(act)
        elif isinstance(act, fsm.ArmTimer):
            with contextlib.suppress(IbError):
                self.call_later(act.delay, self._input, self._machine.retry_due)
        elif isinstance(act, fsm.Finish):
            self._finished(act)

    def _send(self, method: int, tag: int, record: bytes, comp_mask: int) -> None:
        def answered(ans: SaAnswer) -> None:
            # Directly, not through post_callback: a leave's answer arrives while dying.
            with self._mlock:
                self._requests.pop(tag, None)
            self._input(lambda: self._machine.answer(tag, ans.status, ans.mad_status, ans.records))

        try:
            req = self._sa.request(
                method, SaAttr.MCMEMBER_RECORD, record, comp_mask,
                timeout_ms=self._timeout_ms, retry_cnt=self._retry_cnt, callback=answered,
            )  # fmt: skip
        except IbError as exc:  # the SA port is gone (its AL closing): that is the answer
            status = exc.status
            self._later.append(lambda: self._machine.answer(tag, status))
            return
        self._requests[tag] = req

    def _attach_qp(self, act: fsm.Attach, reports: list[fsm.Deliver]) -> None:
        if self._qp is None:
            return
        try:
            self._attachment = self._qp.attach_mcast(act.mgid, act.mlid)
        except IbError as exc:
            # Joined at the SA but the QP cannot receive: report it; the user leaves.
            reports.append(fsm.Deliver(exc.status))

    def _finished(self, act: fsm.Finish) -> None:
        if self._machine.record is None and self.alive:
            self._end = True  # the first join failed: the membership never existed
            return
        self.leave_status = act.status
        if not self.alive and self._leave_pin is None:
            self._release_sa()  # destroyed already: nothing else will
        self._unpin()


    def _deliver(self, rep: fsm.Deliver) -> None:
        ok = rep.status is Status.SUCCESS
        rec = McastRec(
            context=self.context,
            status=rep.status,
            error_status=rep.mad_status if rep.status is Status.REMOTE_ERROR else 0,
            membership=self if ok else None,
            member_rec=rep.record if ok else None,
            rejoin=rep.rejoin,
        )
        self._first.set(rec)
        if self._callback is not None:
            self.post_callback(self._callback, rec)


# ---------------------------------------------------------------------- the port watch


class _Farewell(Dependent):
    """Sends every membership's Delete when its AL closes, while the SA ports still run.

    An AL's cascade takes its dependents newest first, so this one is kept newer
    than every SA port its memberships use (:meth:`_PortWatch.uses`); the
    memberships themselves hang on QPs, which go after the SA ports.
    """

    def __init__(self, al: AccessLayer, watch: _PortWatch) -> None:
        self._watch = watch
        self.retired = False
        super().__init__(al)

    def on_destroying(self) -> None:
        if not self.retired:
            for m in self._watch.all_members():
                m._farewell()


class _PortWatch(PortWatch[McastMembership]):
    """One PnP registration per AL: port events that call for a rejoin, to memberships."""

    def __init__(self, al: AccessLayer) -> None:
        super().__init__(al, McastMembership._rejoin)
        self._al = al
        self._sas_lock = threading.Lock()
        # Weak: an SA port that went (its CA withdrawn) is not kept alive by the watch.
        self._sas: weakref.WeakValueDictionary[int, SaRequester] = weakref.WeakValueDictionary()
        self._farewell: _Farewell | None = None

    def uses(self, sa: SaRequester) -> None:
        """A membership sends through ``sa``: keep the farewell newer than it."""
        with self._sas_lock:
            if id(sa) in self._sas and self._farewell is not None:
                return
            self._sas[id(sa)] = sa
            old, self._farewell = self._farewell, _Farewell(self._al, self)
        if old is not None:
            old.retired = True
            with contextlib.suppress(IbError):
                old.destroy()

    def all_members(self) -> list[McastMembership]:
        return self.clients()


_WATCH = StashKey[_PortWatch]()


def _watch(al: AccessLayer) -> _PortWatch:
    return PortWatch.of(al, _WATCH, _PortWatch)


# ---------------------------------------------------------------------- joining


def join_mcast(
    target: Qp | tuple[Ca, int],
    mgid: Gid | str | bytes | None = None,
    *,
    join_state: JoinState = JoinState.FULL,
    create: bool = False,
    q_key: int | None = None,
    p_key: int | None = None,
    mtu: int | None = None,
    rate: int | None = None,
    packet_life_time: int | None = None,
    sl: int = 0,
    flow_label: int = 0,
    tclass: int = 0,
    hop_limit: int = 0,
    scope: int = Scope.LINK_LOCAL,
    port_guid: int | None = None,
    callback: McastCallback | None = None,
    context: Any = None,
    destroy_cb: DestroyCallback | None = None,
    timeout_ms: int = 1000,
    retry_cnt: int = 3,
    sa: SaRequester | None = None,
) -> McastMembership:
    """``ib_join_mcast``: join (``create=True``: or create) group ``mgid`` as ``join_state``.

    ``target`` is a UD QP (attached to the group on success) or ``(ca, port_num)``
    (a membership without a QP, e.g. a send-only sender).  ``mgid=None`` with
    ``create=True`` lets the SA assign the MGID.  Creating needs ``q_key`` and
    ``p_key`` (default: the QP's, or the port's first P_Key); ``sl``,
    ``flow_label``, ``tclass`` go with it; ``mtu``/``rate``/``packet_life_time``
    (IBA encodings) ask for exactly those.  ``sa``: the SA port to use
    (default ``SaPort.open(al, port_guid)``).

    Raises at once: ``InvalidQpHandle``, ``InvalidServiceType`` (not UD),
    ``InvalidPort`` (``port_guid`` is not the QP's port), ``InvalidPkey`` (not the
    QP's P_Key), ``InvalidGid`` (not a multicast GID), ``InvalidParameter``.
    """
    ca, port_num, qp_pkey, qp_qkey = _target(target)
    port = ca.query_port(port_num)
    if port_guid is not None and port_guid != port.port_guid:
        raise InvalidPort(f"port 0x{port_guid:x} is not the QP's port 0x{port.port_guid:x}")
    if p_key is not None and qp_pkey is not None and (p_key | 0x8000) != (qp_pkey | 0x8000):
        raise InvalidPkey(f"P_Key 0x{p_key:04x} is not the QP's 0x{qp_pkey:04x}")
    if callback is not None and not callable(callback):
        raise InvalidParameter("callback must be callable")
    try:
        state = JoinState(join_state)
    except ValueError:
        raise InvalidParameter(f"bad join state {join_state!r}") from None
    if not state or state & ~(JoinState.FULL | JoinState.NON | JoinState.SENDONLY):
        raise InvalidParameter(f"bad join state {join_state!r}")
    group = _mgid(mgid, create)
    if not port.gids:
        raise InvalidPort(f"port {port_num} has no GID")
    if p_key is None and create:
        p_key = qp_pkey if qp_pkey is not None else (port.pkeys[0] if port.pkeys else 0xFFFF)
    if q_key is None and create:
        q_key = qp_qkey
    if create and q_key is None:
        raise InvalidParameter("creating a group needs its Q_Key")
    given: dict[str, int] = {}
    for name, val in (("q_key", q_key), ("p_key", p_key), ("mtu", mtu), ("rate", rate),
                      ("packet_life_time", packet_life_time)):  # fmt: skip
        if val is not None:
            given[name] = val
            if name in ("mtu", "rate", "packet_life_time"):
                given[f"{name}_selector"] = 2  # exactly
    if create or sl or flow_label or tclass or hop_limit:
        given.update(sl=sl, flow_label=flow_label, tclass=tclass)
    if hop_limit:
        given["hop_limit"] = hop_limit
    if create:
        given["scope"] = scope
    try:
        request = MemberRec(mgid=group, port_gid=port.gids[0], join_state=state, scope=scope)
        request = replace(request, **given)  # type: ignore[arg-type]
        request.encode()
        mask = fsm.join_mask(tuple(given), create=create)
    except ValueError as exc:
        raise InvalidParameter(str(exc)) from None
    machine = fsm.McastMachine(request, mask)
    owns_sa = sa is None
    if sa is None:
        sa = SaPort.open(ca.al, port.port_guid)
    try:
        m = McastMembership(
            target, sa, machine, callback=callback, context=context, destroy_cb=destroy_cb,
            timeout_ms=timeout_ms, retry_cnt=retry_cnt, owns_sa=owns_sa,
        )  # fmt: skip
    except BaseException:
        if owns_sa and isinstance(sa, SaPort):
            sa.close()
        raise
    m._start()
    return m


@dataclass(frozen=True)
class McastReq:
    """``ib_mcast_req_t``: a join as IBAL spells it; ``sync`` is ``IB_FLAGS_SYNC``.

    ``member_rec`` gives the MGID (zero with ``create``: the SA assigns one), the
    JoinState and, for a create, Q_Key, P_Key, TClass, SL, FlowLabel, HopLimit,
    Scope; MTU, rate and packet lifetime are asked for exactly when not zero.
    """

    member_rec: MemberRec
    create: bool = False
    callback: McastCallback | None = None
    context: Any = None
    timeout_ms: int = 1000
    retry_cnt: int = 3
    sync: bool = False
    port_guid: int | None = None


def join_mcast_req(qp: Qp, req: McastReq, *, sa: SaRequester | None = None) -> McastMembership:
    """``ib_join_mcast(h_qp, p_mcast_req)``; with ``sync`` it returns once the outcome is in."""
    if not isinstance(req, McastReq):
        raise InvalidParameter("an McastReq is required")
    r = req.member_rec
    zero = r.mgid == fsm.ZERO_GID
    m = join_mcast(
        qp, None if zero and req.create else r.mgid, join_state=r.join_state,
        create=req.create, q_key=r.q_key if req.create or r.q_key else None,
        p_key=r.p_key if req.create or r.p_key else None, mtu=r.mtu or None,
        rate=r.rate or None, packet_life_time=r.packet_life_time or None, sl=r.sl,
        flow_label=r.flow_label, tclass=r.tclass, hop_limit=r.hop_limit, scope=r.scope,
        port_guid=req.port_guid, callback=req.callback, context=req.context,
        timeout_ms=req.timeout_ms, retry_cnt=req.retry_cnt, sa=sa,
    )  # fmt: skip
    if req.sync:
        m.wait()
    return m


def leave_mcast(
    membership: McastMembership,
    destroy_cb: DestroyCallback | None = None,
    *,
    wait: bool = False,
) -> None:
    """``ib_leave_mcast``: ``membership.leave(destroy_cb, wait=)``."""
    if not isinstance(membership, McastMembership):
        raise InvalidMcastHandle("not a multicast membership")
    membership.leave(destroy_cb, wait=wait)


def _target(target: object) -> tuple[Ca, int, int | None, int | None]:
    """(CA, port number, the QP's P_Key, the QP's Q_Key) of a join's target."""
    if isinstance(target, tuple):
        if len(target) != 2 or not isinstance(target[0], Ca) or type(target[1]) is not int:
            raise InvalidParameter("a port target is (ca, port_num)")
        return target[0], target[1], None, None
    if not isinstance(target, Qp):
        raise InvalidQpHandle("a QP (or (ca, port_num)) is required")
    if not target.alive:
        raise InvalidQpHandle("the QP is destroyed")
    if target.qp_type is not QpType.UD:
        raise InvalidServiceType(f"{target.qp_type.name} QPs cannot join multicast groups")
    attr = target.query()
    ca = target.pd.ca
    if not attr.port_num:
        raise InvalidParameter("the QP is not bound to a port yet (init_dgrm_svc first)")
    pkeys = ca.query_port(attr.port_num).pkeys
    pkey = pkeys[attr.pkey_index] if attr.pkey_index < len(pkeys) else None
    return ca, attr.port_num, pkey, attr.qkey


def _mgid(mgid: Gid | str | bytes | None, create: bool) -> Gid:
    if mgid is None:
        if not create:
            raise InvalidParameter("joining needs the group's MGID (create=True lets the SA pick)")
        return fsm.ZERO_GID
    try:
        g = mgid if isinstance(mgid, Gid) else Gid(mgid)
    except (ValueError, TypeError):
        raise InvalidGid(f"{mgid!r} is not a GID") from None
    if not g.is_multicast and not (create and g == fsm.ZERO_GID):
        raise InvalidGid(f"{g} is not a multicast GID")
    return g


__all__ = [
    "REJOIN_EVENTS",
    "JoinState",
    "McastCallback",
    "McastMembership",
    "McastPhase",
    "McastRec",
    "McastReq",
    "MemberRec",
    "SaRequester",
    "Scope",
    "join_mcast",
    "join_mcast_req",
    "leave_mcast",
]
