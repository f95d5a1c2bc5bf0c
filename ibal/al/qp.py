"""Queue pairs: create parameters, the state table, events, multicast (posting: ``qp_work``)."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ibal import qp_fsm
from ibal.al import ranges
from ibal.al.av import Av
from ibal.al.cq import Cq
from ibal.al.dispatcher import log
from ibal.al.obj import CaObject, DestroyCallback, SyncDestroy
from ibal.al.qp_work import QpWork
from ibal.al.srq import Srq
from ibal.records import record
from ibal.status import (
    IbError,
    InvalidApmState,
    InvalidGid,
    InvalidLid,
    InvalidMaxSge,
    InvalidMaxWrs,
    InvalidMcastHandle,
    InvalidParameter,
    InvalidPkey,
    InvalidPort,
    InvalidQpState,
    InvalidServiceType,
    InvalidSetting,
    Unsupported,
)
from ibal.types import (
    MULTICAST_LID_BASE,
    PERMISSIVE_LID,
    QP1_WELL_KNOWN_QKEY,
    ApmState,
    AsyncEvent,
    AsyncEventRec,
    DgrmInfo,
    Gid,
    LinkLayer,
    QpAttr,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    Wc,
    WcType,
)

if TYPE_CHECKING:
    from ibal.al.cica import CiCa
    from ibal.al.pd import Pd

EventCallback = Callable[[AsyncEventRec], object]

_RAW = (QpType.RAW_IPV6, QpType.RAW_ETHER)
_ALIAS = (QpType.QP0_ALIAS, QpType.QP1_ALIAS)

# What an async event says about the QP's state (IBA 11.6.3; Linux ib_event_type).
_EVENT_STATE: dict[AsyncEvent, QpState] = {
    AsyncEvent.QP_FATAL: QpState.ERROR,
    AsyncEvent.WQ_REQ_ERROR: QpState.ERROR,
    AsyncEvent.WQ_ACCESS_ERROR: QpState.ERROR,
    AsyncEvent.RQ_ERROR: QpState.ERROR,
    AsyncEvent.SRQ_QP_LAST_WQE_REACHED: QpState.ERROR,  # raised as a QP on an SRQ errs
    AsyncEvent.SQ_ERROR: QpState.SQERR,  # an RC QP goes to ERROR (qp_fsm.observed_state)
}
_RECV_WC = (WcType.RECV, WcType.RECV_RDMA_WRITE)


@record(frozen=True)
class QpCreate:
    """``ib_qp_create_t``: what ``create_qp`` / ``get_spl_qp`` take."""

    qp_type: QpType
    send_cq: Cq
    recv_cq: Cq
    sq_depth: int = 16
    rq_depth: int = 16
    sq_sge: int = 1
    rq_sge: int = 1
    max_inline: int = 0
    srq: Srq | None = None
    sq_signaled: bool = True

    def caps(self) -> QpCaps:
        """The sizes asked for, as the provider contract takes them."""
        return QpCaps(
            sq_depth=self.sq_depth,
            rq_depth=self.rq_depth,
            sq_sge=self.sq_sge,
            rq_sge=self.rq_sge,
            max_inline=self.max_inline,
        )


def _check_resize(cica: CiCa, mod: QpMod, has_srq: bool) -> None:
    """``sq_depth``/``rq_depth`` in a modify: the CA must resize, the sizes fit its limits."""
    caps = cica.capabilities
    if not caps.resize_qp:
        raise Unsupported(f"resizing work queues: {caps.reason('resize_qp')}")
    if mod.rq_depth is not None and has_srq:
        raise InvalidSetting("the QP takes its receives from an SRQ: no rq_depth")
    max_wrs = cica.limit("max_wrs")
    for depth in (mod.sq_depth, mod.rq_depth):
        if depth is not None and (type(depth) is not int or depth < 1 or depth > max_wrs > 0):
            raise InvalidMaxWrs(f"queue depth {depth!r} outside 1..{max_wrs}")


def check_qp_create(create: object, cica: CiCa) -> QpCreate:
    """Type and limit checks of ``create`` against the CA (handles are checked by the caller)."""
    if not isinstance(create, QpCreate):
        raise InvalidParameter("a QpCreate is required")
    try:
        QpType(create.qp_type)
    except ValueError:
        raise InvalidParameter(f"unknown QP type {create.qp_type!r}") from None
    sizes = (create.sq_depth, create.rq_depth, create.sq_sge, create.rq_sge, create.max_inline)
    if any(type(v) is not int or v < 0 for v in sizes):
        raise InvalidParameter("QP sizes must be non-negative ints")
    max_wrs, max_sges = cica.limit("max_wrs"), cica.limit("max_sges")
    if max_wrs and max(create.sq_depth, create.rq_depth) > max_wrs:
        raise InvalidMaxWrs(f"depth above the CA's {max_wrs}")
    if max_sges and max(create.sq_sge, create.rq_sge) > max_sges:
        raise InvalidMaxSge(f"SGE count above the CA's {max_sges}")
    return create


class Qp(QpWork):
    """``ib_create_qp`` / ``ib_get_spl_qp``'s handle."""

    _rank = 20

    def __init__(
        self,
        pd: Pd,
        create: QpCreate,
        srq: Srq | None,
        context: Any,
        event_cb: EventCallback | None,
        port_num: int | None = None,
    ) -> None:
        super().__init__(pd, context)
        self._pd = pd
        self._qp_type = QpType(create.qp_type)
        self._send_cq = create.send_cq
        self._recv_cq = create.recv_cq
        self._srq = srq
        self._event_cb = event_cb
        self._qp_state = QpState.RESET
        # The QP state has its own small locks: error completions and async events
        # update it from poll and from provider upcalls, never under the AL lock.
        self._state_lock = threading.Lock()
        self._modify_lock = threading.Lock()  # one modify at a time per QP
        self._modifying = False
        self._observed = False  # an error was observed while a modify was in flight
        self._num = 0
        self._caps = create.caps()
        self._port_num = port_num
        # Only datagram WRs carry an AV to translate: RC/UC posts go straight through.
        self._translate = self._qp_type.is_datagram or self._qp_type in _RAW
        self._drain_av: Av | None = None
        self._listeners: tuple[EventCallback, ...] = ()  # add_event_listener's, copy-on-write

    def _created(self, handle: Any, attr: QpAttr) -> None:
        self._h = handle
        self._num = attr.qp_num
        self._caps = attr.caps
        self._qp_state = attr.state

    # ------------------------------------------------------------------ attributes
    @property
    def num(self) -> int:
        """The QP number."""
        return self._num

    @property
    def send_cq(self) -> Cq:
        return self._send_cq

    @property
    def recv_cq(self) -> Cq:
        return self._recv_cq

    @property
    def srq(self) -> Srq | None:
        return self._srq

    @property
    def caps(self) -> QpCaps:
        """The sizes the provider granted."""
        return self._caps

    # ------------------------------------------------------------------ control
    def modify(self, mod: QpMod) -> None:
        """``ib_modify_qp``: checked against :mod:`ibal.qp_fsm` before the provider sees it.

        Serialised per QP.  The provider's answer sets the state; if an error
        was reported while the provider worked, or the provider refused, the
        AL asks it (``query_qp``) -- the provider's word wins.  A
        ``current_state`` that differs from what the AL knows is checked
        against the provider too (it may have seen an error the AL has not).
        """
        self._check()
        if not isinstance(mod, QpMod):
            raise InvalidParameter("a QpMod is required")
        ranges.check_qp_mod(mod)
        self._modify(mod, checked=False)

    def modify_validated(self, mod: QpMod) -> None:
        """:meth:`modify` for a layer of ibal whose ``mod`` is built from attributes it
        validated already (the CM's connect modifies): no range or value checks here.

        The transition is still checked against the QP's state (which the caller does
        not own: the QP may have gone to ERROR meanwhile), address vectors are still
        checked (a peer's message names the path), and the provider still checks what
        it checks."""
        self._check()
        for av in (mod.primary_av, mod.alternate_av):
            if av is not None:
                ranges.check_av(av)
        self._modify(mod, checked=True)

    def _modify(self, mod: QpMod, *, checked: bool) -> None:
        with self._modify_lock:
            if mod.current_state is not None and mod.current_state is not self._qp_state:
                self._resync()
            qp_fsm.check_modify(self._qp_type, self._qp_state, mod)
            if not checked:
                self._check_mod_values(mod)
            self._use()
            try:
                with self._state_lock:
                    self._modifying, self._observed = True, False
                try:
                    attr = self._ci.modify_qp(self._h, mod)
                except IbError:
                    self._resync_quietly()
                    raise
                state = attr.state if isinstance(attr, QpAttr) else mod.state
                with self._state_lock:
                    raced = self._observed
                if raced:
                    with contextlib.suppress(IbError):
                        state = self._ci.query_qp(self._h).state
                with self._state_lock:
                    self._qp_state = state
            finally:
                with self._state_lock:
                    self._modifying = False
                self._unuse()
        with self._lock:
            if mod.port_num is not None:
                self._port_num = mod.port_num
            elif mod.state is QpState.RESET and not self._qp_type.is_special:
                self._port_num = None

    def _resync(self) -> None:
        """Take the provider's state (``query_qp``)."""
        self._use()
        try:
            state = self._ci.query_qp(self._h).state
        finally:
            self._unuse()
        with self._state_lock:
            self._qp_state = state

    def _resync_quietly(self) -> None:
        with contextlib.suppress(IbError):
            state = self._ci.query_qp(self._h).state
            with self._state_lock:
                self._qp_state = state

    # ------------------------------------------------------------------ observed state
    def _observe_state(self, new: QpState, reason: str) -> None:
        """The provider reported an error that moves the QP to ``new`` (any thread, cheap).

        The one place besides ``modify``/``query`` that changes ``state``;
        :func:`ibal.qp_fsm.observed_state` says whether ``new`` applies.
        """
        with self._state_lock:
            if self._modifying:
                self._observed = True
            cur = self._qp_state
            nxt = qp_fsm.observed_state(self._qp_type, cur, new)
            self._qp_state = nxt
        if nxt is not cur:
            log.debug("ibal: QP 0x%x %s -> %s (%s)", self._num, cur.name, nxt.name, reason)

    def add_event_listener(self, fn: EventCallback) -> Callable[[], None]:
        """Observe the QP's async events besides its ``event_cb`` (for upper layers: the
        CM learns "communication established" so).  Returns the function that removes it.

        ``fn(AsyncEventRec)`` runs on the misc queue before the ``event_cb``, for each
        event of this QP while it is alive; it must not block, what it raises is logged.
        Raises ``InvalidQpHandle`` when the QP is destroyed, ``InvalidParameter`` when
        ``fn`` is not callable.  Removing twice is harmless.
        """
        if not callable(fn):
            raise InvalidParameter("event listener must be callable")
        self._check()
        with self._state_lock:
            self._listeners = (*self._listeners, fn)

        def remove() -> None:
            with self._state_lock:
                self._listeners = tuple(f for f in self._listeners if f is not fn)

        return remove

    def _observe_event_of(self, cica: object, code: AsyncEvent) -> None:
        if self._cica is cica:
            self._observe_event(code)

    def _event_listeners(self) -> tuple[EventCallback, ...]:
        """The listeners ``add_event_listener`` added (read by the CA's event routing)."""
        return self._listeners

    def _observe_event(self, code: AsyncEvent) -> None:
        """Async-event hook (called by the CA's event upcall, on the provider's thread)."""
        new = _EVENT_STATE.get(code)
        if new is not None:
            self._observe_state(new, code.name)

    def _observe_wc(self, wc: Wc) -> None:
        """Error-completion hook (``Cq.poll``, only for non-success, non-flush statuses).

        IBA 10.8.3: on an RC QP any error completion means ERROR.  On UC/UD a
        send error means SQE, but the completion may be older than a modify
        that already recovered the QP (RTS -> RTS is SQE -> RTS too), and some
        CAs (kernel rxe) move such QPs to ERROR instead: the provider is asked
        (one ``query_qp`` per send error).  A receive error on UC/UD leaves the
        state to the provider's async event.
        """
        if self._qp_type is QpType.RC:
            self._observe_state(QpState.ERROR, wc.status.name)
        elif wc.wc_type not in _RECV_WC:
            try:
                told = self._ci.query_qp(self._h).state
            except IbError:
                self._observe_state(QpState.SQERR, wc.status.name)
                return
            with self._state_lock:
                if self._modifying:
                    self._observed = True
                self._qp_state = told

    def _check_mod_values(self, mod: QpMod) -> None:
        cica = self._cica
        if mod.sq_depth is not None or mod.rq_depth is not None:
            _check_resize(cica, mod, self._srq is not None)
        if mod.port_num is not None and cica.port(mod.port_num) is None:
            raise InvalidPort(f"CA {cica.name} has no port {mod.port_num}")
        port_num = mod.port_num if mod.port_num is not None else self._port_num
        if mod.pkey_index is not None:
            port = cica.port(port_num) if port_num is not None else None
            if type(mod.pkey_index) is not int or mod.pkey_index < 0 or (
                port is not None and mod.pkey_index >= len(port.pkeys)
            ):
                raise InvalidPkey(f"P_Key index {mod.pkey_index} out of range")
        for av in (mod.primary_av, mod.alternate_av):
            if av is not None and cica.port(av.port_num) is None:
                raise InvalidPort(f"CA {cica.name} has no port {av.port_num}")
        if mod.apm_state is not None:
            try:
                ApmState(mod.apm_state)
            except ValueError:
                raise InvalidApmState(f"bad APM state {mod.apm_state!r}") from None

    def query(self) -> QpAttr:
        """``ib_query_qp``: the provider's attributes with the AL's PD/CQ/SRQ handles filled."""
        self._use()
        try:
            attr = self._ci.query_qp(self._h)
        finally:
            self._unuse()
        with self._state_lock:
            self._qp_state = attr.state
        return dataclasses.replace(
            attr, pd=self._pd, send_cq=self._send_cq, recv_cq=self._recv_cq, srq=self._srq
        )

    def init_dgrm_svc(self, info: DgrmInfo | None = None) -> None:
        """``ib_init_dgrm_svc``: RESET → INIT → RTR → RTS for a datagram QP.

        RC/UC QPs raise ``InvalidParameter``; UD/MAD QPs need ``info``; QP0/QP1
        default to their port and well-known Q_Key; a failure part way moves the
        QP back to RESET.
        """
        self._check()
        qt = self._qp_type
        if not (qt.is_datagram or qt in _RAW):
            raise InvalidParameter(f"init_dgrm_svc is for datagram QPs, not {qt.name}")
        if info is not None and not isinstance(info, DgrmInfo):
            raise InvalidParameter("a DgrmInfo is required")
        if self._qp_state is not QpState.RESET:
            raise InvalidQpState(f"QP is {self._qp_state.name}, init_dgrm_svc needs RESET")
        cica = self._cica
        if qt.is_special:
            port_num = self._port_num
            if info is not None and info.port_guid:
                port = cica.port_by_guid(info.port_guid)
                if port is None or port.port_num != port_num:
                    raise InvalidParameter("a special QP stays on the port it was created on")
        else:
            if info is None:
                raise InvalidParameter(f"{qt.name} QPs need a DgrmInfo")
            port = cica.port_by_guid(info.port_guid)
            if port is None:
                raise InvalidParameter(f"no port with GUID 0x{info.port_guid:x} on this CA")
            port_num = port.port_num
        if info is not None:
            qkey, pkey_index = info.qkey, info.pkey_index
        else:
            qkey = QP1_WELL_KNOWN_QKEY if qt in (QpType.QP1, QpType.QP1_ALIAS) else 0
            pkey_index = 0
        init = (
            QpMod(QpState.INIT, pkey_index=pkey_index, qkey=qkey)
            if qt.is_special
            else QpMod(QpState.INIT, pkey_index=pkey_index, qkey=qkey, port_num=port_num)
        )
        steps = (init, QpMod(QpState.RTR), QpMod(QpState.RTS, sq_psn=0))
        for i, mod in enumerate(steps):
            try:
                self.modify(mod)
            except IbError:
                if i:
                    self._back_to_reset()
                raise

    def _back_to_reset(self) -> None:
        with contextlib.suppress(IbError):  # the original error is what the caller needs
            self.modify(QpMod(QpState.RESET))

    def destroy(
        self,
        destroy_cb: DestroyCallback | SyncDestroy | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """``ib_destroy_qp``: asynchronous; detaches multicast groups first."""
        self._destroy(destroy_cb, wait, timeout)

    def _cleanup(self) -> None:
        self._ci.destroy_qp(self._h, 0)

    # ------------------------------------------------------------------ multicast
    def attach_mcast(self, gid: Gid | bytes | str, lid: int) -> McastAttachment:
        """``ci_attach_mcast``: this UD QP joins the group ``(gid, lid)`` on the CA."""
        self._check()
        if not self._cica.capabilities.multicast:
            raise Unsupported(self._cica.capabilities.reason("multicast"))
        if self._qp_type is not QpType.UD:
            raise InvalidServiceType(f"{self._qp_type.name} QPs cannot join multicast groups")
        try:
            mgid = gid if isinstance(gid, Gid) else Gid(gid)
        except (ValueError, TypeError):
            raise InvalidGid(f"{gid!r} is not a GID") from None
        if not _is_multicast_gid(mgid, roce=self._roce()):
            raise InvalidGid(f"{mgid} is not a multicast GID")
        if type(lid) is not int:
            raise InvalidLid("the LID must be an int")
        if not self._roce() and not MULTICAST_LID_BASE <= lid < PERMISSIVE_LID:
            raise InvalidLid(f"0x{lid:x} is not a multicast LID")
        m = McastAttachment(self, mgid, lid)

        def make() -> None:
            m._h = self._ci.attach_mcast(self._h, mgid, lid)

        return self._spawn(m, make)

    def _roce(self) -> bool:
        """On RoCE ports multicast LIDs mean nothing, so they are not checked."""
        ports = self._cica.attr.ports
        port = self._cica.port(self._port_num) if self._port_num is not None else None
        if port is None:
            port = ports[0] if ports else None
        return port is not None and port.link_layer is LinkLayer.ETHERNET


def _is_multicast_gid(gid: Gid, *, roce: bool) -> bool:
    """IB multicast GIDs are ff00::/8; RoCE v2 over IPv4 also uses IPv4-mapped
    multicast groups (``::ffff:224.0.0.0/100``), as rdma_cm does."""
    if gid.is_multicast:
        return True
    mapped = gid.ipv4_mapped
    return roce and mapped is not None and mapped.is_multicast


class McastAttachment(CaObject):
    """A QP's membership of a multicast group; ``detach()`` ends it."""

    _invalid = InvalidMcastHandle
    _rank = 0
    _kind = "multicast"
    _sync_destroy = True

    def __init__(self, qp: Qp, gid: Gid, lid: int) -> None:
        super().__init__(qp)
        self._qp = qp
        self.gid = gid
        self.lid = lid

    @property
    def qp(self) -> Qp:
        return self._qp

    def detach(self) -> None:
        """``ci_detach_mcast``: synchronous."""
        self._destroy_now()

    def _cleanup(self) -> None:
        self._ci.detach_mcast(self._h)


def created(qp: Qp, handle: Any, attr: QpAttr) -> None:
    """The provider made ``qp``: its handle and the attributes it granted."""
    qp._created(handle, attr)


def observe_event(qp: Qp, cica: object, code: AsyncEvent) -> None:
    """The CA's event upcall (provider's thread): ``qp``'s state moves now, not when
    the event is routed; ignored unless ``qp`` is ``cica``'s."""
    qp._observe_event_of(cica, code)


def event_listeners(qp: Qp) -> tuple[EventCallback, ...]:
    """What ``add_event_listener`` added to ``qp`` (read by the CA's event routing)."""
    return qp._event_listeners()
