"""Posting send and receive work requests.

Called by the access layer on any thread under the fabric lock; never blocks;
raises the :mod:`ibal.status` exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ibal.ci.interface import (
    Handle,
)
from ibal.providers import checks
from ibal.providers.mock.objects import (
    MockAv,
    MockMr,
    MockMw,
    MockQp,
    RecvWqe,
    SendWqe,
)
from ibal.status import (
    Status,
    post_error,
)
from ibal.types import (
    QpType,
    RecvWr,
    SendWr,
    WcStatus,
    WrType,
)

if TYPE_CHECKING:
    pass

from ibal.providers.mock.ca_state import (
    ERROR,
    FENCE,
    FLUSHING,
    IMMEDIATE,
    INLINE,
    OPCODES,
    RESET,
    RTS,
    SIGNALED,
    SOLICITED,
    SQD,
    SQERR,
    CaState,
)


class PostVerbs(CaState):
    """Posting send and receive work requests."""

    def post_send(self, h_qp: Handle, wrs: Sequence[SendWr]) -> None:
        fab = self._engine
        try:
            with fab.lock:
                if fab.verb_faults_armed:
                    fab.faults.check_verb("post_send", self)
                qp = h_qp
                if type(qp) is not MockQp or qp.ca is not self or not qp.alive:
                    raise post_error(Status.INVALID_QP_HANDLE, 0, f"not a QP of {self.name}")
                state = qp.state
                if state is not RTS and state is not SQD and state not in FLUSHING:
                    raise post_error(Status.INVALID_QP_STATE, 0, f"post_send in {state.name}")
                sq = qp.sq
                depth = qp.caps.sq_depth
                try:
                    for i, wr in enumerate(wrs):
                        if len(sq) >= depth:
                            raise post_error(Status.INSUFFICIENT_RESOURCES, i, "send queue full")
                        sq.append(self._make_wqe(qp, wr, i))
                finally:
                    if state is RTS:
                        fab.sq_progress(qp)
                        if fab.runs_inline:
                            fab.drive()
                    elif state is ERROR or state is SQERR:
                        fab.flush_sq(qp)  # IBA 10.8.3: each WR completes WR_FLUSHED_ERR
        finally:
            if fab.upcalls:
                fab.flush_upcalls()

    def _make_wqe(self, qp: MockQp, wr: SendWr, i: int) -> SendWqe:
        op = wr.opcode
        if op not in OPCODES[qp.transport]:
            if op in OPCODES[QpType.RC]:
                raise post_error(Status.INVALID_WR_TYPE, i, f"{op!r} on a {qp.qp_type.name} QP")
            raise post_error(Status.INVALID_WR_TYPE, i, f"unknown work request type {op!r}")
        opt = int(wr.send_opt)
        if op is WrType.LOCAL_INV or op is WrType.BIND_MW:
            return self._local_wqe(qp, wr, op, opt, i)
        inv: int | None = None
        if op is WrType.SEND_WITH_INV:
            if opt & IMMEDIATE:
                raise post_error(Status.INVALID_PARAMETER, i, "a send carries immediate data "
                                 "or an R_Key to invalidate, not both")  # fmt: skip
            op = WrType.SEND
            inv = wr.invalidate_rkey & 0xFFFFFFFF
        w = SendWqe(wr.wr_id, op, bool(opt & SIGNALED) or qp.sq_signaled)
        w.inv = inv
        sg = wr.sg_list
        if opt & INLINE and (op is WrType.SEND or op is WrType.RDMA_WRITE):
            sges = tuple((s.addr, s.length, s.lkey) for s in sg)
            total = sum(s[1] for s in sges)
            if total > qp.caps.max_inline:
                raise post_error(
                    Status.INVALID_PARAMETER, i, f"{total} inline bytes > {qp.caps.max_inline}"
                )
            w.sges = sges
            w.length = total
            data = self._engine.gather(qp, w)  # copied now: the buffer may be reused at once
            if data is not None:
                w.inline = bytes(data)
        else:
            if len(sg) > qp.caps.sq_sge:
                raise post_error(Status.INVALID_MAX_SGE, i, f"{len(sg)} SGEs > {qp.caps.sq_sge}")
            if len(sg) == 1:
                s = sg[0]
                w.sges = ((s.addr, s.length, s.lkey),)
                w.length = s.length
            else:
                w.sges = tuple((s.addr, s.length, s.lkey) for s in sg)
                w.length = sum(s[1] for s in w.sges)
        if opt & IMMEDIATE and (op is WrType.SEND or op is WrType.RDMA_WRITE):
            w.imm = wr.imm & 0xFFFFFFFF
        if opt & SOLICITED:
            w.solicited = True
        if opt & FENCE:
            w.fence = True
        if op is not WrType.SEND:
            w.remote_addr = wr.remote_addr
            w.rkey = wr.rkey
            if w.is_rd_atomic and op is not WrType.RDMA_READ:
                w.compare = wr.compare_add
                w.swap = wr.swap
                w.length = 8
        if qp.transport is QpType.UD:
            ud, av = checks.check_ud_wr(wr, i, self, self.name, MockAv)
            if av.pd is not qp.pd:
                w.status = WcStatus.LOCAL_PROTECTION_ERR  # IBA: the AV's PD must be the QP's
            w.ud = (av.attr, ud.remote_qp, ud.remote_qkey & 0xFFFFFFFF, ud.pkey_index)
        return w

    def _local_wqe(self, qp: MockQp, wr: SendWr, op: WrType, opt: int, i: int) -> SendWqe:
        """LOCAL_INV or a type 2 BIND_MW: checked for shape now, executed in queue order."""
        w = SendWqe(wr.wr_id, op, bool(opt & SIGNALED) or qp.sq_signaled)
        w.fence = bool(opt & FENCE)
        if op is WrType.LOCAL_INV:
            w.local = ("inv", wr.invalidate_rkey & 0xFFFFFFFF)
            return w
        mw, mr, acc = checks.check_bind_wr(wr, i, self, self.name, MockMw, MockMr)
        assert wr.bind is not None
        w.local = ("bind", mw, mr, wr.bind.addr, wr.bind.length, acc, wr.rkey & 0xFFFFFFFF)
        return w

    def post_recv(self, h_qp: Handle, wrs: Sequence[RecvWr]) -> None:
        fab = self._engine
        try:
            with fab.lock:
                if fab.verb_faults_armed:
                    fab.faults.check_verb("post_recv", self)
                qp = h_qp
                if type(qp) is not MockQp or qp.ca is not self or not qp.alive:
                    raise post_error(Status.INVALID_QP_HANDLE, 0, f"not a QP of {self.name}")
                if qp.srq is not None:
                    raise post_error(
                        Status.INVALID_PARAMETER, 0, "the QP takes receives from its SRQ"
                    )
                state = qp.state
                if state is RESET:
                    raise post_error(Status.INVALID_QP_STATE, 0, "post_recv in RESET")
                rq = qp.rq
                depth = qp.caps.rq_depth
                max_sge = qp.caps.rq_sge
                for i, wr in enumerate(wrs):
                    sg = wr.sg_list
                    if len(sg) > max_sge:
                        raise post_error(Status.INVALID_MAX_SGE, i, f"{len(sg)} SGEs > {max_sge}")
                    if len(rq) >= depth:
                        raise post_error(Status.INSUFFICIENT_RESOURCES, i, "receive queue full")
                    wqe: RecvWqe = (
                        wr.wr_id,
                        ((sg[0].addr, sg[0].length, sg[0].lkey),)
                        if len(sg) == 1
                        else tuple((s.addr, s.length, s.lkey) for s in sg),
                    )
                    if state is ERROR:
                        fab.flush_recv(qp, wqe[0])
                    else:
                        rq.append(wqe)
        finally:
            if fab.upcalls:
                fab.flush_upcalls()
