"""IBMF alternate QPs (``ibmf_alloc_qp`` / ``_query_qp`` / ``_modify_qp`` / ``_free_qp``).

A registered MAD client (a :class:`~ibal.mad.service.MadService`, IBMF's
``ibmf_handle_t``) may run MAD traffic on a UD QP of its own, with its own
P_Key and Q_Key, instead of QP1: vendor classes, or a Q_Key that keeps
strangers out.  :func:`alloc_qp` makes one (``ibmf_qp_handle_t``); it is
built on the AL's public API only: a UD QP, one CQ, one registered buffer
(receive slots with their 40-byte GRH area, send slots) and an AV per send,
all owned here.  Receives stay posted; requests go to ``recv_cb``;
responses are matched to their request by TID (the sans-IO
:class:`~ibal.wire.mad.tid.Pending`) and time out and retry on the AL's timers,
so a ``ManualClock`` steps them.

Threads: ``send_cb`` and ``recv_cb`` run on AL callback threads (the CQ's
dispatcher, or the misc queue for time-outs) and must not block.
:meth:`AltQp.send`, :meth:`~AltQp.modify` and :meth:`~AltQp.free` may be
called from any thread.  Errors: ``InvalidQpHandle`` once freed (IBMF's
``IBMF_BAD_QP_HANDLE``), ``InvalidHandle`` for a deregistered service
(``IBMF_BAD_HANDLE``), ``InvalidSetting`` for bad flags (``IBMF_BAD_FLAGS``),
``Unsupported`` for RMPP or raw traffic (``IBMF_NOT_SUPPORTED``),
``InvalidParameter`` for bad arguments (``IBMF_INVALID_ARG``),
``InvalidPkey`` for a P_Key not in the port's table.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ibal.al import Av, Cq, Mr, Qp, QpCreate, read_mad_slot
from ibal.mad.pool import ElementState, MadElement
from ibal.mad.service import MadService
from ibal.mad.svc import svc_oui
from ibal.status import (
    IbError,
    InsufficientResources,
    InvalidHandle,
    InvalidParameter,
    InvalidPkey,
    InvalidQpHandle,
    InvalidSetting,
    ResourceBusy,
    Unsupported,
)
from ibal.types import (
    MAD_SIZE,
    AccessFlags,
    AvAttr,
    DgrmInfo,
    Grh,
    MadAddr,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    UdDest,
    Wc,
    WcStatus,
    WcType,
    WrType,
    is_int,
    mad_vendor_oui,
)
from ibal.wire.mad.tid import Pending

GRH_LEN = 40
_SLOT = GRH_LEN + MAD_SIZE
RECV_DEPTH = 32
SEND_DEPTH = 32
_PKEY_BASE = 0x7FFF  # a P_Key without its membership bit


class AltQpFlags(enum.IntFlag):
    """``ibmf_alloc_qp`` flags: exactly one; only MAD traffic without RMPP is served."""

    MAD_NO_RMPP = 0x1
    MAD_RMPP = 0x2
    RAW_ONLY = 0x4


@dataclass(frozen=True, slots=True)
class AltQpAttr:
    """What ``ibmf_query_qp`` reports."""

    qp_num: int
    pkey: int
    qkey: int
    port_num: int


Callback = Callable[[MadElement], object]


def alloc_qp(
    service: MadService,
    pkey: int,
    qkey: int,
    flags: AltQpFlags = AltQpFlags.MAD_NO_RMPP,
    *,
    recv_cb: Callback | None = None,
    send_cb: Callback | None = None,
) -> AltQp:
    """``ibmf_alloc_qp``: a UD QP for ``service``'s MADs on its port, with ``pkey``/``qkey``.

    ``recv_cb(element)`` gets the requests that arrive (elements of the
    service's pool key: give them back with ``put_mad``) and the responses to
    this QP's requests (linked through ``element.request``); ``send_cb``
    reports every send once, with ``element.status``.
    """
    if not isinstance(service, MadService):
        raise InvalidHandle("an IBMF handle (MadService) is required")
    service.hi_tid  # noqa: B018  (InvalidHandle once the service is deregistered)
    if not isinstance(flags, int) or flags not in (1, 2, 4):
        raise InvalidSetting("exactly one of MAD_NO_RMPP, MAD_RMPP, RAW_ONLY")
    if flags != AltQpFlags.MAD_NO_RMPP:
        raise Unsupported(f"alternate QPs carry MADs without RMPP, not {AltQpFlags(flags)!r}")
    for cb in (recv_cb, send_cb):
        if cb is not None and not callable(cb):
            raise InvalidParameter("recv_cb and send_cb must be callable")
    return AltQp(service, pkey, qkey, recv_cb, send_cb)


@dataclass(eq=False)
class _Send:
    element: MadElement
    on_wire: int = 0


class AltQp:
    """``ibmf_qp_handle_t`` other than the default: a service's own UD QP (see :func:`alloc_qp`)."""

    def __init__(
        self,
        service: MadService,
        pkey: int,
        qkey: int,
        recv_cb: Callback | None,
        send_cb: Callback | None,
    ) -> None:
        _check_keys(pkey, qkey)
        self.service = service
        self.stats: Counter[str] = Counter()
        """Received MADs dropped here, by reason."""
        self._recv_cb = recv_cb
        self._send_cb = send_cb
        self._lock = threading.Lock()
        self._pending: Pending[_Send] = Pending(service.svc.mgmt_class)
        self._slots: dict[int, tuple[_Send | None, Av]] = {}  # send slot -> send, its AV
        self._free_slots = list(range(RECV_DEPTH, RECV_DEPTH + SEND_DEPTH))
        self._freed = False
        alias = service.alias
        pd = alias.pd
        self._port_num = alias.port_num
        self._port = next(p for p in pd.ca.query().ports if p.port_num == self._port_num)
        pkey_index = self._pkey_index(pkey)
        self._pkey, self._qkey = pkey, qkey
        self._buf = bytearray(_SLOT * (RECV_DEPTH + SEND_DEPTH))
        self._timers = pd.al.timers
        self._cq: Cq = pd.ca.create_cq(RECV_DEPTH + SEND_DEPTH, comp_cb=self._on_comp)
        try:
            self._mr: Mr = pd.reg_mem(self._buf, AccessFlags.LOCAL_WRITE)
            self._qp: Qp = pd.create_qp(
                QpCreate(QpType.UD, self._cq, self._cq, sq_depth=SEND_DEPTH, rq_depth=RECV_DEPTH)
            )
            self._qp.init_dgrm_svc(DgrmInfo(self._port.port_guid, qkey, pkey_index))
            self._qp.post_recv([self._recv_wr(i) for i in range(RECV_DEPTH)])
            self._cq.rearm()
        except BaseException:
            self._teardown()
            raise

    def __repr__(self) -> str:
        return f"<AltQp QP{self._qp.num} P_Key 0x{self._pkey:04x} Q_Key 0x{self._qkey:08x}>"

    # ------------------------------------------------------------------ IBMF verbs
    def query(self) -> AltQpAttr:
        """``ibmf_query_qp``: QP number, P_Key, Q_Key and port."""
        self._check()
        return AltQpAttr(self._qp.num, self._pkey, self._qkey, self._port_num)

    def modify(self, pkey: int, qkey: int) -> None:
        """``ibmf_modify_qp``: new P_Key and Q_Key.

        A new Q_Key alone is an RTS-to-RTS modify.  A UD QP takes its P_Key only
        on the way to INIT, so a new P_Key takes the QP through RESET (receives
        are posted again); ``ResourceBusy`` while sends are on the wire then.
        """
        self._check()
        _check_keys(pkey, qkey)
        index = self._pkey_index(pkey)
        with self._lock:
            if pkey == self._pkey:
                self._qp.modify(QpMod(QpState.RTS, qkey=qkey))
            else:
                if self._slots:
                    raise ResourceBusy("sends are on the wire: a new P_Key resets the QP")
                self._qp.modify(QpMod(QpState.RESET))
                self._qp.init_dgrm_svc(DgrmInfo(self._port.port_guid, qkey, index))
                self._qp.post_recv([self._recv_wr(i) for i in range(RECV_DEPTH)])
            self._pkey, self._qkey = pkey, qkey

    def free(self) -> None:
        """``ibmf_free_qp``: pending sends complete ``CANCELED`` (``send_cb``), then the
        QP and its resources go."""
        with self._lock:
            if self._freed:
                raise InvalidQpHandle("the alternate QP is already freed")
            self._freed = True
            canceled = [s for _key, s in self._pending.drain()]
        self._timers.cancel_owner(self)
        for s in canceled:
            self._complete(s, WcStatus.CANCELED)
        self._teardown()

    @property
    def outstanding(self) -> int:
        """Sends not yet reported by ``send_cb``."""
        return len(self._pending)

    # ------------------------------------------------------------------ sending
    def send(self, element: MadElement) -> None:
        """``ibmf_msg_transport`` on this QP: one MAD element to ``element.addr``.

        A request with ``resp_expected`` waits ``timeout_ms`` for its response,
        at most ``1 + retry_cnt`` times; one whose TID is 0 gets one.  The
        remote Q_Key is ``element.addr.remote_qkey``.
        """
        self._check()
        e = _check_element(element)
        request = e.resp_expected and not e.is_response
        with self._lock:
            if self._freed:
                raise InvalidQpHandle("the alternate QP is freed")
            if request and e.tid == 0:
                e.tid = self._pending.fresh_tid()
            s = _Send(e)
            key = self._pending.add(s, e.tid if request else None, e.retry_cnt)
            try:
                self._post(s)
            except BaseException:
                self._pending.end(key)
                raise
            e.state = ElementState.SENDING
            if request:
                self._arm(key)

    def _post(self, s: _Send) -> None:
        """Put ``s`` on the wire once more (caller holds the lock)."""
        if not self._free_slots:
            raise InsufficientResources(f"{SEND_DEPTH} MADs already in flight on this QP")
        e, addr = s.element, s.element.addr
        assert addr is not None
        av = self._qp.pd.create_av(
            AvAttr(self._port_num, addr.dlid, addr.sl, addr.grh, 0, addr.path_bits)
        )
        slot = self._free_slots.pop()
        off = slot * _SLOT
        self._buf[off : off + MAD_SIZE] = e.mad
        wr = SendWr(slot, WrType.SEND, [self._mr.sge(off, MAD_SIZE)],
                    ud=UdDest(av, addr.remote_qp, addr.remote_qkey, addr.pkey_index))
        self._slots[slot] = (s, av)
        try:
            self._qp.post_send([wr])
        except BaseException:
            del self._slots[slot]
            self._free_slots.append(slot)
            av.destroy()
            raise
        s.on_wire += 1

    def _arm(self, key: int) -> None:
        s = self._pending.get(key)
        if s is not None:
            delay = s.element.timeout_ms / 1000
            self._timers.call_later(delay, self._expired, key, s, owner=self)

    def _expired(self, key: int, s: _Send) -> None:
        """Misc queue: a response time-out ran out: send again, or give up."""
        with self._lock:
            if self._freed or self._pending.get(key) is not s:
                return
            if self._pending.retry(key):
                try:
                    self._post(s)
                    self._arm(key)
                    return
                except IbError:
                    pass
            self._pending.end(key)
        self._complete(s, WcStatus.TIMEOUT_RETRY_ERR)

    def _complete(self, s: _Send, status: WcStatus) -> None:
        e = s.element
        e.status = status
        e.state = ElementState.USER
        if self._send_cb is not None:
            self._send_cb(e)

    # ------------------------------------------------------------------ completions
    def _on_comp(self, cq: Cq, _context: Any) -> None:
        """Dispatcher: drain, rearm, drain again (nothing slips between)."""
        for rearm in (False, True, False):
            if self._freed:
                return
            try:
                if rearm:
                    cq.rearm()
                    continue
                wcs = cq.poll(RECV_DEPTH + SEND_DEPTH)
            except IbError:  # freed meanwhile
                return
            for wc in wcs:
                if wc.wc_type is WcType.RECV:
                    self._received(wc)
                else:
                    self._sent(wc)

    def _sent(self, wc: Wc) -> None:
        with self._lock:
            s, av = self._slots.pop(wc.wr_id, (None, None))
            self._free_slots.append(wc.wr_id)
            if s is not None:
                s.on_wire -= 1
            done = (
                s is not None and not s.on_wire
                and (wc.status is not WcStatus.SUCCESS or not self._pending.awaits(s))
                and self._pending.remove(s)
            )
        if av is not None:
            av.destroy()
        if done:
            assert s is not None
            self._complete(s, wc.status)

    def _received(self, wc: Wc) -> None:
        slot = wc.wr_id
        off = slot * _SLOT
        try:
            got = read_mad_slot(self._buf, off, wc, self.stats)
            if got is not None:
                self._deliver(*got, wc)
        finally:
            if not self._freed:
                with contextlib.suppress(IbError):  # freed meanwhile
                    self._qp.post_recv([self._recv_wr(slot)])

    def _deliver(self, mad: bytes, grh: Grh | None, wc: Wc) -> None:
        if mad[0] != 1:
            self.stats["dropped_bad_version"] += 1
            return
        svc = self.service.svc
        if mad[1] != svc.mgmt_class or mad[2] != svc.mgmt_version:
            self.stats["dropped_wrong_class"] += 1
            return
        request: _Send | None = None
        if mad[3] & 0x80 or mad[3] == 0x07:  # a response (or TrapRepress)
            with self._lock:
                request = self._pending.answer(int.from_bytes(mad[8:16], "big"), mad)
            if request is None:
                self.stats["dropped_unmatched_response"] += 1
                return
        elif self._recv_cb is None:
            self.stats["dropped_unsolicited"] += 1
            return
        elif mad_vendor_oui(mad) != svc_oui(svc):  # another vendor's class: not ours
            self.stats["dropped_wrong_oui"] += 1
            return
        try:
            e = self.service.pool_key.get_mad(MAD_SIZE)
        except IbError:
            self.stats["dropped_no_element"] += 1
            if request is not None:
                self._complete(request, WcStatus.SUCCESS)
            return
        e.mad[:] = mad
        e.addr = MadAddr(remote_qp=wc.src_qp, remote_qkey=self._qkey, dlid=wc.slid, sl=wc.sl,
                         path_bits=wc.path_bits, pkey_index=wc.pkey_index, grh=grh)
        e.port_num, e.qp_num = self._port_num, self._qp.num
        if request is not None:
            self._complete(request, WcStatus.SUCCESS)  # the answer proves the send
            req = request.element
            e.request, e.send_context1, e.send_context2 = req, req.context1, req.context2
        if self._recv_cb is not None:
            self._recv_cb(e)

    # ------------------------------------------------------------------ helpers
    def _check(self) -> None:
        if self._freed:
            raise InvalidQpHandle("the alternate QP is freed")

    def _pkey_index(self, pkey: int) -> int:
        for i, p in enumerate(self._port.pkeys):
            if p == pkey:
                return i
        raise InvalidPkey(f"P_Key 0x{pkey:04x} is not in port {self._port_num}'s table")

    def _recv_wr(self, slot: int) -> RecvWr:
        return RecvWr(slot, [self._mr.sge(slot * _SLOT, _SLOT)])

    def _teardown(self) -> None:
        """Resources in dependency order; each may be missing after a failed set-up."""
        qp, mr, cq = (getattr(self, n, None) for n in ("_qp", "_mr", "_cq"))
        with self._lock:
            avs = [av for _s, av in self._slots.values()]
            self._slots.clear()

        def rest(_ctx: Any = None) -> None:
            for av in avs:
                _quietly(av.destroy)
            if isinstance(mr, Mr):
                _quietly(mr.dereg)
            if isinstance(cq, Cq):
                _quietly(cq.destroy)

        if isinstance(qp, Qp):
            try:
                qp.destroy(rest)  # its completions stop first; then the rest can go
            except IbError:
                rest()
        else:
            rest()


def _quietly(fn: Callable[[], object]) -> None:
    with contextlib.suppress(IbError):  # the CA may already be going away
        fn()


def _check_keys(pkey: object, qkey: object) -> None:
    if not is_int(pkey) or not 0 < pkey <= 0xFFFF or not pkey & _PKEY_BASE:
        raise InvalidParameter(f"P_Key {pkey!r} is not a valid 16-bit P_Key")
    if not is_int(qkey) or not 0 <= qkey <= 0xFFFFFFFF:
        raise InvalidParameter(f"Q_Key {qkey!r} is not a 32-bit value")


def _check_element(e: object) -> MadElement:
    if not isinstance(e, MadElement):
        raise InvalidParameter("a MadElement is required")
    if e.state is not ElementState.USER:
        raise InvalidParameter(f"the element is {e.state.value}, not the caller's")
    if len(e.mad) != MAD_SIZE or e.addr is None:
        raise InvalidParameter(f"a MAD element of {MAD_SIZE} bytes with an address")
    if e.resp_expected and e.timeout_ms <= 0:
        raise InvalidParameter("a request that waits for an answer needs timeout_ms > 0")
    if e.rmpp_version:
        raise Unsupported("alternate QPs carry MADs without RMPP")
    return e
