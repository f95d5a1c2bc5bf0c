"""Shared receive queue verbs of an rdma_core CA.

Called by the access layer on any thread; raises :mod:`ibal.status` exceptions.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Sequence
from typing import Any

from ibal.ci.interface import (
    Handle,
    SrqCreated,
)
from ibal.providers.rdma_core import consts as C
from ibal.providers.rdma_core import peek
from ibal.providers.rdma_core.errors import translate
from ibal.providers.rdma_core.handles import (
    Srq,
)
from ibal.providers.rdma_core.qp_verbs import post_recv_limited
from ibal.providers.rdma_core.state import CaState
from ibal.providers.rdma_core.wr import (
    RecvQueue,
)
from ibal.status import (
    InvalidMaxSge,
    InvalidMaxWrs,
    InvalidParameter,
    InvalidSetting,
    InvalidSrqSize,
    ResourceBusy,
    Status,
    Unsupported,
    post_error,
)
from ibal.types import (
    RecvWr,
    SrqAttr,
    SrqAttrMask,
)

log = logging.getLogger("ibal.providers.rdma_core")


class SrqVerbs(CaState):
    """``create_srq`` ... ``destroy_srq``, ``post_srq_recv``."""

    def create_srq(self, h_pd: Handle, attr: SrqAttr, srq_context: Any) -> SrqCreated:
        pd = self._pd(h_pd)
        if not self._caps.srq:
            raise Unsupported(self._caps.reason("srq"))
        d = self.dev
        if not 1 <= attr.max_wr <= int(d.max_srq_wr):
            raise InvalidMaxWrs(f"SRQ max_wr {attr.max_wr} outside 1..{int(d.max_srq_wr)}")
        if not 1 <= attr.max_sge <= int(d.max_srq_sge):
            raise InvalidMaxSge(f"SRQ max_sge {attr.max_sge} outside 1..{int(d.max_srq_sge)}")
        if attr.srq_limit < 0:
            raise InvalidParameter("negative srq_limit")
        if attr.srq_limit > attr.max_wr:
            raise InvalidSetting(f"srq_limit {attr.srq_limit} above max_wr {attr.max_wr}")
        m = self.pv.srq
        with self._lock:
            s = Srq(self, pd, srq_context)
            try:
                pv = m.SRQ(
                    pd.pv, m.SrqInitAttr(m.SrqAttr(max_wr=attr.max_wr, max_sge=attr.max_sge))
                )
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_create_srq", {errno.EINVAL: InvalidSrqSize}) from exc
            try:
                if attr.srq_limit:
                    pv.modify(m.SrqAttr(srq_limit=attr.srq_limit), C.IBV_SRQ_LIMIT)
                granted = pv.query()
            except self._errs.PyverbsError as exc:
                pv.close()
                raise translate(exc, "ibv_modify_srq") from exc
            s.pv = pv
            if self.layout is not None:
                try:
                    s.ptr = self.layout.srq_ptr(pv, self.ctx)
                except peek.PeekError as exc:
                    log.debug("rdma_core %s: SRQ pointer not found: %s", self.name, exc)
            out = SrqAttr(int(granted.max_wr), int(granted.max_sge), int(granted.srq_limit))
            s.max_wr = out.max_wr
            s.rq = RecvQueue(
                self.api, pv.post_recv, max_sge=out.max_sge, tokens=self.tokens, owner=s
            )
            pd.users += 1
            self._n["srq"] += 1
            if s.ptr:
                self._srqs[s.ptr] = s
            return SrqCreated(s, out)

    def modify_srq(self, h_srq: Handle, attr: SrqAttr, mask: SrqAttrMask) -> None:
        s = self._srq(h_srq)
        m = int(mask)
        if not m or m & ~int(SrqAttrMask.MAX_WR | SrqAttrMask.LIMIT):
            raise InvalidParameter(f"invalid SRQ attribute mask {m:#x}")
        ibv_mask = 0
        if m & SrqAttrMask.MAX_WR:
            if not 1 <= attr.max_wr <= int(self.dev.max_srq_wr):
                raise InvalidSrqSize(
                    f"SRQ max_wr {attr.max_wr} outside 1..{int(self.dev.max_srq_wr)}"
                )
            ibv_mask |= C.IBV_SRQ_MAX_WR
        if m & SrqAttrMask.LIMIT:
            if attr.srq_limit < 0:
                raise InvalidParameter("negative srq_limit")
            top = attr.max_wr if m & SrqAttrMask.MAX_WR else s.max_wr
            if attr.srq_limit > top:
                raise InvalidSetting(f"srq_limit {attr.srq_limit} above the SRQ's {top} entries")
            ibv_mask |= C.IBV_SRQ_LIMIT
        try:
            s.pv.modify(
                self.pv.srq.SrqAttr(
                    max_wr=attr.max_wr, max_sge=attr.max_sge, srq_limit=attr.srq_limit
                ),
                ibv_mask,
            )
        except self._errs.PyverbsError as exc:
            raise translate(exc, "ibv_modify_srq") from exc
        if ibv_mask & C.IBV_SRQ_MAX_WR:
            with contextlib.suppress(self._errs.PyverbsError):
                s.max_wr = int(s.pv.query().max_wr)

    def query_srq(self, h_srq: Handle) -> SrqAttr:
        s = self._srq(h_srq)
        try:
            a = s.pv.query()
        except self._errs.PyverbsError as exc:
            raise translate(exc, "ibv_query_srq") from exc
        return SrqAttr(int(a.max_wr), int(a.max_sge), int(a.srq_limit))

    def destroy_srq(self, h_srq: Handle) -> None:
        s = self._srq(h_srq)
        with self._lock:
            if s.users:
                raise ResourceBusy(f"SRQ still used by {s.users} QPs")
            rq = s.rq
            assert rq is not None

            def destroy() -> None:
                with rq.lock:
                    s.pv.close()

            self._retire(s, destroy, "ibv_destroy_srq")
            rq.close()
            self._srqs.pop(s.ptr, None)
            self._n["srq"] -= 1
            self.tokens.purge(s.rtok)
            s.pd.users -= 1

    def post_srq_recv(self, h_srq: Handle, wrs: Sequence[RecvWr]) -> None:
        s = h_srq
        if s.__class__ is not Srq or s.ci is not self or not s.alive:
            raise post_error(Status.INVALID_SRQ_HANDLE, 0, "invalid or destroyed SRQ")
        rq = s.rq
        assert rq is not None
        post_recv_limited(rq, wrs, s.max_wr - len(s.rtok))
