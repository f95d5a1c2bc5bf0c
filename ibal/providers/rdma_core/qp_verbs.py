"""Queue pair verbs of an rdma_core CA: create, modify, query, destroy and post.

A QP's send and receive queues are :mod:`.wr`'s (pyverbs) or :mod:`.fastpath`'s
(ctypes) objects.  Sends posted in SQD may be held until SQD -> RTS, and posts
to a QP in ERROR complete flushed; what kernel rxe needs for both is in
:mod:`.quirks`.  Called by the access layer on any thread; raises
:mod:`ibal.status` exceptions (posts raise ``PostError``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Sequence
from typing import Any

from ibal import qp_fsm
from ibal.ci.interface import (
    Handle,
    QpCreated,
)
from ibal.providers.rdma_core import consts as C
from ibal.providers.rdma_core import peek
from ibal.providers.rdma_core.errors import translate
from ibal.providers.rdma_core.fastpath import (
    FastRecvQueue,
    FastSendQueue,
)
from ibal.providers.rdma_core.handles import (
    Qp,
)
from ibal.providers.rdma_core.qp_attr import QpAttrs
from ibal.providers.rdma_core.wr import (
    Held,
    RecvQueue,
    SendQueue,
    flush_tuples,
)
from ibal.qp_fsm import can_post_recv
from ibal.status import (
    IbError,
    InvalidMaxSge,
    InvalidMaxWrs,
    InvalidParameter,
    InvalidQpState,
    InvalidServiceType,
    InvalidSrqHandle,
    PostError,
    ResourceBusy,
    Status,
    Unsupported,
    post_error,
)
from ibal.types import (
    QpAttr,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendWr,
)

log = logging.getLogger("ibal.providers.rdma_core")


class QpVerbs(QpAttrs):
    """``create_qp`` ... ``destroy_qp``, ``post_send``, ``post_recv``."""

    def create_qp(
        self,
        h_pd: Handle,
        qp_type: QpType,
        caps: QpCaps,
        send_cq: Handle,
        recv_cq: Handle,
        srq: Handle | None,
        sq_signaled: bool,
        qp_context: Any,
    ) -> QpCreated:
        pd = self._pd(h_pd)
        scq = self._cq(send_cq)
        rcq = self._cq(recv_cq)
        s = self._srq(srq) if srq is not None else None
        if s is not None and s.pd is not pd:
            raise InvalidSrqHandle("the SRQ belongs to another PD than the QP (IBA 10.2.3)")
        ibv_type = C.QPT_TO_IBV.get(qp_type)
        if ibv_type is None or qp_type not in self._caps.qp_types:
            raise InvalidServiceType(f"{qp_type!r} QPs are not available on {self.name}")
        d = self.dev
        depths = (caps.sq_depth,) + (() if s is not None else (caps.rq_depth,))
        if any(x < 0 or x > int(d.max_qp_wr) for x in depths):
            raise InvalidMaxWrs(f"queue depth above the device's {int(d.max_qp_wr)}")
        sges = (caps.sq_sge,) + (() if s is not None else (caps.rq_sge,))
        if any(x < 0 or x > int(d.max_sge) for x in sges):
            raise InvalidMaxSge(f"SGE count above the device's {int(d.max_sge)}")
        if caps.max_inline < 0:
            raise InvalidParameter("negative max_inline")
        q = self.pv.qp
        with self._lock:
            qp = Qp(self, pd, qp_type, qp_context)
            cap = q.QPCap(
                max_send_wr=caps.sq_depth,
                max_recv_wr=0 if s is not None else caps.rq_depth,
                max_send_sge=caps.sq_sge,
                max_recv_sge=0 if s is not None else caps.rq_sge,
                max_inline_data=caps.max_inline,
            )
            ia = q.QPInitAttr(
                qp_type=ibv_type,
                qp_context=qp,
                scq=scq.pv,
                rcq=rcq.pv,
                srq=s.pv if s is not None else None,
                cap=cap,
                sq_sig_all=1 if sq_signaled else 0,
            )
            try:
                pv = q.QP(pd.pv, ia)
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_create_qp") from exc
            qp.pv = pv
            qp.num = int(pv.qp_num)
            granted = QpCaps(
                sq_depth=int(ia.max_send_wr),
                rq_depth=0 if s is not None else int(ia.max_recv_wr),
                sq_sge=int(ia.max_send_sge),
                rq_sge=0 if s is not None else int(ia.max_recv_sge),
                max_inline=int(ia.max_inline_data),
            )
            qp.caps = granted
            qp.sq_signaled = bool(sq_signaled)
            qp.send_cq, qp.recv_cq, qp.srq = scq, rcq, s
            if self.layout is not None:
                try:
                    qp.ptr = self.layout.qp_ptr(pv, pd.pv, self.ctx)
                except peek.PeekError as exc:
                    log.debug("rdma_core %s: QP pointer not found: %s", self.name, exc)
            qp.sq = self._send_queue(qp, qp_type, granted)
            if s is None:
                if self.ops is not None and qp.ptr:
                    qp.rq = FastRecvQueue(self.ops.post_recv, qp.ptr, max_sge=granted.rq_sge,
                                          tokens=self.tokens, owner=qp)  # fmt: skip
                else:
                    qp.rq = RecvQueue(self.api, pv.post_recv, max_sge=granted.rq_sge,
                                      tokens=self.tokens, owner=qp)  # fmt: skip
                rcq.orphans.append(qp.rtok)
            pd.users += 1
            scq.users += 1
            rcq.users += 1
            if s is not None:
                s.users += 1
            self._qps[qp.num] = qp
            self._n["qp"] += 1
            self._sq_accts[qp.num] = qp.sq.acct
            if qp_type is QpType.UD:
                self._ud_qpns.add(qp.num)
                if s is None:
                    self._areas.add_qp(qp.num)
            return QpCreated(qp, self._qp_attr_basic(qp))

    def _send_queue(self, qp: Qp, qp_type: QpType, granted: QpCaps) -> SendQueue | FastSendQueue:
        """The QP's send queue: the ctypes fast path where its ``ibv_qp *`` is known, else
        pyverbs; either takes the same granted shape."""
        shape: dict[str, Any] = {
            "max_sge": granted.sq_sge, "max_inline": granted.max_inline,
            "depth": granted.sq_depth, "atomics": self._caps.atomics,
            "allowed": self._caps.opcodes.get(qp_type, frozenset()),
            "all_signaled": qp.sq_signaled,
        }  # fmt: skip
        if self.ops is not None and qp.ptr:
            return FastSendQueue(self.ops, qp.ptr, qp_type, ah_ptr_of=self._ah_ptr_of,
                                 bind_of=self._bind_ptr_of, **shape)  # fmt: skip
        return SendQueue(self.api, qp.pv.post_send, qp_type, ah_of=self._ah_of,
                         bind_of=self._bind_pv_of, **shape)  # fmt: skip

    def modify_qp(self, h_qp: Handle, mod: QpMod) -> QpAttr:
        qp = self._qp(h_qp)
        if (mod.alternate_av is not None or mod.apm_state is not None) and not (
            self.capabilities.apm
        ):
            # The kernel would take them (rxe advertises APM and never migrates).
            raise Unsupported(f"apm: {self.capabilities.reason('apm')}")
        try:
            attr, mask = self._modify_attr(qp, mod)
        except (OverflowError, TypeError) as exc:
            raise InvalidParameter(f"modify_qp: {exc}") from exc
        lost: Held = []
        with self._lock:
            old_state = qp.state
            try:
                qp.pv.modify(attr, mask)
            except self._errs.PyverbsError as exc:
                if qp_fsm.rule(qp.qp_type, old_state, mod.state) is None:
                    # the kernel says EINVAL for any bad modify; the contract names this one
                    raise InvalidQpState(
                        f"ibv_modify_qp: {old_state.name} -> {mod.state.name} is no transition"
                    ) from exc
                raise translate(
                    exc, f"ibv_modify_qp to {mod.state.name}", {errno.EOPNOTSUPP: Unsupported}
                ) from exc
            qp.state = mod.state
            if mod.port_num is not None:
                qp.port_num = mod.port_num
            if mod.pkey_index is not None:
                qp.pkey_index = mod.pkey_index
            if mod.local_ack_timeout is not None:
                qp.timeout = mod.local_ack_timeout
            if mod.primary_av is not None:
                qp.primary_av = mod.primary_av
            if mod.alternate_av is not None:
                qp.alternate_av = mod.alternate_av
            if mod.sq_depth is not None or mod.rq_depth is not None:
                qp.caps = QpCaps(
                    sq_depth=int(attr.cap.max_send_wr),
                    rq_depth=int(attr.cap.max_recv_wr),
                    sq_sge=qp.caps.sq_sge,
                    rq_sge=qp.caps.rq_sge,
                    max_inline=qp.caps.max_inline,
                )
            sq = qp.sq
            assert sq is not None
            if mod.state is QpState.RESET:
                self._areas.reset(qp.num)
                qp.primary_av = qp.alternate_av = None
                sq.drop_held()
                sq.acct.reset()
                if qp.srq is None and qp.rtok:
                    # Completions already queued may still name these receives.
                    assert qp.recv_cq is not None
                    qp.recv_cq.orphans.append(qp.rtok)
                    qp.rtok = set()
            elif old_state is QpState.SQD and mod.state is not QpState.SQD:
                lost = sq.release()  # sends held in SQD run now (and flush on ERROR)
            result = self._query(qp)
        if lost:
            self._complete_flushed(qp, lost)
        return result

    def query_qp(self, h_qp: Handle) -> QpAttr:
        return self._query(self._qp(h_qp))

    def destroy_qp(self, h_qp: Handle, timewait_us: int = 0) -> None:
        qp = self._qp(h_qp)
        with self._lock:
            if qp.mcast:
                raise ResourceBusy(
                    f"QP {qp.num} is still attached to {len(qp.mcast)} multicast groups"
                )
            sq, rq = qp.sq, qp.rq
            assert sq is not None

            def destroy() -> None:
                with sq.lock, rq.lock if rq is not None else contextlib.nullcontext():
                    qp.pv.close()
                    # Under the same locks: a post that raced the destroy and waits
                    # for them must find the queues closed, never the freed ibv_qp.
                    sq.closed = True
                    if rq is not None:
                        rq.closed = True

            self._retire(qp, destroy, "ibv_destroy_qp")
            sq.close()
            if rq is not None:
                rq.close()
            self._qps.pop(qp.num, None)
            self._n["qp"] -= 1
            self._ud_qpns.discard(qp.num)
            self._areas.drop_qp(qp.num)
            self._sq_accts.pop(qp.num, None)
            qp.pd.users -= 1
            assert qp.send_cq is not None and qp.recv_cq is not None
            qp.send_cq.users -= 1
            qp.recv_cq.users -= 1
            if qp.srq is not None:
                qp.srq.users -= 1

    def post_send(self, h_qp: Handle, wrs: Sequence[SendWr]) -> None:
        qp = h_qp
        if qp.__class__ is not Qp or qp.ci is not self or not qp.alive:
            raise post_error(Status.INVALID_QP_HANDLE, 0, "invalid or destroyed QP")
        if self._errored:
            self._refresh_state(qp)
        state = qp.state
        if state is QpState.RTS:
            qp.sq.post(wrs)  # type: ignore[union-attr]  # set for every live QP
        elif state is QpState.SQD:
            # A device queues sends posted in SQD until RTS; rxe does not restart a
            # drained send queue on SQD -> RTS: hold them (validated) until then.
            qp.sq.post(wrs, hold=self.quirks.hold_sends_in_sqd)  # type: ignore[union-attr]
        elif state is QpState.ERROR or state is QpState.SQERR:
            # IBA 10.8.3: accepted and completed WR_FLUSHED_ERR by the device; rxe's
            # requester flushes only when it runs, so nudge it as for receives.
            qp.sq.post(wrs)  # type: ignore[union-attr]
            if state is QpState.ERROR:
                self.quirks.posted_in_error(qp)
        else:
            raise post_error(Status.INVALID_QP_STATE, 0, f"QP is in {state.name}")

    def post_recv(self, h_qp: Handle, wrs: Sequence[RecvWr]) -> None:
        qp = h_qp
        if qp.__class__ is not Qp or qp.ci is not self or not qp.alive:
            raise post_error(Status.INVALID_QP_HANDLE, 0, "invalid or destroyed QP")
        if self._errored:
            self._refresh_state(qp)
        if not can_post_recv(qp.state):
            raise post_error(Status.INVALID_QP_STATE, 0, f"QP is in {qp.state.name}")
        rq = qp.rq
        if rq is None:
            raise post_error(Status.INVALID_PARAMETER, 0, "the QP receives through its SRQ")
        if qp.qp_type is QpType.UD:
            try:
                post_recv_limited(rq, wrs, qp.caps.rq_depth - len(qp.rtok))
            except PostError as exc:
                self._areas.posted(qp.num, wrs[: exc.failed_index])
                raise
            self._areas.posted(qp.num, wrs)
        else:
            post_recv_limited(rq, wrs, qp.caps.rq_depth - len(qp.rtok))
        if qp.state is QpState.ERROR:
            self.quirks.posted_in_error(qp)

    def _complete_flushed(self, qp: Qp, lost: Held) -> None:
        """Complete send requests that never reached the device with ``WR_FLUSHED_ERR``.

        Called without the CA lock; upcalls once if the CQ was armed.
        """
        cq = qp.send_cq
        assert cq is not None
        if cq.add_flushed(flush_tuples(lost, qp.num)):
            self.completion_upcall(cq)

    def _refresh_state(self, qp: Qp) -> None:
        """An error completion was polled for ``qp``: the kernel may have moved it to
        ERROR (rxe does for every error), which the cached state does not know yet;
        posts there must be flushed, so ask once (``ibv_query_qp``)."""
        if qp.num not in self._errored:
            return
        self._errored.discard(qp.num)
        with contextlib.suppress(IbError):
            self._query(qp)


def post_recv_limited(rq: RecvQueue | FastRecvQueue, wrs: Sequence[RecvWr], room: int) -> None:
    """Post what fits in ``room``; the rest fails with ``INSUFFICIENT_RESOURCES``."""
    n = len(wrs)
    if n <= room:
        rq.post(wrs)
        return
    room = max(room, 0)
    if room:
        rq.post(wrs[:room])
    raise post_error(Status.INSUFFICIENT_RESOURCES, room, "receive queue full")
