"""Shared receive queues.

Called by the access layer on any thread under the fabric lock; never blocks;
raises the :mod:`ibal.status` exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ibal.ci.interface import (
    Handle,
    SrqCreated,
)
from ibal.providers import checks
from ibal.providers.mock.objects import (
    MockSrq,
)
from ibal.status import (
    ResourceBusy,
    Status,
    post_error,
)
from ibal.types import (
    RecvWr,
    SrqAttr,
    SrqAttrMask,
)

if TYPE_CHECKING:
    pass

from ibal.providers.mock.ca_state import (
    CaState,
    verb,
)


class SrqVerbs(CaState):
    """Shared receive queues."""

    @verb
    def create_srq(self, h_pd: Handle, attr: SrqAttr, srq_context: Any) -> SrqCreated:
        pd = self._h_pd(h_pd)
        checks.check_srq_attr(attr, self.limits)
        self._check_count("srq", self.limits.max_srqs)
        srq = MockSrq(self, pd, attr.max_wr, attr.max_sge, attr.srq_limit, srq_context)
        self._n["srq"] += 1
        pd.users += 1
        return SrqCreated(srq, SrqAttr(srq.max_wr, srq.max_sge, srq.limit))

    @verb
    def modify_srq(self, h_srq: Handle, attr: SrqAttr, mask: SrqAttrMask) -> None:
        srq = self._h_srq(h_srq)
        srq.max_wr = checks.srq_depth_after(attr, mask, srq.max_wr, len(srq.wqes), self.limits)
        if int(mask) & int(SrqAttrMask.LIMIT):
            srq.limit = attr.srq_limit

    @verb
    def query_srq(self, h_srq: Handle) -> SrqAttr:
        srq = self._h_srq(h_srq)
        return SrqAttr(srq.max_wr, srq.max_sge, srq.limit)

    def destroy_srq(self, h_srq: Handle) -> None:
        fab = self._engine
        self._no_callback("destroy_srq")
        with fab.lock:
            if fab.verb_faults_armed:
                fab.faults.check_verb("destroy_srq", self)
            srq = self._h_srq(h_srq)
            if srq.users:
                raise ResourceBusy(f"SRQ still used by {srq.users} QP(s)")
            srq.alive = False
            srq.wqes.clear()
            srq.pd.users -= 1
            self._n["srq"] -= 1
        fab.callback_barrier()

    def post_srq_recv(self, h_srq: Handle, wrs: Sequence[RecvWr]) -> None:
        fab = self._engine
        with fab.lock:
            if fab.verb_faults_armed:
                fab.faults.check_verb("post_srq_recv", self)
            srq = h_srq
            if type(srq) is not MockSrq or srq.ca is not self or not srq.alive:
                raise post_error(Status.INVALID_SRQ_HANDLE, 0, f"not an SRQ of {self.name}")
            wqes = srq.wqes
            for i, wr in enumerate(wrs):
                sg = wr.sg_list
                if len(sg) > srq.max_sge:
                    raise post_error(Status.INVALID_MAX_SGE, i, f"{len(sg)} SGEs > {srq.max_sge}")
                if len(wqes) >= srq.max_wr:
                    raise post_error(Status.INSUFFICIENT_RESOURCES, i, "SRQ full")
                wqes.append((wr.wr_id, tuple((s.addr, s.length, s.lkey) for s in sg)))
